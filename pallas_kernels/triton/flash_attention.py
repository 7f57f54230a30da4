"""Flash attention for prefill as a Pallas kernel: online softmax, GQA, causal block skipping.

Layout: q ``[B, T, Hq, D]``; k, v ``[B, S, Hkv, D]`` with ``Hq % Hkv == 0`` and ``S >= T``;
output ``[B, T, Hq, D]`` in q's dtype. Query head ``h`` reads KV head ``h // (Hq // Hkv)``
straight from k and v (grouped-query attention without repeating K/V in memory).

Math. For one query row ``i`` with scores ``s_j = sm_scale * q_i . k_j`` over the visible
keys, ``out_i = sum_j softmax(s)_j v_j``. Causal masking is aligned to the end (the T
queries are the last T of the S positions): query ``i`` sees key ``j`` iff
``j <= i + (S - T)``. With ``q_offsets`` [B] the queries of row ``b`` sit at key positions
``q_offsets[b] + i`` instead and see ``j <= q_offsets[b] + i``: a piece of a prompt attending to
the cache that the pieces before it filled (chunked prefill), wherever it sits in the row.

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
  by head dim, shrunk for short sequences (:func:`plan`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels import checks, reference
from pallas_kernels.mode import choose_tier
from pallas_kernels.triton import common, online_softmax
from pallas_kernels.triton.common import cdiv, pow2_block

LOG2E = math.log2(math.e)


# ----------------------------------------------------------------------------- the kernel
def flash_attention_kernel(*refs, t, s, groups, causal, scale_log2, block_q, block_k, offsets):
    # The refs: with offsets, offsets_ref [B] int32 first; then q_ref [B, T, Hq, D]; k_ref, v_ref
    # [B, S, Hkv, D]; o_ref [B, T, Hq, D] (whole arrays).
    offsets_ref = refs[0] if offsets else None
    q_ref, k_ref, v_ref, o_ref = refs[1:] if offsets else refs
    d = q_ref.shape[-1]
    num_q_blocks = pl.cdiv(t, block_q)
    qb = num_q_blocks - 1 - pl.program_id(0)      # heaviest (last) query blocks first
    h = pl.program_id(1)
    b = pl.program_id(2)
    kvh = h // groups                              # the KV head this query head shares
    q0 = qb * block_q
    rows = q0 + jnp.arange(block_q)                # [block_q] query positions
    row_ok = rows < t if t % block_q else None
    q = common.masked_load(q_ref.at[b, pl.ds(q0, block_q), h, :],
                      common.block_mask(row_ok, None, (block_q, d)))          # [block_q, D]

    # causal: row i sees keys j <= i + offset (read per row when given: a prompt piece's place)
    offset = offsets_ref[b] if offsets else s - t
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
        kv_mask = common.block_mask(k_ok, None, (block_k, d))
        k = common.masked_load(k_ref.at[b, pl.ds(k0, block_k), kvh, :], kv_mask)  # [block_k, D]
        v = common.masked_load(v_ref.at[b, pl.ds(k0, block_k), kvh, :], kv_mask)  # [block_k, D]
        sc = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST,
                             preferred_element_type=jnp.float32) * scale_log2  # [block_q, block_k]
        if masked:
            visible = k_ok[None, :]
            if causal:
                visible = visible & (keys[None, :] <= rows[:, None] + offset)
            sc = jnp.where(visible, sc, -jnp.inf)
        # Online softmax (online_softmax.update). The first block visited holds key 0, which every row
        # sees, so m_new is finite from then on and exp2(-inf - m_new) = 0 is safe.
        return online_softmax.update(carry, sc, v)

    carry = online_softmax.start(block_q, d)
    carry = lax.fori_loop(0, n_full, functools.partial(step, masked=False), carry)
    carry = lax.fori_loop(n_full, n_total, functools.partial(step, masked=True), carry)
    acc, _, l_i = carry
    out = (acc / l_i[:, None]).astype(o_ref.dtype)
    plgpu.store(o_ref.at[b, pl.ds(q0, block_q), h, :], out,
                mask=common.block_mask(row_ok, None, (block_q, d)))


# ----------------------------------------------------------------------------- launcher and entry points
def launch(q, k, v, *, causal, sm_scale, interpret: bool, config: FlashAttentionConfig | None = None,
           q_offsets=None):
    """Run :func:`flash_attention_kernel` on checked operands over the plan's grid (query blocks, Hq, B)."""
    b, t, hq, d = q.shape
    s, hkv = k.shape[1], k.shape[2]
    p = plan(b, t, s, hq, d, config=config)
    c = p.config
    kernel = functools.partial(flash_attention_kernel, t=t, s=s, groups=hq // hkv, causal=bool(causal),
                               scale_log2=sm_scale * LOG2E, block_q=c.block_q, block_k=c.block_k,
                               offsets=q_offsets is not None)
    args = (q, k, v) if q_offsets is None else (q_offsets, q, k, v)
    return common.call(kernel, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), grid=p.grid, args=args,
                        interpret=interpret, num_warps=c.num_warps, num_stages=c.num_stages,
                        name="flash_attention")


def flash_attention(q, k, v, *, causal=True, sm_scale=None, mode: str = "auto",
                    config: FlashAttentionConfig | None = None, q_offsets=None):
    """Attention of q ``[B,T,Hq,D]`` over k, v ``[B,S,Hkv,D]`` -> ``[B,T,Hq,D]``.

    ``causal`` (default True) is aligned to the end: query ``i`` sees keys
    ``j <= i + (S - T)``. ``q_offsets`` (int32 ``[B]``, >= 0; causal only) places row ``b``'s
    queries at key positions ``q_offsets[b] + i`` instead: query ``i`` sees ``j <= q_offsets[b] + i``
    (a piece of a prompt over the cache the pieces before it filled; the Mosaic GPU tier does not
    take it, so ``"pallas"`` runs such a call on the Triton tier). ``sm_scale`` defaults to
    ``D ** -0.5``. Softmax in f32; products
    accumulate in f32. ``mode``: see :mod:`pallas_kernels.mode`. ``config``: a
    :class:`FlashAttentionConfig` (Triton tier) or ``mosaic.flash_attention.MosaicFlashConfig``
    (Hopper tier) instead of the one the tier's ``plan`` picks.
    """
    if not isinstance(causal, bool):   # "no" is truthy: it would run causal attention
        raise ValueError(f"causal={causal!r} must be True or False")
    q, k, v, sm_scale, q_offsets = check(q, k, v, sm_scale, q_offsets, causal)
    tier = choose_tier(mode, config, triton_config=FlashAttentionConfig, mosaic=("flash_attention", "MosaicFlashConfig"),
                       mosaic_problem=lambda mosaic, copies: mosaic.unsupported(q, k, v, allow_copies=copies,
                                                                                q_offsets=q_offsets))
    if tier.name == "reference":
        return reference.flash_attention(q, k, v, causal=causal, sm_scale=sm_scale, q_offsets=q_offsets)
    if tier.name == "mosaic":
        return tier.module.flash_attention(q, k, v, causal=causal, sm_scale=sm_scale, config=config,
                                           interpret=tier.interpret)
    return launch(q, k, v, causal=causal, sm_scale=sm_scale, interpret=tier.interpret, config=config,
                  q_offsets=q_offsets)


def pallas_flash_attention(q, k, v, *, causal=True, sm_scale=None, config: FlashAttentionConfig | None = None,
                           interpret: bool = False, q_offsets=None):
    """The Pallas kernel itself, without the mode decision (compiled, or under the
    interpreter): what :func:`flash_attention` runs in modes "pallas" and "interpret"."""
    q, k, v, sm_scale, q_offsets = check(q, k, v, sm_scale, q_offsets, causal)
    return launch(q, k, v, causal=causal, sm_scale=sm_scale, interpret=interpret,
                  config=checks.check_config(config, FlashAttentionConfig), q_offsets=q_offsets)


def check(q, k, v, sm_scale, q_offsets=None, causal=True):
    """q, k, v as arrays after every check (one-line errors), the softmax scale and the offsets."""
    q, k, v, sm_scale = checks.attention_operands(q, k, v, q_rank=4, q_layout="[B, T, Hq, D]", k_name="k",
                                                    v_name="v", kv_layout="[B, S, Hkv, D]", sm_scale=sm_scale)
    if q_offsets is None:
        if k.shape[1] < q.shape[1]:
            raise ValueError(f"k has {k.shape[1]} keys but q has {q.shape[1]} queries; flash_attention needs S >= T")
        return q, k, v, sm_scale, None
    if not causal:
        raise ValueError("q_offsets place the queries for causal attention; pass causal=True, or no q_offsets")
    q_offsets = checks.as_array(q_offsets, "q_offsets")
    if q_offsets.shape != (q.shape[0],) or not jnp.issubdtype(q_offsets.dtype, jnp.integer):
        raise ValueError(f"q_offsets has shape {tuple(q_offsets.shape)} and dtype {q_offsets.dtype}; it must be "
                         f"[B] = ({q.shape[0]},) integers: the key position of each row's first query")
    if checks.is_concrete(q_offsets) and checks.value_range(q_offsets)[0] < 0:
        raise ValueError(f"q_offsets must be >= 0 (every query sees key 0); got {checks.value_range(q_offsets)[0]}")
    return q, k, v, sm_scale, q_offsets.astype(jnp.int32)



# ----------------------------------------------------------------------------- config and plan
@dataclasses.dataclass(frozen=True)
class FlashAttentionConfig:
    """Query rows and keys per block (powers of two >= 16), warps and pipeline stages."""

    block_q: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        checks.check_triton_config(self, ("block_q", "block_k"))


@dataclasses.dataclass(frozen=True)
class FlashAttentionPlan:
    """What the kernel launches for one shape: its config and grid (query blocks, Hq, B)."""

    config: FlashAttentionConfig
    grid: tuple

    @property
    def programs(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


# Blocks by head dim: (block_q, block_k, num_warps, num_stages). Tune here.
_TILES = {
    16: (128, 64, 4, 3),
    32: (128, 64, 4, 3),
    64: (128, 64, 4, 3),
    128: (128, 64, 8, 3),
    256: (64, 32, 8, 2),
}


def plan(batch: int, t: int, s: int, hq: int, d: int, *,
         config: FlashAttentionConfig | None = None) -> FlashAttentionPlan:
    """The config and grid :func:`flash_attention` uses for ``batch`` sequences of ``t``
    queries over ``s`` keys, ``hq`` query heads of dim ``d``. Blocks shrink for short
    sequences (never below 16); ``config`` overrides them."""
    if config is None:
        if d not in _TILES:
            raise ValueError(f"d={d!r}: the kernels support head dims {tuple(_TILES)}")
        bq, bk, warps, stages = _TILES[d]
        config = FlashAttentionConfig(pow2_block(t, bq), pow2_block(s, bk), warps, stages)
    checks.check_config(config, FlashAttentionConfig)
    return FlashAttentionPlan(config, (cdiv(t, config.block_q), hq, batch))
