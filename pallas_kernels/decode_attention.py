"""Decode attention (flash-decoding) as a Pallas kernel: one new query token per sequence.

Layout: q ``[B, Hq, D]`` (this step's query); k_cache, v_cache ``[B, S_max, Hkv, D]``
(preallocated); lengths ``[B]`` int32 in 1..S_max: key ``j`` of row ``b`` is visible iff
``j < lengths[b]``. Output ``[B, Hq, D]`` in q's dtype.

Why a different design from prefill attention: with one query row per head there is almost
no arithmetic; the step is bound by reading the K/V cache, so the kernel's job is to read
each visible K/V byte exactly once, with enough programs in flight to saturate HBM. It reads
the cache in place, in its stored ``[B, S_max, Hkv, D]`` layout (rows of one KV head are
``Hkv * D`` elements apart): a kernel that first transposes the cache to ``[B, Hkv, S, D]``
(as jax's own ``gqa`` does) pays for a full extra read and write of the cache every step.

Grid, blocks and why
--------------------
- Grid ``(num_splits, Hkv, B)``. A program owns *one KV head of one sequence* and *all
  the G = Hq // Hkv query heads that share it*: they form the rows of a ``[G, D]`` query
  tile, so each K/V block is loaded once for the whole group (on Triton the tile is padded
  to at least 16 rows, the dot minimum; the extra rows are masked loads of 0, never stored).
- flash-decoding: the cache positions are split into ``num_splits`` chunks of
  ``chunk`` keys, one per program along grid axis 0, so that even a single long sequence
  fills the GPU. Each program runs the online softmax over its chunk in ``block_k`` steps
  and writes an unnormalised partial: accumulator ``[G, D]``, running max ``m`` and sum ``l``
  (f32, base-2 logs). A final combine (a few fused jnp ops on these small partials) merges
  the splits with the log-sum-exp rule: ``M = max_s m_s``, ``w_s = 2**(m_s - M)``,
  ``out = sum_s w_s acc_s / sum_s w_s l_s``.
- Work follows each row's real length: the loop bound is
  ``cdiv(min(chunk_end, lengths[b]) - chunk_start, block_k)``, so a program whose chunk
  starts at or past ``lengths[b]`` loads no K/V at all (it writes ``m = -inf, l = 0``, which
  the combine weighs by 0). Full blocks run unmasked; only the block holding the row's last
  key is masked.
- ``block_k`` and warps by head dim, and the number of splits by how many (sequence, KV
  head) pairs there are versus a target count of programs: ``_GPU_TABLE`` and
  ``choose_blocks``. All blocks are powers of two.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels import _online_softmax as online_softmax
from pallas_kernels import _validate as V
from pallas_kernels import reference
from pallas_kernels.mode import resolve_mode

LOG2E = math.log2(math.e)

# GPU tuning table by head dim: (block_k, num_warps, num_stages). Tune here.
_GPU_TABLE = {
    16: (128, 4, 3),
    32: (128, 4, 3),
    64: (128, 4, 3),
    128: (64, 4, 3),
    256: (32, 4, 2),
}
TARGET_PROGRAMS = 1024   # aim for several programs per SM (132 SMs on an H200)
MIN_SPLIT_KEYS = 256     # never split the cache into chunks shorter than this


def choose_blocks(b: int, s_max: int, hkv: int, d: int) -> tuple[int, int, int, int]:
    """(block_k, num_splits, num_warps, num_stages) for B rows, S_max cache slots, Hkv heads."""
    bk, warps, stages = _GPU_TABLE[d]
    bk = V.pow2_block(s_max, bk)
    splits = -(-TARGET_PROGRAMS // (b * hkv))
    splits = max(1, min(splits, -(-s_max // MIN_SPLIT_KEYS)))
    return bk, splits, warps, stages


def _decode_kernel(lengths_ref, q_ref, k_ref, v_ref, acc_ref, m_ref, l_ref, *, groups,
                   group_rows, chunk, block_k, scale_log2):
    # lengths_ref: [B] int32; q_ref: [B, Hq, D]; k_ref, v_ref: [B, S_max, Hkv, D];
    # acc_ref: [B, num_splits, Hq, D] f32; m_ref, l_ref: [B, num_splits, Hq] f32.
    d = q_ref.shape[-1]
    split = pl.program_id(0)
    h = pl.program_id(1)
    b = pl.program_id(2)
    length = lengths_ref[b]
    start = split * chunk
    end = jnp.minimum(start + chunk, length)          # this program's keys: [start, end)
    n_keys = jnp.maximum(end - start, 0)
    n_full = n_keys // block_k                         # blocks with every key visible
    n_total = pl.cdiv(n_keys, block_k)                 # 0 when the chunk is past the row's end

    row_ok = jnp.arange(group_rows) < groups           # real query heads of the group
    q = V.masked_load(q_ref.at[b, pl.ds(h * groups, group_rows), :],
                      V.block_mask(row_ok, None, (group_rows, d)))        # [group_rows, D]

    def step(j, carry, masked):
        k0 = start + j * block_k
        k_ok = (k0 + jnp.arange(block_k)) < end if masked else None
        kv_mask = V.block_mask(k_ok, None, (block_k, d))
        k = V.masked_load(k_ref.at[b, pl.ds(k0, block_k), h, :], kv_mask)   # [block_k, D]
        v = V.masked_load(v_ref.at[b, pl.ds(k0, block_k), h, :], kv_mask)   # [block_k, D]
        sc = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST,
                             preferred_element_type=jnp.float32) * scale_log2  # [group_rows, block_k]
        if masked:
            sc = jnp.where(k_ok[None, :], sc, -jnp.inf)
        # The first block holds key `start` (< end), visible to every row: m stays finite.
        return online_softmax.update(carry, sc, v)

    carry = online_softmax.start(group_rows, d)
    carry = lax.fori_loop(0, n_full, functools.partial(step, masked=False), carry)
    acc, m_i, l_i = lax.fori_loop(n_full, n_total, functools.partial(step, masked=True), carry)
    heads = pl.ds(h * groups, group_rows)
    plgpu.store(acc_ref.at[b, split, heads, :], acc, mask=V.block_mask(row_ok, None, (group_rows, d)))
    plgpu.store(m_ref.at[b, split, heads], m_i, mask=row_ok)
    plgpu.store(l_ref.at[b, split, heads], l_i, mask=row_ok)


def _check(q, k_cache, v_cache, lengths, sm_scale):
    q = V.as_array(q, "q")
    k_cache = V.as_array(k_cache, "k_cache")
    v_cache = V.as_array(v_cache, "v_cache")
    lengths = V.as_array(lengths, "lengths")
    V.check_rank(q, 3, "q", "[B, Hq, D]")
    V.check_rank(k_cache, 4, "k_cache", "[B, S_max, Hkv, D]")
    V.check_rank(v_cache, 4, "v_cache", "[B, S_max, Hkv, D]")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"v_cache has shape {tuple(v_cache.shape)} but k_cache has "
                         f"{tuple(k_cache.shape)}; the two caches must match")
    b, hq, d = q.shape
    bc, s_max, hkv, dc = k_cache.shape
    if bc != b:
        raise ValueError(f"k_cache has batch {bc} but q has {b}; q and the caches need the same batch size")
    if dc != d:
        raise ValueError(f"k_cache has head dim {dc} but q has {d}; q and the caches need the same head dim")
    V.check_head_dim(d, "q")
    if hq % hkv:
        raise ValueError(f"q has {hq} heads, not a multiple of the caches' {hkv} KV heads; "
                         "Hq must be a multiple of Hkv")
    for x, name in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache")):
        V.check_float_dtype(x, name)
    V.check_same_dtype(q, k_cache, "q", "k_cache")
    V.check_same_dtype(q, v_cache, "q", "v_cache")
    if lengths.shape != (b,):
        raise ValueError(f"lengths has shape {tuple(lengths.shape)}; it must be [B] = ({b},), one length per row")
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(f"lengths has dtype {lengths.dtype}; use int32 (lengths.astype(jnp.int32))")
    if V.is_concrete(lengths):
        lo, hi = int(jnp.min(lengths)), int(jnp.max(lengths))
        if lo < 1 or hi > s_max:
            raise ValueError(f"lengths must lie in 1..S_max={s_max}; got values from {lo} to {hi} "
                             "(every row needs at least one cached key and at most the cache size)")
    return q, k_cache, v_cache, lengths.astype(jnp.int32), V.check_sm_scale(sm_scale, d)


def _decode_pallas(q, k_cache, v_cache, lengths, *, sm_scale, interpret: bool, blocks=None):
    """The Pallas kernel call plus the combine (arguments already checked).

    ``blocks`` = (block_k, num_splits, num_warps, num_stages) overrides the table.
    """
    b, hq, d = q.shape
    s_max, hkv = k_cache.shape[1], k_cache.shape[2]
    bk, splits, warps, stages = blocks or choose_blocks(b, s_max, hkv, d)
    groups = hq // hkv
    chunk = pl.cdiv(pl.cdiv(s_max, splits), bk) * bk   # keys per split, a multiple of block_k
    splits = pl.cdiv(s_max, chunk)                      # drop splits that would start past S_max
    kernel = functools.partial(_decode_kernel, groups=groups, group_rows=V.pow2_block(groups, 1 << 30),
                               chunk=chunk, block_k=bk, scale_log2=sm_scale * LOG2E)
    out_shape = (jax.ShapeDtypeStruct((b, splits, hq, d), jnp.float32),
                 jax.ShapeDtypeStruct((b, splits, hq), jnp.float32),
                 jax.ShapeDtypeStruct((b, splits, hq), jnp.float32))
    acc, m, l = V.call_pallas(kernel, out_shape=out_shape, grid=(splits, hkv, b),
                              args=(lengths, q, k_cache, v_cache), interpret=interpret,
                              num_warps=warps, num_stages=stages, name="decode_attention")
    # Combine the splits (log-sum-exp in base 2). Split 0 always has keys, so m_max is finite.
    m_max = jnp.max(m, axis=1, keepdims=True)               # [B, 1, Hq]
    w = jnp.exp2(m - m_max)                                 # [B, splits, Hq]; 0 for empty splits
    num = jnp.sum(w[..., None] * acc, axis=1)               # [B, Hq, D]
    den = jnp.sum(w * l, axis=1)                            # [B, Hq]
    return (num / den[..., None]).astype(q.dtype)


def decode_attention(q, k_cache, v_cache, lengths, *, sm_scale=None, mode: str = "auto"):
    """One decode step of attention: q ``[B,Hq,D]`` over caches ``[B,S_max,Hkv,D]`` -> ``[B,Hq,D]``.

    Row ``b`` attends to its first ``lengths[b]`` cached keys (1..S_max). ``sm_scale``
    defaults to ``D ** -0.5``. ``mode``: "auto" | "pallas" | "interpret" | "reference".
    """
    q, k_cache, v_cache, lengths, sm_scale = _check(q, k_cache, v_cache, lengths, sm_scale)
    mode = resolve_mode(mode)
    if mode == "reference":
        return reference.decode_attention(q, k_cache, v_cache, lengths, sm_scale=sm_scale)
    return _decode_pallas(q, k_cache, v_cache, lengths, sm_scale=sm_scale,
                          interpret=(mode == "interpret"))
