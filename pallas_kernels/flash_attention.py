"""Flash attention for prefill as a Pallas kernel: online softmax, GQA, causal block skipping.

Layout: q ``[B, T, Hq, D]``; k, v ``[B, S, Hkv, D]`` with ``Hq % Hkv == 0`` and ``S >= T``;
output ``[B, T, Hq, D]`` in q's dtype. Query head ``h`` reads KV head ``h // (Hq // Hkv)``
straight from k and v (grouped-query attention without repeating K/V in memory).

Math. For one query row ``i`` with scores ``s_j = sm_scale * q_i . k_j`` over the visible
keys, ``out_i = sum_j softmax(s)_j v_j``. Causal masking is aligned to the end (the T
queries are the last T of the S positions): query ``i`` sees key ``j`` iff
``j <= i + (S - T)``.

Grid, blocks and why
--------------------
- Grid ``(cdiv(T, block_q), Hq, B)``: a program owns ``block_q`` query rows of one head of
  one sequence. Query blocks are taken in reverse order so the heaviest causal blocks (the
  last rows see the most keys) start first and the light ones fill in at the end.
- Each program keeps ``[block_q, D]`` of q in registers and walks the keys in ``block_k``
  steps with the *online softmax*: a running row max ``m``, running sum ``l`` and an
  unnormalised f32 accumulator, rescaled by ``exp(m_old - m_new)`` whenever the max grows;
  the output is ``acc / l`` at the end. Scores live in f32 and use ``exp2`` with
  ``sm_scale * log2(e)`` folded into one multiply (the GPU's native exponential).
- Only visible key blocks are visited: with causal masking the loop ends at the block that
  holds key ``last_row + S - T``. The loop is split in two: blocks every row of the query
  block fully sees run without any mask; only the few blocks on the diagonal or at the
  ragged end of S build a mask. Loads past T or S are masked to read 0; stores past T are
  masked off; nothing is padded in memory.
- All blocks are powers of two and >= 16 (Triton's dot minimum): ``block_q x block_k``
  from ``_GPU_TABLE`` by head dim, shrunk for short sequences.
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

# GPU tuning table by head dim: (block_q, block_k, num_warps, num_stages). Tune here.
_GPU_TABLE = {
    16: (128, 64, 4, 3),
    32: (128, 64, 4, 3),
    64: (128, 64, 4, 3),
    128: (128, 64, 8, 3),
    256: (64, 32, 8, 2),
}


def choose_blocks(t: int, s: int, d: int) -> tuple[int, int, int, int]:
    """(block_q, block_k, num_warps, num_stages) for T queries, S keys, head dim d."""
    bq, bk, warps, stages = _GPU_TABLE[d]
    return V.pow2_block(t, bq), V.pow2_block(s, bk), warps, stages


def _flash_kernel(q_ref, k_ref, v_ref, o_ref, *, t, s, groups, causal, scale_log2,
                  block_q, block_k):
    # q_ref: [B, T, Hq, D]; k_ref, v_ref: [B, S, Hkv, D]; o_ref: [B, T, Hq, D] (whole arrays).
    d = q_ref.shape[-1]
    num_q_blocks = pl.cdiv(t, block_q)
    qb = num_q_blocks - 1 - pl.program_id(0)      # heaviest (last) query blocks first
    h = pl.program_id(1)
    b = pl.program_id(2)
    kvh = h // groups                              # the KV head this query head shares
    q0 = qb * block_q
    rows = q0 + jnp.arange(block_q)                # [block_q] query positions
    row_ok = rows < t if t % block_q else None
    q = V.masked_load(q_ref.at[b, pl.ds(q0, block_q), h, :],
                      V.block_mask(row_ok, None, (block_q, d)))          # [block_q, D]

    offset = s - t                                 # causal: row i sees keys j <= i + offset
    if causal:
        # Keys visible to some row of this block end at (last row) + offset; keys visible
        # to *every* row end at (first row) + offset.
        n_total = pl.cdiv(jnp.minimum(s, q0 + block_q + offset), block_k)
        n_full = jnp.minimum(s, q0 + offset + 1) // block_k
    else:
        n_total = pl.cdiv(s, block_k)
        n_full = s // block_k

    def step(kb, carry, masked):
        k0 = kb * block_k
        keys = k0 + jnp.arange(block_k)            # [block_k] key positions
        k_ok = keys < s if masked else None
        kv_mask = V.block_mask(k_ok, None, (block_k, d))
        k = V.masked_load(k_ref.at[b, pl.ds(k0, block_k), kvh, :], kv_mask)  # [block_k, D]
        v = V.masked_load(v_ref.at[b, pl.ds(k0, block_k), kvh, :], kv_mask)  # [block_k, D]
        sc = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST,
                             preferred_element_type=jnp.float32) * scale_log2  # [block_q, block_k]
        if masked:
            visible = k_ok[None, :]
            if causal:
                visible = visible & (keys[None, :] <= rows[:, None] + offset)
            sc = jnp.where(visible, sc, -jnp.inf)
        # Online softmax (_online_softmax). The first block visited holds key 0, which every row
        # sees, so m_new is finite from then on and exp2(-inf - m_new) = 0 is safe.
        return online_softmax.update(carry, sc, v)

    carry = online_softmax.start(block_q, d)
    carry = lax.fori_loop(0, n_full, functools.partial(step, masked=False), carry)
    carry = lax.fori_loop(n_full, n_total, functools.partial(step, masked=True), carry)
    acc, _, l_i = carry
    out = (acc / l_i[:, None]).astype(o_ref.dtype)
    plgpu.store(o_ref.at[b, pl.ds(q0, block_q), h, :], out,
                mask=V.block_mask(row_ok, None, (block_q, d)))


def _check(q, k, v, sm_scale):
    q, k, v = V.as_array(q, "q"), V.as_array(k, "k"), V.as_array(v, "v")
    V.check_rank(q, 4, "q", "[B, T, Hq, D]")
    V.check_rank(k, 4, "k", "[B, S, Hkv, D]")
    V.check_rank(v, 4, "v", "[B, S, Hkv, D]")
    if k.shape != v.shape:
        raise ValueError(f"v has shape {tuple(v.shape)} but k has {tuple(k.shape)}; k and v must match")
    bq_, t, hq, d = q.shape
    bk_, s, hkv, dk = k.shape
    if bk_ != bq_:
        raise ValueError(f"k has batch {bk_} but q has {bq_}; q, k, v need the same batch size")
    if dk != d:
        raise ValueError(f"k has head dim {dk} but q has {d}; q, k, v need the same head dim")
    V.check_head_dim(d, "q")
    if hq % hkv:
        raise ValueError(
            f"q has {hq} heads, not a multiple of k's {hkv} KV heads; Hq must be a multiple of Hkv"
        )
    if s < t:
        raise ValueError(f"k has {s} keys but q has {t} queries; flash_attention needs S >= T")
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        V.check_float_dtype(x, name)
    V.check_same_dtype(q, k, "q", "k")
    V.check_same_dtype(q, v, "q", "v")
    return q, k, v, V.check_sm_scale(sm_scale, d)


def _flash_pallas(q, k, v, *, causal, sm_scale, interpret: bool, blocks=None):
    """The Pallas kernel call (arguments already checked). ``blocks`` overrides the table."""
    b, t, hq, d = q.shape
    s, hkv = k.shape[1], k.shape[2]
    bq, bk, warps, stages = blocks or choose_blocks(t, s, d)
    kernel = functools.partial(_flash_kernel, t=t, s=s, groups=hq // hkv, causal=bool(causal),
                               scale_log2=sm_scale * LOG2E, block_q=bq, block_k=bk)
    return V.call_pallas(kernel, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
                         grid=(pl.cdiv(t, bq), hq, b), args=(q, k, v), interpret=interpret,
                         num_warps=warps, num_stages=stages, name="flash_attention")


def flash_attention(q, k, v, *, causal=True, sm_scale=None, mode: str = "auto"):
    """Attention of q ``[B,T,Hq,D]`` over k, v ``[B,S,Hkv,D]`` -> ``[B,T,Hq,D]``.

    ``causal`` (default True) is aligned to the end: query ``i`` sees keys
    ``j <= i + (S - T)``. ``sm_scale`` defaults to ``D ** -0.5``. Softmax in f32; products
    accumulate in f32. ``mode``: "auto" | "pallas" | "interpret" | "reference".
    """
    q, k, v, sm_scale = _check(q, k, v, sm_scale)
    mode = resolve_mode(mode)
    if mode == "reference":
        return reference.flash_attention(q, k, v, causal=causal, sm_scale=sm_scale)
    return _flash_pallas(q, k, v, causal=causal, sm_scale=sm_scale,
                         interpret=(mode == "interpret"))
