"""Rotary position embeddings (RoPE): plain, and with Llama 3's long-context scaling.

Each query and key head is cut into pairs ``(i, i + Dh/2)`` (the "rotate half" form of Llama, and
of Hugging Face's Llama, Qwen2 and Mistral checkpoints), and pair ``i`` of the token at position
``p`` is rotated by the angle ``p * f_i``. Attention scores then depend on how far apart two
tokens are, not where they sit.
"""

from __future__ import annotations

import jax.numpy as jnp


def rope_frequencies(head_dim: int, theta: float, scaling: tuple | None = None):
    """The rotary frequencies ``theta ** (-2i / Dh)`` for ``i < Dh / 2``, float32.

    With Llama 3's ``scaling`` (factor, low, high, original context; ``ModelConfig.rope_scaling``)
    a frequency whose wavelength ``2 pi / f`` is longer than ``original / low`` positions turns
    ``factor`` times slower (it has to stretch over the longer context), one shorter than
    ``original / high`` stays (it encodes nearby order, which the longer context does not change),
    and those between blend the two linearly in ``original / wavelength``."""
    inv_freq = theta ** (-jnp.arange(head_dim // 2, dtype=jnp.float32) * 2.0 / head_dim)
    if scaling is None:
        return inv_freq
    factor, low, high, original = scaling
    wavelength = 2 * jnp.pi / inv_freq
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return jnp.where(wavelength > original / low, inv_freq / factor,
                     jnp.where(wavelength < original / high, inv_freq, blended))


def rope(x, positions, theta, scaling=None):
    """Rotary position embedding (the "rotate half" form of Llama, and of Hugging Face's Llama,
    Qwen2 and Mistral checkpoints).

    x [..., H, Dh]; positions broadcastable to x.shape[:-2] (int). Pair ``(i, i + Dh/2)`` is
    rotated by the angle ``position * f_i`` (:func:`rope_frequencies`); computed in float32.
    """
    half = x.shape[-1] // 2
    inv_freq = rope_frequencies(x.shape[-1], theta, scaling)
    angle = positions.astype(jnp.float32)[..., None, None] * inv_freq  # [..., 1, half]
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)
