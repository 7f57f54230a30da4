"""Shared argument checks and the one ``pallas_call`` wrapper the three kernels use.

Every check raises a one-line ``ValueError`` that names the argument and says how to fix
it, before any kernel runs. Shape, rank and dtype checks work at trace time (inside
``jit`` too); value checks (``lengths``) run only when the values are concrete.

``call_pallas`` also holds the private test hook ``_POISON``: when it is true, every output
buffer starts filled with NaN (aliased from an input), so an element a kernel forgot to
write shows up as NaN in the tests, in interpret mode *and* compiled on a GPU (where fresh
outputs would otherwise hold whatever the allocator left there).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# Private test hook: fill outputs with NaN before the kernel runs (see module docstring).
_POISON = False

FLOAT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_DTYPE_NAMES = "float32, bfloat16 or float16"


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
        raise ValueError(
            f"{name} must have {rank} dimensions {layout}; got shape {tuple(x.shape)}"
        )
    if any(d == 0 for d in x.shape):
        raise ValueError(f"{name} has an empty dimension (shape {tuple(x.shape)}); every size must be >= 1")


def check_float_dtype(x: jax.Array, name: str) -> None:
    if jnp.dtype(x.dtype) not in FLOAT_DTYPES:
        raise ValueError(f"{name} has dtype {x.dtype}; use {_DTYPE_NAMES} (cast it with .astype)")


def check_same_dtype(x: jax.Array, y: jax.Array, xname: str, yname: str) -> None:
    if x.dtype != y.dtype:
        raise ValueError(
            f"{yname} has dtype {y.dtype} but {xname} has {x.dtype}; cast both to one dtype"
        )


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


HEAD_DIMS = (16, 32, 64, 128, 256)


def check_head_dim(d: int, name: str) -> None:
    # Triton loads whole power-of-two blocks and its dots need every dimension >= 16.
    if d not in HEAD_DIMS:
        raise ValueError(
            f"{name} has head dim {d}; the kernels support head dims {HEAD_DIMS} "
            "(powers of two from 16 to 256)"
        )


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


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def pow2_block(n: int, cap: int, floor: int = 16) -> int:
    """The power-of-two block for a dimension of size ``n``: at least ``floor`` (Triton's
    dot minimum), at most ``cap``, no larger than ``n`` rounded up to a power of two."""
    return max(floor, min(cap, next_pow2(n)))


def call_pallas(kernel, *, out_shape, grid, args, interpret: bool, num_warps: int,
                num_stages: int, name: str):
    """``pl.pallas_call`` with whole-array refs (no BlockSpecs), as every kernel here uses.

    The kernels index their refs themselves with ``pl.ds`` and masked
    ``plgpu.load``/``plgpu.store``: jax 0.11.2's Triton lowering does not mask partial edge
    blocks of a BlockSpec, so the edges are masked by hand, the same way in both backends.
    """
    single = not isinstance(out_shape, (tuple, list))
    outs = (out_shape,) if single else tuple(out_shape)
    n_in = len(args)
    body = kernel
    aliases = {}
    if _POISON:
        # Extra inputs full of NaN, aliased to the outputs: the output buffers start as NaN.
        args = tuple(args) + tuple(jnp.full(o.shape, jnp.nan, o.dtype) for o in outs)
        aliases = {n_in + i: i for i in range(len(outs))}

        def body(*refs):
            kernel(*refs[:n_in], *refs[n_in + len(outs):])

    fn = pl.pallas_call(
        body,
        out_shape=outs[0] if single else outs,
        grid=grid,
        input_output_aliases=aliases,
        interpret=interpret,
        compiler_params=None if interpret else plgpu.CompilerParams(
            num_warps=num_warps, num_stages=num_stages),
        name=name,
    )
    return fn(*args)


def masked_load(ref, mask):
    """Load a block; where ``mask`` is False read 0 (never touch memory there)."""
    if mask is None:
        return plgpu.load(ref)
    return plgpu.load(ref, mask=mask, other=0)


def block_mask(row_ok, col_ok, shape):
    """Combine optional row/column validity vectors into a full block mask (or None)."""
    if row_ok is None and col_ok is None:
        return None
    m = jnp.ones(shape, dtype=jnp.bool_)
    if row_ok is not None:
        m = m & row_ok[:, None]
    if col_ok is not None:
        m = m & col_ok[None, :]
    return m
