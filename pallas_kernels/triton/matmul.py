"""Matmul ``a [M, K] @ b [K, N]`` as a Pallas kernel (Triton style: one output tile per program).

Grid, blocks and why
--------------------
- The output is cut into ``block_m x block_n`` tiles. Grid axis 0 numbers the tiles in
  *groups of GROUP_M tile-rows*, so tiles that run at the same time share rows of ``a`` and
  columns of ``b`` in L2 (the classic Triton "grouped ordering").
- Grid axis 1 splits K into ``split_k`` chunks (split-K). Each program walks its chunk in
  ``block_k`` steps: it loads an ``[block_m, block_k]`` slab of ``a`` and a
  ``[block_k, block_n]`` slab of ``b`` and accumulates their product in an f32
  ``[block_m, block_n]`` accumulator (a ``fori_loop``, which Triton software-pipelines across
  ``num_stages`` shared-memory buffers). With one chunk the tile is written in the output
  dtype; with several, each program writes an f32 partial sum and one small XLA reduction adds
  them (``split_k x M x N`` floats: for a decode step a few KB against megabytes of weight).
- Edges: M, N and K need not be multiples of the blocks. Loads past an edge are masked to
  read 0 (a zero adds nothing to the dot) and stores past an edge are masked off. The
  operands are never padded: padding a weight on every decode step would copy the very bytes
  a decode lesson measures. Masks exist only for dimensions that have a ragged edge.
- Blocks come from :func:`plan`, by shape:
  * decode-shaped (``M <= DECODE_ROWS``, 64: M is the batch): one tile row (``block_m`` = M rounded up to a
    power of two, at least 16: Triton dots below 16 return wrong numbers; the extra rows are
    masked loads of 0). Such a matmul is bound by streaming ``b`` once, and only a GPU full of
    programs keeps enough loads in flight: the plan narrows the N tiles and splits K until
    there are at least two programs per SM (a ``[2048, 2048]`` projection at 64-wide tiles is
    only 32 programs on a 132-SM chip; at 32-wide tiles with K split 5 ways it is 320).
  * prefill-shaped (large M): big tiles (128 x 256 x 64, 8 warps, 3 stages: a 10-line Pallas
    matmul reached 729 TFLOP/s with them for bf16 8192^3 on an H200, docs/architecture.md)
    maximise the reuse of every loaded slab.
  f32 halves ``block_k`` (its slabs are twice the bytes) and ``num_stages`` is capped so the
  pipelined slabs fit :data:`SMEM_BUDGET`. Every block is a power of two (Triton's rule).

Numerics: operands in the input dtype, f32 accumulation, f32 inputs at ``precision=HIGHEST``
(IEEE, no TF32), result cast to ``out_dtype`` (default: the input dtype).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels import checks, device, reference
from pallas_kernels.mode import choose_tier
from pallas_kernels.triton import common
from pallas_kernels.triton.common import cdiv, pow2_block

GROUP_M = 8                # tile-rows per group in the program order (L2 reuse)
SMEM_BUDGET = 160 * 1024   # bytes the pipelined slabs may use (fits Ampere's 163 KB and Hopper's 227 KB)
PROGRAMS_PER_SM = 2        # the plan splits work until the grid has at least this many per SM


# ----------------------------------------------------------------------------- the kernel
def matmul_kernel(a_ref, b_ref, o_ref, *, m, n, k, chunk, block_m, block_n, block_k, split):
    # a_ref: [m, k]; b_ref: [k, n]; o_ref: [m, n] (split == 1) or [split, m, n] f32 partials.
    num_m, num_n = pl.cdiv(m, block_m), pl.cdiv(n, block_n)
    pid = pl.program_id(0)
    # Grouped ordering: GROUP_M consecutive tile-rows share the programs that run together.
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    group_size = jnp.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_n)) % group_size
    pid_n = (pid % (GROUP_M * num_n)) // group_size

    rows = pid_m * block_m + jnp.arange(block_m)              # [block_m]
    cols = pid_n * block_n + jnp.arange(block_n)              # [block_n]
    row_ok = rows < m if m % block_m else None                # masks only for ragged edges
    col_ok = cols < n if n % block_n else None
    ragged_k = k % block_k != 0
    if split == 1:
        k0, steps = 0, pl.cdiv(k, block_k)
    else:  # this program's chunk of K: [k0, min(k0 + chunk, k))
        k0 = pl.program_id(1) * chunk
        steps = pl.cdiv(jnp.minimum(chunk, k - k0), block_k)

    def body(i, acc):
        ks = k0 + i * block_k + jnp.arange(block_k)           # [block_k]
        k_ok = ks < k if ragged_k else None
        a = common.masked_load(a_ref.at[pl.ds(pid_m * block_m, block_m), pl.ds(k0 + i * block_k, block_k)],
                                common.block_mask(row_ok, k_ok, (block_m, block_k)))   # [block_m, block_k]
        b = common.masked_load(b_ref.at[pl.ds(k0 + i * block_k, block_k), pl.ds(pid_n * block_n, block_n)],
                                common.block_mask(k_ok, col_ok, (block_k, block_n)))   # [block_k, block_n]
        # HIGHEST: IEEE f32 products on Triton for f32 inputs (no TF32); bf16/f16 unaffected.
        return acc + jnp.dot(a, b, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, steps, body, jnp.zeros((block_m, block_n), jnp.float32))
    tile = (pl.ds(pid_m * block_m, block_m), pl.ds(pid_n * block_n, block_n))
    out = o_ref.at[tile] if split == 1 else o_ref.at[(pl.program_id(1),) + tile]
    plgpu.store(out, acc.astype(o_ref.dtype), mask=common.block_mask(row_ok, col_ok, (block_m, block_n)))


# ----------------------------------------------------------------------------- launcher and entry points
def launch(a, b, out_dtype, *, interpret: bool, config: MatmulConfig | None = None):
    """Run :func:`matmul_kernel` on checked operands: the plan's grid, the kernel's constants,
    and (with K split) the sum of the partials. ``interpret``: under the Pallas interpreter."""
    (m, k), n = a.shape, b.shape[1]
    p = plan(m, k, n, a.dtype, config=config)
    c = p.config
    split = p.grid[1]
    kernel = functools.partial(matmul_kernel, m=m, n=n, k=k, chunk=p.chunk_k, block_m=c.block_m,
                               block_n=c.block_n, block_k=c.block_k, split=split)
    shape = (m, n) if split == 1 else (split, m, n)
    out = common.call(kernel, out_shape=jax.ShapeDtypeStruct(shape, out_dtype if split == 1 else jnp.float32),
                      grid=p.grid, args=(a, b), interpret=interpret, num_warps=c.num_warps,
                      num_stages=c.num_stages, name="matmul")
    return out if split == 1 else jnp.sum(out, axis=0).astype(out_dtype)


def matmul(a, b, *, out_dtype=None, mode: str = "auto", config: MatmulConfig | None = None):
    """``a [M, K] @ b [K, N] -> [M, N]`` for any M, N, K (float32, bfloat16 or float16).

    Accumulates in f32 (f32 inputs at full precision) and returns ``out_dtype`` (default: the
    input dtype). ``mode``: "auto" | "pallas" | "triton" | "mosaic" | "interpret" |
    "mosaic_interpret" | "reference" (see :mod:`pallas_kernels.mode`). ``config``: a
    :class:`MatmulConfig` (Triton tier) or ``mosaic.matmul.MosaicMatmulConfig`` (Hopper tier)
    to use instead of the one the tier's ``plan`` picks (ignored by the reference). The
    module docstring explains the grid.
    """
    a, b, out_dtype = check(a, b, out_dtype)
    tier = choose_tier(mode, config, triton_config=MatmulConfig, mosaic=("matmul", "MosaicMatmulConfig"),
                       mosaic_problem=lambda mosaic, copies: mosaic.unsupported(a, b, out_dtype, config, allow_copies=copies))
    if tier.name == "reference":
        return reference.matmul(a, b, out_dtype=out_dtype)
    if tier.name == "mosaic":
        return tier.module.matmul(a, b, out_dtype=out_dtype, config=config, interpret=tier.interpret)
    return launch(a, b, out_dtype, interpret=tier.interpret, config=config)


def pallas_matmul(a, b, *, out_dtype=None, config: MatmulConfig | None = None, interpret: bool = False):
    """The Pallas kernel itself, without the mode decision: compiled (``interpret=False``) or
    under the interpreter. What :func:`matmul` runs in modes "pallas" and "interpret"; call it
    directly to lower the kernel for a GPU on a machine that has none."""
    a, b, out_dtype = check(a, b, out_dtype)
    return launch(a, b, out_dtype, interpret=interpret, config=checks.check_config(config, MatmulConfig))


def check(a, b, out_dtype):
    """The operands as arrays after every check (one-line errors), and the output dtype."""
    a, b = checks.as_array(a, "a"), checks.as_array(b, "b")
    checks.check_rank(a, 2, "a", "[M, K]")
    checks.check_rank(b, 2, "b", "[K, N]")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"b has {b.shape[0]} rows but a has {a.shape[1]} columns (shapes {tuple(a.shape)} "
                         f"and {tuple(b.shape)}); b must be [K, N] with K = a.shape[1]")
    checks.check_float_dtype(a, "a")
    checks.check_float_dtype(b, "b")
    checks.check_same_dtype(a, b, "a", "b")
    return a, b, checks.check_out_dtype(out_dtype, a.dtype)



# ----------------------------------------------------------------------------- config and plan
@dataclasses.dataclass(frozen=True)
class MatmulConfig:
    """How the kernel cuts the work: tile sizes, K split, warps and pipeline stages.

    Blocks are powers of two >= 16. ``split_k`` is the number of K chunks asked for (the plan
    may use fewer: chunks are whole multiples of ``block_k``).
    """

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        checks.check_triton_config(self, ("block_m", "block_n", "block_k"))
        if isinstance(self.split_k, bool) or not isinstance(self.split_k, int) or self.split_k < 1:
            raise ValueError(f"MatmulConfig.split_k={self.split_k!r} must be a positive integer")


@dataclasses.dataclass(frozen=True)
class MatmulPlan:
    """What the kernel will launch for one shape: its config and grid."""

    m: int
    k: int
    n: int
    config: MatmulConfig
    chunk_k: int          # K elements per split (a multiple of block_k)
    grid: tuple           # (output tiles, K chunks)

    @property
    def programs(self) -> int:
        return self.grid[0] * self.grid[1]


DECODE_ROWS = 64   # M up to this is a decode step's batch: one tile row, and the plan fills the GPU with N and K

# Tiles by shape class, for 2-byte dtypes: (max M, block_m, block_n, block_k, num_warps, num_stages).
# block_m None means "M rounded up to a power of two, at least 16". First row whose max M >= M wins.
_TILES = (
    (DECODE_ROWS, None, 64, 256, 4, 3),   # decode: stream the weight; N tiles narrowed further if needed
    (256, 64, 128, 64, 4, 4),             # medium batches
    (None, 128, 256, 64, 8, 3),           # prefill
)
# Decode tiles the plan tries, widest first, until the grid has PROGRAMS_PER_SM programs per SM.
_DECODE_N_BLOCKS = (64, 32)
_DECODE_K_BLOCKS = (256, 128, 64)


def _fit_stages(bm, bn, bk, stages, itemsize):
    per_stage = (bm * bk + bk * bn) * itemsize
    return max(1, min(stages, SMEM_BUDGET // per_stage))


def _split(k: int, bk: int, want: int) -> tuple[int, int]:
    """(chunk, splits) for K cut into about ``want`` chunks of whole ``bk`` blocks."""
    blocks = cdiv(k, bk)
    chunk_blocks = cdiv(blocks, max(1, min(want, blocks)))
    return chunk_blocks * bk, cdiv(blocks, chunk_blocks)


def _make_plan(m, k, n, config: MatmulConfig) -> MatmulPlan:
    chunk, splits = _split(k, config.block_k, config.split_k)
    tiles = cdiv(m, config.block_m) * cdiv(n, config.block_n)
    return MatmulPlan(m, k, n, config, chunk, (tiles, splits))


def _split_for(m, k, n, bm, bn, bk, target) -> int:
    """The smallest K split that gives at least ``target`` programs (or the deepest possible)."""
    tiles = cdiv(m, bm) * cdiv(n, bn)
    blocks = cdiv(k, bk)
    for want in range(max(1, cdiv(target, tiles)), blocks + 1):
        if tiles * _split(k, bk, want)[1] >= target:
            return want
    return blocks


@functools.lru_cache(maxsize=None)
def _plan_cached(m, k, n, itemsize, sms) -> MatmulPlan:
    for max_m, bm, bn, bk, warps, stages in _TILES:
        if max_m is None or m <= max_m:
            break
    decode_shaped = m <= DECODE_ROWS
    bm = pow2_block(m, 1 << 30) if bm is None else pow2_block(m, bm)
    scale_k = 2 if itemsize >= 4 else 1
    target = PROGRAMS_PER_SM * sms
    if decode_shaped:  # try narrower N tiles and shallower K blocks, widest first
        candidates = [(pow2_block(n, cn), pow2_block(k, ck // scale_k)) for cn in _DECODE_N_BLOCKS
                      for ck in _DECODE_K_BLOCKS]
    else:
        candidates = [(pow2_block(n, bn), pow2_block(k, bk // scale_k))]
    plans = []
    for cbn, cbk in candidates:
        # Split K only for decode shapes: their f32 partials (split x M x N) are tiny next to the
        # weight; for a prefill they would be as large as the output, written several times.
        split = _split_for(m, k, n, bm, cbn, cbk, target) if decode_shaped else 1
        plans.append(_make_plan(m, k, n, MatmulConfig(bm, cbn, cbk, split, warps,
                                                      _fit_stages(bm, cbn, cbk, stages, itemsize))))
    enough = [p for p in plans if p.programs >= target]
    if enough:  # the fewest programs that fill the GPU: most bytes per program, least to reduce
        return min(enough, key=lambda p: p.programs)
    return max(plans, key=lambda p: p.programs)  # K too short to split further


def plan(m: int, k: int, n: int, dtype=jnp.bfloat16, *, num_sms: int | None = None,
         config: MatmulConfig | None = None) -> MatmulPlan:
    """The config and grid :func:`matmul` uses for ``[m, k] @ [k, n]`` in ``dtype``.

    ``num_sms``: the GPU's SM count (None: read the device, or the H200's 132 where there is
    no GPU; see :mod:`pallas_kernels.device`). ``config``: plan with these blocks instead of
    choosing them (the grid is still derived from the shape).
    """
    for name, v in (("m", m), ("k", k), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive integer")
    if config is not None:
        return _make_plan(m, k, n, checks.check_config(config, MatmulConfig))
    return _plan_cached(m, k, n, jnp.dtype(dtype).itemsize, device.num_sms(num_sms))
