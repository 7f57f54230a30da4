"""The quantized weight formats the quantized matmul reads, and how to make them.

A weight ``w [K, N]`` (K inputs, N outputs, the layout every matmul here uses) is stored in
fewer bytes per value, plus float32 scales that say what one step of the integer grid is worth:

- **int8, one scale per output column** (``q`` int8 ``[K, N]``, ``scales`` ``[N]``):
  ``w ~= q * scales[None, :]`` with ``scales = max|w[:, n]| / 127``. One byte per weight (a
  quarter of float32, half of bfloat16); a column's scale costs 4 bytes against its K bytes.
- **int4, one scale per group of ``g`` rows of a column** (``q`` uint8 ``[K / 2, N]``, two values
  a byte, ``scales`` ``[K / g, N]``): ``w ~= (nibble - 8) * scales[k // g, n]`` with
  ``scales = max|w| / 7`` over the group. Half a byte per weight plus ``4 / g`` bytes of scale
  (g = 32: 0.625 bytes a weight). A finer group follows the weight's local size more closely
  and pays more scale bytes: the quality lesson's trade.

How two int4 values share a byte. Inside group ``j``, packed row ``j * g/2 + i`` holds weight row
``j * g + i`` in its low nibble and row ``j * g + g/2 + i`` in its high one (each as value + 8,
0..15). So one group's low nibbles are the group's first half and its high nibbles the second
half: a kernel multiplies the first half of its activation tile by the low nibbles and the
second half by the high ones, and never interleaves rows in registers.

Activations can be quantized too, one int8 scale per row (:func:`quantize_rows`): then a matmul
is int8 x int8 summed in int32, the form a CPU's integer dot instructions (and llama.cpp's Q8_0)
run fastest. ``pallas_kernels.quantized_matmul`` takes the formats made here.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

INT4_GROUP_SIZES = (32, 64, 128)   # a group's half must fill a Triton dot (>= 16 rows)


def check_group_size(group_size, k: int, name: str = "group_size") -> int:
    """``group_size`` as an int after checking it fits ``k`` rows (one-line errors)."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"{name}={group_size!r} is not an int4 group size; use one of "
                         f"{', '.join(map(str, INT4_GROUP_SIZES))}")
    if k % group_size:
        raise ValueError(f"{name}={group_size} does not divide the weight's {k} input rows; "
                         f"pick a group size that divides {k} (or quantize this layer to int8)")
    return group_size


def _scale(amax, levels):
    """The step of a symmetric grid with ``levels`` steps each side; an all-zero slice gets 1."""
    return jnp.where(amax > 0, amax / levels, 1.0).astype(jnp.float32)


def quantize_int8(w):
    """``w [K, N]`` float -> ``(q int8 [K, N], scales float32 [N])``, one scale per column."""
    w = jnp.asarray(w, jnp.float32)
    scales = _scale(jnp.max(jnp.abs(w), axis=0), 127)
    q = jnp.clip(jnp.round(w / scales), -127, 127).astype(jnp.int8)
    return q, scales


def quantize_int4(w, group_size: int):
    """``w [K, N]`` float -> ``(q uint8 [K / 2, N], scales float32 [K / group_size, N])``."""
    w = jnp.asarray(w, jnp.float32)
    k, n = w.shape
    g = check_group_size(group_size, k)
    groups = w.reshape(k // g, g, n)
    scales = _scale(jnp.max(jnp.abs(groups), axis=1), 7)                              # [K/g, N]
    values = jnp.clip(jnp.round(groups / scales[:, None, :]), -7, 7).astype(jnp.int32) + 8   # 1..15
    low, high = values[:, : g // 2], values[:, g // 2:]
    return (low | (high << 4)).astype(jnp.uint8).reshape(k // 2, n), scales


def unpack_int4(q, group_size: int):
    """Packed ``q uint8 [K / 2, N]`` -> the signed values ``int8 [K, N]`` (-8..7), rows in order."""
    half, n = q.shape
    g = group_size
    groups = q.astype(jnp.int32).reshape(2 * half // g, g // 2, n)
    low, high = (groups & 15) - 8, (groups >> 4) - 8
    return jnp.concatenate([low, high], axis=1).reshape(2 * half, n).astype(jnp.int8)


def dequantize(q, scales, group_size: int | None = None):
    """The float32 ``[K, N]`` a quantized weight stands for (int8 when ``q`` is int8, packed int4
    when ``q`` is uint8, which needs ``group_size``)."""
    if q.dtype == jnp.int8:
        return q.astype(jnp.float32) * scales[None, :]
    values = unpack_int4(q, group_size).astype(jnp.float32)
    return values * jnp.repeat(scales, group_size, axis=0)


def quantize_kv(x):
    """Keys or values ``[..., D]`` -> ``(int8 [..., D], float32 scales [...])``: one scale per vector
    (per token and KV head in a cache), the int8 KV cache's format."""
    lead, d = x.shape[:-1], x.shape[-1]
    q, scales = quantize_rows(jnp.reshape(x, (-1, d)))
    return q.reshape(*lead, d), scales.reshape(lead)


def quantize_rows(x):
    """Activations ``x [M, K]`` -> ``(int8 [M, K], float32 scales [M, 1])``, one scale per row:
    the dynamic quantization an int8 x int8 matmul needs (computed on every call)."""
    x = jnp.asarray(x, jnp.float32)
    # max |x| as one reduction whose reducer takes the absolute values (the running max is never
    # negative): XLA:CPU would otherwise run abs as a kernel of its own before the max, on every call.
    amax = lax.reduce(x, jnp.float32(0), lambda a, b: jnp.maximum(jnp.abs(a), jnp.abs(b)), (1,))[:, None]
    scales = _scale(amax, 127)
    return jnp.clip(jnp.round(x / scales), -127, 127).astype(jnp.int8), scales
