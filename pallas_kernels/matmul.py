"""Matmul ``a [M, K] @ b [K, N]`` as a Pallas kernel (Triton style: one output tile per program).

Grid, blocks and why
--------------------
- The output is cut into ``block_m x block_n`` tiles; program ``p`` of a 1-D grid of
  ``cdiv(M, block_m) * cdiv(N, block_n)`` programs owns one tile. Programs are numbered in
  *groups of GROUP_M tile-rows* so that tiles running at the same time share rows of ``a``
  and columns of ``b`` in L2 (the classic Triton "grouped ordering").
- Each program walks K in ``block_k`` steps: it loads an ``[block_m, block_k]`` slab of ``a``
  and a ``[block_k, block_n]`` slab of ``b`` and accumulates their product in an f32
  ``[block_m, block_n]`` accumulator (a ``fori_loop``, which Triton software-pipelines
  across ``num_stages`` shared-memory buffers).
- Edges: M, N and K need not be multiples of the blocks. Loads past an edge are masked to
  read 0 (a zero adds nothing to the dot) and stores past an edge are masked off, inside the
  kernel; the operands are never padded (padding a weight on every decode step would copy
  the very bytes a decode lesson measures). Masks are only built for dimensions that have a
  ragged edge, so exact multiples run mask-free.
- Block sizes depend on the shape (``_GPU_TABLE``):
  * decode-shaped (``M <= 64``: M is the batch): the whole batch fits one tile row, so
    ``block_m`` is M rounded up to a power of two and at least 16 (Triton dots below 16
    return wrong numbers; the extra rows are masked loads of 0, not padding in memory).
    Such a matmul is bound by reading ``b`` once, so tiles are narrow in N
    (``block_n = 64``) and deep in K: N/64 programs each stream their own columns of the
    weight, enough of them to keep every SM's loads in flight.
  * prefill-shaped (large M): big square-ish tiles (128 x 256 x 64, 8 warps, 3 stages
    reached 729 TFLOP/s for bf16 8192^3 on the H200 in a 10-line Pallas matmul: PLATFORM.md)
    maximise reuse of each loaded slab; our kernel's figure awaits a GPU run (docs/benchmarks.md).
  f32 halves ``block_k`` (its slabs are twice the bytes) and ``num_stages`` is capped so
  the pipelined slabs fit 160 KiB of shared memory (true on Ampere and Hopper).
- All blocks are powers of two (Triton's rule).

Numerics: operands in the input dtype, f32 accumulation, f32 inputs at ``precision=HIGHEST``
(IEEE, no TF32), result cast to ``out_dtype`` (default: the input dtype).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels import _validate as V
from pallas_kernels import reference
from pallas_kernels.mode import resolve_mode

GROUP_M = 8  # tile-rows per group in the program order (L2 reuse)
SMEM_BUDGET = 160 * 1024  # bytes of shared memory the pipelined slabs may use

# GPU tuning table, by shape class: (max M, block_m, block_n, block_k, num_warps, num_stages).
# block_m None means "M rounded up to a power of two, at least 16". Values are for 2-byte
# dtypes; f32 halves block_k. First row whose max M >= M wins. Tune here.
_GPU_TABLE = (
    (64, None, 64, 256, 4, 3),        # decode: stream the weight, N/64 programs, deep K
    (256, 64, 128, 64, 4, 4),         # medium batches
    (None, 128, 256, 64, 8, 3),       # prefill: these tiles gave 729 TFLOP/s (bf16 8192^3, H200) in PLATFORM.md
)


@functools.lru_cache(maxsize=None)
def choose_blocks(m: int, n: int, k: int, itemsize: int) -> tuple[int, int, int, int, int]:
    """(block_m, block_n, block_k, num_warps, num_stages) for an ``[m,k] @ [k,n]`` matmul."""
    for max_m, bm, bn, bk, warps, stages in _GPU_TABLE:
        if max_m is None or m <= max_m:
            break
    bm = V.pow2_block(m, 1 << 30) if bm is None else V.pow2_block(m, bm)
    if itemsize >= 4:
        bk //= 2
    bn = V.pow2_block(n, bn)
    bk = V.pow2_block(k, bk)
    per_stage = (bm * bk + bk * bn) * itemsize
    stages = max(1, min(stages, SMEM_BUDGET // per_stage))
    return bm, bn, bk, warps, stages


def _matmul_kernel(a_ref, b_ref, o_ref, *, m, n, k, block_m, block_n, block_k):
    # a_ref: [m, k] whole array; b_ref: [k, n] whole array; o_ref: [m, n] whole array.
    num_m = pl.cdiv(m, block_m)
    num_n = pl.cdiv(n, block_n)
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
    precision = lax.Precision.HIGHEST  # IEEE f32 on Triton; bf16/f16 unaffected

    def body(i, acc):
        ks = i * block_k + jnp.arange(block_k)                # [block_k]
        k_ok = ks < k if ragged_k else None
        a = V.masked_load(a_ref.at[pl.ds(pid_m * block_m, block_m), pl.ds(i * block_k, block_k)],
                          V.block_mask(row_ok, k_ok, (block_m, block_k)))   # [block_m, block_k]
        b = V.masked_load(b_ref.at[pl.ds(i * block_k, block_k), pl.ds(pid_n * block_n, block_n)],
                          V.block_mask(k_ok, col_ok, (block_k, block_n)))   # [block_k, block_n]
        return acc + jnp.dot(a, b, precision=precision, preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, pl.cdiv(k, block_k), body,
                        jnp.zeros((block_m, block_n), jnp.float32))
    out = o_ref.at[pl.ds(pid_m * block_m, block_m), pl.ds(pid_n * block_n, block_n)]
    plgpu.store(out, acc.astype(o_ref.dtype), mask=V.block_mask(row_ok, col_ok, (block_m, block_n)))


def _check(a, b, out_dtype):
    a = V.as_array(a, "a")
    b = V.as_array(b, "b")
    V.check_rank(a, 2, "a", "[M, K]")
    V.check_rank(b, 2, "b", "[K, N]")
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"b has {b.shape[0]} rows but a has {a.shape[1]} columns (shapes {tuple(a.shape)} "
            f"and {tuple(b.shape)}); b must be [K, N] with K = a.shape[1]"
        )
    V.check_float_dtype(a, "a")
    V.check_float_dtype(b, "b")
    V.check_same_dtype(a, b, "a", "b")
    return a, b, V.check_out_dtype(out_dtype, a.dtype)


def _matmul_pallas(a, b, out_dtype, *, interpret: bool, blocks=None):
    """The Pallas kernel call (shapes already checked). ``blocks`` overrides the table."""
    m, k = a.shape
    n = b.shape[1]
    bm, bn, bk, warps, stages = blocks or choose_blocks(m, n, k, a.dtype.itemsize)
    kernel = functools.partial(_matmul_kernel, m=m, n=n, k=k,
                               block_m=bm, block_n=bn, block_k=bk)
    grid = (pl.cdiv(m, bm) * pl.cdiv(n, bn),)
    return V.call_pallas(kernel, out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
                         grid=grid, args=(a, b), interpret=interpret,
                         num_warps=warps, num_stages=stages, name="matmul")


def matmul(a, b, *, out_dtype=None, mode: str = "auto"):
    """``a [M, K] @ b [K, N] -> [M, N]`` for any M, N, K (float32, bfloat16 or float16).

    Accumulates in f32 (f32 inputs at full precision) and returns ``out_dtype`` (default: the
    input dtype). ``mode``: "auto" | "pallas" | "interpret" | "reference" (see
    :mod:`pallas_kernels.mode`). The module docstring explains the grid and blocks.
    """
    a, b, out_dtype = _check(a, b, out_dtype)
    mode = resolve_mode(mode)
    if mode == "reference":
        return reference.matmul(a, b, out_dtype=out_dtype)
    return _matmul_pallas(a, b, out_dtype, interpret=(mode == "interpret"))
