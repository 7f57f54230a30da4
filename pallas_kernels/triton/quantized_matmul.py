"""Matmul ``x [M, K] @ w`` where ``w [K, N]`` is stored quantized (int8 or packed int4), as a
Pallas kernel that dequantizes each weight tile in registers.

Why it pays: a decode step reads every weight once and does two flops per byte of float32
(one of bfloat16), so its time is the weight's bytes. An int8 weight is half a bf16 one's and
an int4 weight a quarter, *if* nothing widens it in memory first. A plain ``x @ dequantize(q)``
writes the widened weight to memory and reads it back: more bytes than the bf16 weight it
replaced. This kernel loads the narrow tile (``block_k x block_n`` int8, or ``block_k / 2 x
block_n`` bytes holding two int4 values each), widens it to the activations' dtype in registers
(exact: every int8 and int4 value is a bf16) and feeds the dot. The formats are
:mod:`pallas_kernels.quantization`'s.

Grid, blocks and why
--------------------
- Grid ``(M tiles, N tiles, K chunks)``: one ``block_m x block_n`` output tile per program,
  over its chunk of K (split-K, as in ``pallas_kernels.triton.matmul``: a decode step has one
  tile row, and only many programs keep enough loads in flight to stream the weight at the
  memory's speed). With several chunks each program writes an f32 partial and one small XLA
  sum adds them.
- int8: ``block_k`` rows per step; each column's scale multiplies the finished sum once.
- int4: one group per step (``block_k = group_size``). The group's low nibbles are its first
  ``g/2`` rows and its high nibbles the last ``g/2`` (the packing is made for this), so the
  step is two dots, ``x[:, first half] @ low + x[:, second half] @ high``, and the group's sum
  is scaled by its ``[block_n]`` scales before it joins the accumulator.
- ``activations="int8"``: the launcher quantizes x per row first (one scale per row); the
  kernel widens those int8 values like the weight's, and the row scales multiply the tile last.
- Edges: rows past M and columns past N are masked loads of 0 and masked stores; an int8
  weight's ragged K edge is masked the same way (int4's K is whole groups by construction).

Numerics: integer values widened exactly, f32 accumulation (f32 activations at
``precision=HIGHEST``), scales applied in f32, output cast to ``out_dtype`` (default x's).
``reference.quantized_matmul`` computes the same sums in the same order of groups.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels import checks, device, quantization, reference
from pallas_kernels.mode import choose_tier
from pallas_kernels.triton import common
from pallas_kernels.triton.common import cdiv, pow2_block
from pallas_kernels.triton.matmul import MatmulConfig

ACTIVATIONS = ("auto", "float", "int8")
PROGRAMS_PER_SM = 2   # as the matmul: split until the grid has this many programs per SM


# ----------------------------------------------------------------------------- the kernel
def quantized_matmul_kernel(x_ref, q_ref, s_ref, xs_ref, o_ref, *, m, n, k, chunk, block_m, block_n,
                            block_k, split, int4, compute_dtype):
    # x_ref [m, k] (float, or int8 with row scales xs_ref [m, 1]); q_ref [k, n] int8 or [k/2, n]
    # uint8; s_ref [n] (int8) or [k / block_k, n] (int4); o_ref [m, n] or [split, m, n] f32 partials.
    pid_m, pid_n, pid_k = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    rows = pid_m * block_m + jnp.arange(block_m)
    cols = pid_n * block_n + jnp.arange(block_n)
    row_ok = rows < m if m % block_m else None
    col_ok = cols < n if n % block_n else None
    col_slice = pl.ds(pid_n * block_n, block_n)
    k0 = pid_k * chunk
    steps = pl.cdiv(jnp.minimum(chunk, k - k0), block_k)

    def widen(v):   # an integer tile -> the dot's dtype (exact: |v| <= 127 fits every float here)
        return v.astype(compute_dtype)

    def load_x(start, width):
        ks = start + jnp.arange(width)
        k_ok = ks < k if k % width else None
        return widen(common.masked_load(x_ref.at[pl.ds(pid_m * block_m, block_m), pl.ds(start, width)],
                                        common.block_mask(row_ok, k_ok, (block_m, width)))), k_ok

    def dot(a, b):
        return jnp.dot(a, b, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)

    def int8_step(i, acc):
        start = k0 + i * block_k
        a, k_ok = load_x(start, block_k)
        w = common.masked_load(q_ref.at[pl.ds(start, block_k), col_slice],
                               common.block_mask(k_ok, col_ok, (block_k, block_n)))
        return acc + dot(a, widen(w))

    def int4_step(i, acc):
        start, half = k0 + i * block_k, block_k // 2
        a_low, _ = load_x(start, half)
        a_high, _ = load_x(start + half, half)
        packed = common.masked_load(q_ref.at[pl.ds(start // 2, half), col_slice],
                                    common.block_mask(None, col_ok, (half, block_n))).astype(jnp.int32)
        low, high = widen((packed & 15) - 8), widen((packed >> 4) - 8)
        scales = common.masked_load(s_ref.at[pl.ds(start // block_k, 1), col_slice],
                                    common.block_mask(None, col_ok, (1, block_n)))          # [1, block_n]
        return acc + (dot(a_low, low) + dot(a_high, high)) * scales

    acc = lax.fori_loop(0, steps, int4_step if int4 else int8_step, jnp.zeros((block_m, block_n), jnp.float32))
    if not int4:
        acc = acc * common.masked_load(s_ref.at[col_slice], col_ok)[None, :]
    if xs_ref is not None:
        acc = acc * common.masked_load(xs_ref.at[pl.ds(pid_m * block_m, block_m), pl.ds(0, 1)],
                                       common.block_mask(row_ok, None, (block_m, 1)))
    tile = (pl.ds(pid_m * block_m, block_m), col_slice)
    out = o_ref.at[tile] if split == 1 else o_ref.at[(pid_k,) + tile]
    plgpu.store(out, acc.astype(o_ref.dtype), mask=common.block_mask(row_ok, col_ok, (block_m, block_n)))


# ----------------------------------------------------------------------------- launcher and entry points
def launch(x, q, scales, group_size, activations, out_dtype, *, interpret: bool,
           config: MatmulConfig | None = None):
    """Run :func:`quantized_matmul_kernel` on checked operands (``activations`` "float" or "int8")."""
    (m, k), n = x.shape, q.shape[1]
    int4 = q.dtype == jnp.uint8
    p = plan(m, k, n, x.dtype, group_size=group_size if int4 else None, config=config)
    c = p.config
    split = p.grid[2]
    if activations == "int8":
        x, x_scales = quantization.quantize_rows(x)
        compute_dtype = jnp.bfloat16   # int8 values and their products are exact in bf16 x bf16 -> f32
    else:
        x_scales, compute_dtype = None, x.dtype
    kernel = functools.partial(quantized_matmul_kernel, m=m, n=n, k=k, chunk=p.chunk_k, block_m=c.block_m,
                               block_n=c.block_n, block_k=c.block_k, split=split, int4=int4,
                               compute_dtype=compute_dtype)
    if x_scales is None:   # keep the kernel's signature: no row-scale operand
        kernel = functools.partial(_without_row_scales, kernel)
    shape = (m, n) if split == 1 else (split, m, n)
    args = (x, q, scales) if x_scales is None else (x, q, scales, x_scales)
    out = common.call(kernel, out_shape=jax.ShapeDtypeStruct(shape, out_dtype if split == 1 else jnp.float32),
                      grid=p.grid, args=args, interpret=interpret, num_warps=c.num_warps,
                      num_stages=c.num_stages, name="quantized_matmul")
    return out if split == 1 else jnp.sum(out, axis=0).astype(out_dtype)


def _without_row_scales(kernel, x_ref, q_ref, s_ref, o_ref):
    kernel(x_ref, q_ref, s_ref, None, o_ref)


def quantized_matmul(x, q, scales, *, group_size: int | None = None, activations: str = "auto", out_dtype=None,
                     mode: str = "auto", config: MatmulConfig | None = None):
    """``x [M, K]`` times a quantized weight ``[K, N]`` -> ``[M, N]``.

    ``q``/``scales``: int8 ``[K, N]`` with ``[N]`` column scales, or packed int4 uint8 ``[K/2, N]``
    with ``[K/group_size, N]`` group scales (made by ``pallas_kernels.quantization``).
    ``activations``: "float" (weight-only: x stays in its dtype), "int8" (x quantized per row too,
    int8 x int8 products) or "auto": "int8" where the call runs the XLA reference (XLA:CPU has a
    fast int8 dot and a slow mixed one), "float" in the Pallas kernel (the GPU recipe: the weight
    widened in registers, the tensor cores fed in x's dtype). There is no Mosaic GPU tier: on a
    Hopper GPU ``mode="pallas"`` runs the Triton tier, and the Mosaic modes are refused.
    """
    x, q, scales, group_size, out_dtype = check(x, q, scales, group_size, activations, out_dtype)
    tier = choose_tier(mode, config, triton_config=MatmulConfig, mosaic=None, mosaic_problem=None)
    if activations == "auto":
        activations = "int8" if tier.name == "reference" else "float"
    if tier.name == "reference":
        return reference.quantized_matmul(x, q, scales, group_size=group_size, activations=activations,
                                          out_dtype=out_dtype)
    return launch(x, q, scales, group_size, activations, out_dtype, interpret=tier.interpret, config=config)


def check(x, q, scales, group_size, activations, out_dtype):
    """The operands after every check (one-line errors), the group size (None for int8) and
    the output dtype."""
    x, q, scales = checks.as_array(x, "x"), checks.as_array(q, "q"), checks.as_array(scales, "scales")
    checks.check_rank(x, 2, "x", "[M, K]")
    checks.check_float_dtype(x, "x")
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations={activations!r} must be one of {', '.join(map(repr, ACTIVATIONS))}")
    k = x.shape[1]
    if q.dtype == jnp.int8:
        checks.check_rank(q, 2, "q", "[K, N] int8")
        if group_size is not None:
            raise ValueError(f"group_size={group_size!r} is for int4 weights (uint8 q); an int8 weight has one "
                             "scale per column: pass group_size=None")
        rows, scale_shape = k, (q.shape[1],)
    elif q.dtype == jnp.uint8:
        checks.check_rank(q, 2, "q", "[K/2, N] uint8 (packed int4)")
        if group_size is None:
            raise ValueError("group_size=None but q is packed int4 (uint8); pass the group size it was quantized with")
        quantization.check_group_size(group_size, k)
        rows, scale_shape = k // 2, (k // group_size, q.shape[1])
    else:
        raise ValueError(f"q has dtype {q.dtype}; use int8 [K, N] or packed int4 uint8 [K/2, N] "
                         "(pallas_kernels.quantization makes both)")
    if q.shape[0] != rows:
        raise ValueError(f"q has {q.shape[0]} rows but x has K={k} columns; q must have {rows} rows "
                         f"({'K/2, two int4 values a byte' if rows != k else 'K'})")
    if tuple(scales.shape) != scale_shape or scales.dtype != jnp.float32:
        raise ValueError(f"scales is {scales.dtype} {tuple(scales.shape)} but this weight needs float32 "
                         f"{scale_shape}; pass the scales quantization made with q")
    return x, q, scales, group_size, checks.check_out_dtype(out_dtype, x.dtype)


# ----------------------------------------------------------------------------- config and plan
@dataclasses.dataclass(frozen=True)
class QuantizedMatmulPlan:
    """What the kernel will launch for one shape: its config, K chunk and grid."""

    m: int
    k: int
    n: int
    config: MatmulConfig
    chunk_k: int     # K elements per program (a multiple of block_k)
    grid: tuple      # (M tiles, N tiles, K chunks)


DECODE_ROWS = 64   # M up to this: one tile row, N narrowed and K split until the GPU is full


def _make_plan(m, k, n, config: MatmulConfig) -> QuantizedMatmulPlan:
    blocks = cdiv(k, config.block_k)
    per_chunk = cdiv(blocks, min(config.split_k, blocks))
    chunk = per_chunk * config.block_k
    return QuantizedMatmulPlan(m, k, n, config, chunk, (cdiv(m, config.block_m), cdiv(n, config.block_n),
                                                         cdiv(blocks, per_chunk)))


def plan(m: int, k: int, n: int, dtype=jnp.bfloat16, *, group_size: int | None = None,
         num_sms: int | None = None, config: MatmulConfig | None = None) -> QuantizedMatmulPlan:
    """The config (the matmul's :class:`~pallas_kernels.triton.matmul.MatmulConfig`: the same
    blocks, K split, warps and stages; for an int4 weight ``block_k`` must equal the group size,
    one group a step) and grid :func:`quantized_matmul` uses for ``[m, k]`` times a ``[k, n]``
    weight (``group_size``: an int4 weight's, None for int8). ``num_sms``: the GPU's SM count (None:
    the device's, or the H200's 132 without a GPU)."""
    for name, v in (("m", m), ("k", k), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive integer")
    if config is None:
        config = _plan_config(m, k, n, jnp.dtype(dtype).itemsize, group_size, device.num_sms(num_sms))
    checks.check_config(config, MatmulConfig)
    if group_size is not None and config.block_k != group_size:
        raise ValueError(f"config.block_k={config.block_k} must equal group_size={group_size} for an int4 "
                         "weight (one group per step)")
    return _make_plan(m, k, n, config)


@functools.lru_cache(maxsize=None)
def _plan_config(m, k, n, itemsize, group_size, sms) -> MatmulConfig:
    if m > DECODE_ROWS:   # prefill: big tiles reuse each widened weight tile over many rows
        return MatmulConfig(pow2_block(m, 64 if itemsize >= 4 else 128), pow2_block(n, 128),
                                     group_size or pow2_block(k, 64), 1, 8 if itemsize < 4 else 4, 3)
    bm, bk = pow2_block(m, 64), group_size or pow2_block(k, 128)
    target = PROGRAMS_PER_SM * sms
    for bn in (64, 32):   # the widest N tile whose grid, split, fills the GPU
        tiles = cdiv(n, pow2_block(n, bn))
        split = min(cdiv(k, bk), cdiv(target, tiles))
        config = MatmulConfig(bm, pow2_block(n, bn), bk, split, 4, 3)
        if tiles * _make_plan(m, k, n, config).grid[2] >= target:
            break
    return config
