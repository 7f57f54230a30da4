"""Argument checks shared by every kernel, run before any kernel does.

Each check raises a one-line ``ValueError`` naming the argument and the fix. Shape, rank and
dtype checks work at trace time (inside ``jit`` too); value checks (``lengths``) run only
when the values are concrete, i.e. in an eager call.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

FLOAT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_DTYPE_NAMES = "float32, bfloat16 or float16"
# Triton loads whole power-of-two blocks and its dots need every dimension >= 16.
HEAD_DIMS = (16, 32, 64, 128, 256)


def as_array(x: Any, name: str) -> jax.Array:
    """``x`` as a jax array (numpy arrays and lists are accepted); errors name ``name``."""
    if isinstance(x, jax.Array):
        return x
    try:
        return jnp.asarray(x)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be an array; got {type(x).__name__} ({e})") from None


def check_rank(x: jax.Array, rank: int, name: str, layout: str) -> None:
    if x.ndim != rank:
        raise ValueError(f"{name} must have {rank} dimensions {layout}; got shape {tuple(x.shape)}")
    if any(d == 0 for d in x.shape):
        raise ValueError(f"{name} has an empty dimension (shape {tuple(x.shape)}); every size must be >= 1")


def check_float_dtype(x: jax.Array, name: str) -> None:
    if jnp.dtype(x.dtype) not in FLOAT_DTYPES:
        raise ValueError(f"{name} has dtype {x.dtype}; use {_DTYPE_NAMES} (cast it with .astype)")


def check_same_dtype(x: jax.Array, y: jax.Array, xname: str, yname: str) -> None:
    if x.dtype != y.dtype:
        raise ValueError(f"{yname} has dtype {y.dtype} but {xname} has {x.dtype}; cast both to one dtype")


def check_out_dtype(out_dtype: Any, default: Any) -> jnp.dtype:
    if out_dtype is None:
        return jnp.dtype(default)
    try:
        dt = jnp.dtype(out_dtype)
    except TypeError:
        raise ValueError(f"out_dtype={out_dtype!r} is not a dtype; use {_DTYPE_NAMES} or None") from None
    if dt not in FLOAT_DTYPES:
        raise ValueError(f"out_dtype={dt} is not supported; use {_DTYPE_NAMES} or None")
    return dt


def check_sm_scale(sm_scale: Any, head_dim: int) -> float:
    if sm_scale is None:
        return float(head_dim) ** -0.5
    if isinstance(sm_scale, jax.core.Tracer) or not np.isscalar(sm_scale) or isinstance(sm_scale, (bool, str)):
        raise ValueError(f"sm_scale must be a Python number or None (for head_dim**-0.5); got {sm_scale!r}")
    value = float(sm_scale)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"sm_scale={sm_scale!r} must be a positive finite number (or None for head_dim**-0.5)")
    return value


def is_concrete(x: Any) -> bool:
    """True when the values of ``x`` are known now (not a tracer inside jit/vmap/grad)."""
    return not isinstance(x, jax.core.Tracer)


def value_range(x) -> tuple[int, int]:
    """(min, max) of a concrete integer array, read on the host: ``jnp.min`` would be staged
    into the program when ``x`` is a constant closed over inside ``jit``, and ``int()`` of that fails."""
    values = np.asarray(x)
    return int(values.min()), int(values.max())


def lengths_inside_jit(lengths, most: int):
    """Inside ``jit`` the values of ``lengths`` cannot be checked (outside, the kernels' checks
    refuse any outside 1..``most``). Returns ``(safe, ok)``: the lengths clipped into 1..``most``, so
    no kernel reads or writes past a row, and which rows were in range, for
    :func:`zero_bad_rows`. Concrete lengths pass as they are (``ok`` None): they were checked."""
    if is_concrete(lengths):
        return lengths, None
    return jnp.clip(lengths, 1, most), (lengths >= 1) & (lengths <= most)


def zero_bad_rows(out, ok):
    """``out`` [B, ...] with the rows whose length was out of range (``ok`` False) set to zeros:
    a row with no keys attends to nothing, where a softmax over none would give NaN."""
    if ok is None:
        return out
    return jnp.where(ok.reshape((-1,) + (1,) * (out.ndim - 1)), out, jnp.zeros_like(out))


def kv_scales(k_cache, v_cache, k_scales, v_scales) -> bool:
    """Whether the caches are int8 with their per-vector scales (checked: float32 ``[B, S, Hkv]``,
    both or neither, int8 caches with them and only with them)."""
    if (k_scales is None) != (v_scales is None):
        raise ValueError("pass k_scales and v_scales together (an int8 cache's scales), or neither")
    k_dtype = getattr(k_cache, "dtype", None)
    if k_scales is None:
        if k_dtype == jnp.int8:
            raise ValueError("k_cache is int8 but no k_scales were given; pass the cache's scales "
                             "(k_scales, v_scales [B, S_max, Hkv] float32)")
        return False
    if k_dtype != jnp.int8 or getattr(v_cache, "dtype", None) != jnp.int8:
        raise ValueError(f"k_scales were given but the caches are {k_dtype} and {getattr(v_cache, 'dtype', None)}; "
                         "scales go with int8 caches (pallas_kernels.quantization.quantize_kv)")
    want = tuple(k_cache.shape[:3])
    for x, name in ((k_scales, "k_scales"), (v_scales, "v_scales")):
        if tuple(x.shape) != want or x.dtype != jnp.float32:
            raise ValueError(f"{name} is {x.dtype} {tuple(x.shape)}; it must be float32 [B, S_max, Hkv] = {want}, "
                             "one scale per cached vector")
    return True


def attention_operands(q, k, v, *, q_rank: int, q_layout: str, k_name: str, v_name: str,
                       kv_layout: str, sm_scale, same_batch: bool = True, int8_cache: bool = False):
    """The checks both attention kernels share: q against a K/V pair.

    ``q`` is ``[B, T, Hq, D]`` (prefill, ``q_rank`` 4) or ``[B, Hq, D]`` (decode, 3); K and V
    are ``[B, S, Hkv, D]`` under the names ``k_name``/``v_name`` (``same_batch=False``: a pool of
    blocks ``[N, block_size, Hkv, D]`` that every row shares; ``int8_cache=True``: int8 K/V whose
    scales :func:`kv_scales` checked). Returns the arrays and the softmax scale: (q, k, v, sm_scale).
    """
    q, k, v = as_array(q, "q"), as_array(k, k_name), as_array(v, v_name)
    check_rank(q, q_rank, "q", q_layout)
    check_rank(k, 4, k_name, kv_layout)
    check_rank(v, 4, v_name, kv_layout)
    if k.shape != v.shape:
        raise ValueError(f"{v_name} has shape {tuple(v.shape)} but {k_name} has {tuple(k.shape)}; "
                         f"{k_name} and {v_name} must match")
    b, hq, d = q.shape[0], q.shape[-2], q.shape[-1]
    bk, _, hkv, dk = k.shape
    if same_batch and bk != b:
        raise ValueError(f"{k_name} has batch {bk} but q has {b}; q, {k_name} and {v_name} need the same batch size")
    if dk != d:
        raise ValueError(f"{k_name} has head dim {dk} but q has {d}; q, {k_name} and {v_name} need the same head dim")
    if d not in HEAD_DIMS:
        raise ValueError(f"q has head dim {d}; the kernels support head dims {HEAD_DIMS} "
                         "(powers of two from 16 to 256)")
    if hq % hkv:
        raise ValueError(f"q has {hq} heads, not a multiple of {k_name}'s {hkv} KV heads; "
                         "Hq must be a multiple of Hkv")
    check_float_dtype(q, "q")
    if int8_cache:   # checked with their scales (kv_scales)
        return q, k, v, check_sm_scale(sm_scale, d)
    for x, name in ((k, k_name), (v, v_name)):
        check_float_dtype(x, name)
    check_same_dtype(q, k, "q", k_name)
    check_same_dtype(q, v, "q", v_name)
    return q, k, v, check_sm_scale(sm_scale, d)


def check_config(config, cls, name: str = "config"):
    """``config`` must be None or an instance of the kernel's config class."""
    if config is not None and not isinstance(config, cls):
        raise ValueError(f"{name} must be a {cls.__name__} (see plan(...).config) or None; "
                         f"got {type(config).__name__}")
    return config


def check_triton_config(config, blocks) -> None:
    """The rules every Triton-tier config follows (its ``__post_init__`` calls this): each field
    in ``blocks`` a power of two >= 16 (Triton loads power-of-two blocks; its dots need >= 16),
    ``num_warps`` 1, 2, 4, 8 or 16, ``num_stages`` a positive integer."""
    cls = type(config).__name__
    for field in blocks:
        v = getattr(config, field)
        if isinstance(v, bool) or not isinstance(v, int) or v < 16 or v & (v - 1):
            raise ValueError(f"{cls}.{field}={v!r} must be a power of two >= 16 "
                             "(Triton loads power-of-two blocks; its dots need >= 16)")
    if config.num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"{cls}.num_warps={config.num_warps!r} must be 1, 2, 4, 8 or 16")
    if isinstance(config.num_stages, bool) or not isinstance(config.num_stages, int) or config.num_stages < 1:
        raise ValueError(f"{cls}.num_stages={config.num_stages!r} must be a positive integer")
