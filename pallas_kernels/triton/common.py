"""Plumbing the three Triton-style kernels share: the ``pallas_call`` wrapper and masked loads.

Every kernel here takes whole-array refs (no BlockSpecs) and indexes them itself with
``pl.ds`` and masked ``plgpu.load``/``plgpu.store``: jax 0.11.2's Triton lowering does not
mask a partial BlockSpec block at an array edge, so edges are masked by hand, the same way
under the interpreter and compiled.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.pallas import pallas_call
from jax.experimental.pallas import triton as plgpu


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def pow2_block(n: int, cap: int, floor: int = 16) -> int:
    """The power-of-two block for a dimension of size ``n``: at least ``floor`` (Triton's dot
    minimum: smaller dots return wrong numbers without an error), at most ``cap``, and no
    larger than ``n`` rounded up to a power of two."""
    return max(floor, min(cap, next_pow2(n)))


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def call(kernel, *, out_shape, grid, args, interpret: bool, num_warps: int, num_stages: int,
         name: str, input_output_aliases: dict | None = None):
    """Run ``kernel`` over ``grid`` with whole-array refs: ``pallas_call(...)(*args)``.

    Compiled (``interpret=False``) it lowers through Triton with ``num_warps`` warps per
    program and ``num_stages`` software-pipeline stages; under the interpreter the grid
    becomes a loop on the CPU. ``pallas_call`` is looked up in this module at call time so
    that :func:`pallas_kernels.testing.poisoned_outputs` can wrap it in tests.
    """
    fn = pallas_call(
        kernel,
        out_shape=out_shape,
        grid=grid,
        input_output_aliases=input_output_aliases or {},
        interpret=interpret,
        compiler_params=None if interpret else plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        name=name,
    )
    return fn(*args)


def masked_load(ref, mask):
    """Load a block; where ``mask`` is False read 0 (and never touch memory there)."""
    if mask is None:
        return plgpu.load(ref)
    return plgpu.load(ref, mask=mask, other=0)


def masked_store(ref, value, mask):
    """Store a block; where ``mask`` is False nothing is written (and memory there is never touched)."""
    plgpu.store(ref, value, mask=mask)


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
