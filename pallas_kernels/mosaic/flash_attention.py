"""Hopper flash attention (prefill) in Mosaic GPU: TMA, wgmma, warp specialisation, pingpong.

Layout and math
---------------
q ``[B, T, Hq, D]``; k, v ``[B, S, Hkv, D]`` (``S >= T``, ``Hq % Hkv == 0``, bf16 or f16, head dim
64 or 128); output ``[B, T, Hq, D]`` in q's dtype. Query head ``h`` reads KV head
``h // (Hq // Hkv)`` straight from k and v: grouped-query attention without repeating K/V.
``out_i = sum_j softmax_j(sm_scale * q_i . k_j) v_j`` over the visible keys; with ``causal``
the T queries are the last T of the S positions, so query ``i`` sees key ``j`` iff
``j <= i + (S - T)``. Scores, the running max/sum and the accumulator are f32; the
probabilities are cast to the input dtype for the second matmul (what the tensor cores take),
as in the Triton-style kernel and ``pallas_kernels.reference``.

Grid and why
------------
- Grid ``(cdiv(T, 2*block_q), Hq, B)``; a CTA owns ``2 * block_q`` query rows of one head of
  one sequence. Query tiles run in reverse order: under causal masking the last rows see the
  most keys, so the heaviest CTAs start first and the light ones fill the tail.
- Three warpgroups per CTA (``plgpu.emit_pipeline_warp_specialized``): a **producer** that
  only issues TMA copies of ``[block_kv, D]`` blocks of K and V into a ring of ``stages``
  shared-memory slots (40 registers per thread), and two **consumers**, each owning
  ``block_q`` query rows (its Q tile is TMA-loaded once and stays in shared memory). K and V
  of a step have **separate barriers**, so a consumer starts ``S = Q K^T`` as soon as K
  lands and only waits for V right before ``P V``.
- Per key block a consumer runs: ``S = Q K^T`` (wgmma, f32), scale by
  ``sm_scale * log2(e)``, mask (only on blocks that cross the causal diagonal or the end of
  S), the online softmax (running max ``m``, sum ``l``, accumulator rescaled by
  ``2^(m_old - m_new)``), then ``acc += P V`` (wgmma). At the end ``acc / l`` goes back
  through the Q tile's shared memory to a TMA store.
- **Only visible key blocks are loaded**: the producer's loop length is
  ``cdiv(min(S, last_row + 1 + S - T), block_kv)`` for the CTA's last row (a traced bound,
  so the pipeline's grid is dynamic). The lower consumer skips the wgmmas of blocks that lie
  wholly past its own diagonal (it still takes part in the barriers).

What of FlashAttention-3 is here, and what is not
-------------------------------------------------
Here: producer/consumer warp specialisation with register reallocation (``setmaxnreg``),
TMA loads into a multi-stage ring, wgmma for both matmuls, separate K and V barriers, and
*pingpong* scheduling between the two consumer warpgroups (``pingpong=True``): a two-arrival
barrier staggers them by half an iteration so one warpgroup's softmax (exp2) runs while the
other's wgmmas use the tensor core. Whether the stagger pays off here is unmeasured (no GPU).

Different: FA3 feeds P to the second wgmma straight from registers. GPU interpret mode's
wgmma only takes shared-memory operands, so the default (``p_in_registers=False``) writes P
to a ``[block_q, block_kv]`` shared-memory tile first (16 KiB per consumer, extra shared-memory
traffic); ``p_in_registers=True`` is FA3's path, which lowers for sm_90 (tested) but no CPU
run can check numerically.

Not here: *intra*-warpgroup pipelining (issuing block j+1's ``Q K^T`` before block j's
softmax): the warp-specialised pipeline helper hands the body one K/V slot at a time, so it
would need a hand-written producer/consumer loop with explicit slot indexing, and two score
tiles live in registers. Also not here: FP8 with block quantisation and incoherent processing
(this tier is bf16/f16), a persistent tile scheduler (plain grid), the backward pass. GQA
heads of a group run in separate CTAs and share K/V through L2 (FA3's "pack GQA" is not done).

Edges
-----
Blocks that cross the end of T or S rely on TMA: loads past the end read zeros, stores past
the end are dropped; masked keys (past S, or past the causal diagonal) get ``-inf`` scores.
Mosaic GPU views a TMA-copied array as whole 8-row tiles, so T and S are padded to a
multiple of 8 first when they are not (a copy of q or k/v, which this tier only accepts for
prefill activations; the output rows added are sliced off).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.mosaic import common as C

LOG2E = math.log2(math.e)
HEAD_DIMS = (64, 128)


# ----------------------------------------------------------------------------- the kernel
def flash_attention_kernel(q_ref, k_ref, v_ref, o_ref, q_smem, p_smem, q_bar, sched_bar, *, t, s, groups,
                  causal, scale_log2, cfg: MosaicFlashConfig):
    # q_ref, o_ref: [B, T8, Hq, D]; k_ref, v_ref: [B, S8, Hkv, D] (T8, S8: T, S rounded up to 8).
    # q_smem: [2, block_q, D] (one Q / output tile per consumer); p_smem: [2, block_q, block_kv]
    # (P tiles, unless P stays in registers); q_bar: 2 barriers; sched_bar: the two-arrival
    # pingpong barrier.
    bq, bkv = cfg.block_q, cfg.block_kv
    d = q_ref.shape[-1]
    dtype = q_ref.dtype
    n_qt = lax.axis_size("q")
    qt = n_qt - 1 - lax.axis_index("q")            # heaviest (last) query tiles first
    h = lax.axis_index("h")
    b = lax.axis_index("b")
    kvh = h // groups
    wg = lax.axis_index("wg")                      # 0, 1: consumers; 2: producer
    offset = s - t                                 # causal: row i sees keys j <= i + offset
    cta_row0 = qt * (2 * bq)
    if causal:
        kv_end = jnp.minimum(s, cta_row0 + 2 * bq + offset)   # keys the CTA's last row sees
    else:
        kv_end = s
    n_kv = pl.cdiv(kv_end, bkv)                    # >= 1: every row sees key 0
    kv_tf = C.swizzled(d, dtype)

    def sched():  # both consumers arrive, then both wait: a rendezvous that staggers them
        plgpu.barrier_arrive(sched_bar)
        plgpu.barrier_wait(sched_bar)

    def step(idx, k_smem, v_smem, k_bar, v_bar, carry):
        # k_smem, v_smem: [block_kv, D]; carry: (acc [bq, D], m [bq], l [bq]) f32 registers.
        (kb,) = idx
        acc, m_i, l_i = carry
        row0 = cta_row0 + wg * bq
        k0 = kb * bkv
        pp = cfg.pingpong

        def compute(carry):
            acc, m_i, l_i = carry
            plgpu.barrier_wait(k_bar)

            def qk(s_ref):
                plgpu.wgmma(s_ref, q_smem.at[wg], k_smem.transpose((1, 0)))
                if pp:
                    sched()        # hand the tensor core over while this wgmma runs
                return s_ref[...]
            sc = pl.run_scoped(qk, plgpu.ACC((bq, bkv), jnp.float32)) * scale_log2   # [bq, bkv]

            # Mask only blocks that cross the causal diagonal of these rows or the end of S.
            needs_mask = k0 + bkv > s
            if causal:
                needs_mask = needs_mask | (k0 + bkv - 1 > row0 + offset)

            def masked(sc):
                rows = row0 + plgpu.broadcasted_iota(jnp.int32, (bq, bkv), 0, layout=plgpu.Layout.WGMMA)
                keys = k0 + plgpu.broadcasted_iota(jnp.int32, (bq, bkv), 1, layout=plgpu.Layout.WGMMA)
                visible = keys < s
                if causal:
                    visible = visible & (keys <= rows + offset)
                return jnp.where(visible, sc, -jnp.inf)
            sc = lax.cond(needs_mask, masked, lambda sc: sc, sc)

            # Online softmax in base 2. Block 0 holds key 0, which every row sees, so m is
            # finite from the first block on and exp2(-inf - m) = 0 below is safe.
            m_new = jnp.maximum(m_i, sc.max(axis=1))
            alpha = jnp.exp2(m_i - m_new)
            p = jnp.exp2(sc - lax.broadcast_in_dim(m_new, sc.shape, [0]))
            l_new = l_i * alpha + p.sum(axis=1)
            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
            p16 = p.astype(dtype)
            if pp:
                sched()            # softmax done: let the other warpgroup's wgmma go first
            plgpu.barrier_wait(v_bar)

            if cfg.p_in_registers:
                p_op = p16
            else:
                p_smem[wg] = p16
                plgpu.commit_smem()         # make the stores visible to the tensor core
                p_op = p_smem.at[wg]

            def pv(o_ref):
                plgpu.wgmma(o_ref, p_op, v_smem)
                return o_ref[...]
            # A fresh (zeroed) accumulator plus a register add, rather than wgmma into the
            # running accumulator through pl.run_state: GPU interpret mode cannot run
            # run_state, and the add is 64 FMAs per thread against a 64 x D x block_kv wgmma.
            acc = acc + pl.run_scoped(pv, plgpu.ACC((bq, d), jnp.float32))
            return acc, m_new, l_new

        def skip(carry):
            # Every key of this block lies past this warpgroup's diagonal. Keep the barrier
            # bookkeeping identical to compute(): wait on K and V, same rendezvous count.
            plgpu.barrier_wait(k_bar)
            if pp:
                sched()
                sched()
            plgpu.barrier_wait(v_bar)
            return carry

        if causal:
            wholly_hidden = k0 > row0 + bq - 1 + offset
            return lax.cond(wholly_hidden, skip, compute, (acc, m_i, l_i))
        return compute((acc, m_i, l_i))

    def consumer(run_pipeline):
        row0 = cta_row0 + wg * bq
        plgpu.copy_gmem_to_smem(q_ref.at[b, pl.ds(row0, bq), h], q_smem.at[wg], q_bar.at[wg])
        plgpu.barrier_wait(q_bar.at[wg])
        carry = (plgpu.layout_cast(jnp.zeros((bq, d), jnp.float32), plgpu.Layout.WGMMA),
                 plgpu.layout_cast(jnp.full((bq,), -jnp.inf, jnp.float32), plgpu.Layout.WGMMA.reduce(1)),
                 plgpu.layout_cast(jnp.zeros((bq,), jnp.float32), plgpu.Layout.WGMMA.reduce(1)))
        if cfg.pingpong:
            pl.when(wg == 1)(sched)   # start warpgroup 1 half an iteration behind
        acc, _, l_i = run_pipeline(carry)
        if cfg.pingpong:
            pl.when(wg == 0)(sched)   # balance the rendezvous count
        out = acc / lax.broadcast_in_dim(l_i, acc.shape, [0])
        q_smem[wg] = out.astype(dtype)
        plgpu.commit_smem()
        # TMA store: rows past the end of the (padded) sequence are dropped.
        plgpu.copy_smem_to_gmem(q_smem.at[wg], o_ref.at[b, pl.ds(row0, bq), h])
        plgpu.wait_smem_to_gmem(0)

    pipeline = plgpu.emit_pipeline_warp_specialized(
        step,
        grid=(n_kv,),
        memory_registers=40,
        in_specs=[plgpu.BlockSpec((bkv, d), lambda kb: (kb, 0), transforms=kv_tf,
                                  memory_space=plgpu.SMEM)] * 2,
        wg_axis="wg",
        num_compute_wgs=2,
        max_concurrent_steps=cfg.stages,
        manual_produced_barriers=True,
        compute_context=consumer,
    )
    pipeline(k_ref.at[b, :, kvh, :], v_ref.at[b, :, kvh, :])


# ----------------------------------------------------------------------------- entry points
@C.one_entry("causal", "sm_scale", "config", "interpret")
def flash_attention(q, k, v, *, causal=True, sm_scale=None,
                    config: MosaicFlashConfig | None = None, interpret=False):
    """Attention of q ``[B,T,Hq,D]`` over k, v ``[B,S,Hkv,D]`` on Hopper (bf16/f16, D 64 or 128).

    Assumes validated arguments (``S >= T``, ``Hq % Hkv == 0``, matching dtypes); raises
    ``ValueError`` only for what this tier alone rejects (f32, other head dims). ``causal`` is
    aligned to the end; ``sm_scale`` defaults to ``D ** -0.5``. ``interpret=True`` (or a
    ``plgpu.InterpretGPUParams``) runs under GPU interpret mode.
    """
    C.check_mma_dtype(q, "q", "flash_attention")
    b, t, hq, d = q.shape
    s, hkv = k.shape[1], k.shape[2]
    p = plan(b, t, s, hq, hkv, d, q.dtype, config=config)
    cfg = p.config
    sm_scale = d ** -0.5 if sm_scale is None else float(sm_scale)
    t8, s8 = C.round_up(t, 8), C.round_up(s, 8)
    if t8 != t:
        q = jnp.pad(q, ((0, 0), (0, t8 - t), (0, 0), (0, 0)))
    if s8 != s:
        k = jnp.pad(k, ((0, 0), (0, s8 - s), (0, 0), (0, 0)))
        v = jnp.pad(v, ((0, 0), (0, s8 - s), (0, 0), (0, 0)))
    q_tf = C.swizzled(d, q.dtype)
    kernel = functools.partial(flash_attention_kernel, t=t, s=s, groups=hq // hkv, causal=bool(causal),
                               scale_log2=sm_scale * LOG2E, cfg=cfg)
    call = plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((b, t8, hq, d), q.dtype),
        scratch_types=[plgpu.SMEM((2, cfg.block_q, d), q.dtype, transforms=q_tf),
                       None if cfg.p_in_registers else plgpu.SMEM(
                           (2, cfg.block_q, cfg.block_kv), q.dtype,
                           transforms=C.swizzled(cfg.block_kv, q.dtype)),
                       plgpu.Barrier(num_barriers=2),
                       plgpu.Barrier(num_arrivals=2)],
        grid=p.grid,
        grid_names=("q", "h", "b"),
        num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
        interpret=C.interpret_params(interpret),
    )
    out = call(q, k, v)
    return out[:, :t] if t8 != t else out


def unsupported(q, k, v, *, allow_copies: bool = True, q_offsets=None) -> str | None:
    """Why this tier cannot take these operands (a one-line reason), or None when it can. (Ragged
    T and S cost copies of q, k, v of a few rows, padded to whole 8-row tiles: cheap next to the
    attention, so ``allow_copies`` changes nothing.)"""
    if q_offsets is not None:
        return "the Mosaic GPU flash attention takes no q_offsets (queries placed inside the keys)"
    if jnp.dtype(q.dtype) not in C.MMA_DTYPES:
        return f"q has dtype {q.dtype}; the Mosaic GPU flash attention takes bfloat16 or float16"
    if q.shape[-1] not in HEAD_DIMS:
        return f"head dim {q.shape[-1]}: the Mosaic GPU flash attention supports {HEAD_DIMS}"
    return None


# ----------------------------------------------------------------------------- config and plan
@dataclasses.dataclass(frozen=True)
class MosaicFlashConfig:
    """``block_q`` rows per consumer warpgroup (a CTA holds two), ``block_kv`` keys per step."""

    block_q: int = 64       # wgmma M: a multiple of 64
    block_kv: int = 128
    stages: int = 2         # K/V slots in the TMA ring
    pingpong: bool = True   # stagger the two consumer warpgroups (FA3's inter-warpgroup overlap)
    # FA3 feeds P to the second wgmma from registers. GPU interpret mode's wgmma only takes
    # shared-memory operands, so the tested default stages P through shared memory (one
    # [block_q, block_kv] tile per consumer); True is the register path, which compiles
    # (see the CUDA lowering test) but no CPU run can check.
    p_in_registers: bool = False

    def __post_init__(self):
        if self.block_q % 64 or self.block_kv % 64:
            raise ValueError(f"block_q={self.block_q} and block_kv={self.block_kv} must be multiples of 64")
        if self.stages < 1:
            raise ValueError(f"stages={self.stages} must be >= 1")


DEFAULT_CONFIGS = {  # by head dim; SMEM: 2 Q tiles + stages x (K + V) blocks
    64: MosaicFlashConfig(block_q=64, block_kv=128, stages=3),    # 16 + 3*32 = 112 KiB
    128: MosaicFlashConfig(block_q=64, block_kv=128, stages=2),   # 32 + 2*64 = 160 KiB
}


@dataclasses.dataclass(frozen=True)
class FlashPlan:
    config: MosaicFlashConfig
    grid: tuple[int, int, int]   # (query tiles, Hq, B)
    num_sms: int

    @property
    def num_ctas(self) -> int:
        return math.prod(self.grid)

    @property
    def waves(self) -> float:
        """CTAs per SM (a CTA uses ~110-160 KiB of shared memory: one resident per SM)."""
        return self.num_ctas / self.num_sms


def plan(b: int, t: int, s: int, hq: int, hkv: int, d: int, dtype=jnp.bfloat16, *,
         num_sms: int | None = None, config: MosaicFlashConfig | None = None) -> FlashPlan:
    """The grid for q ``[b, t, hq, d]`` over k/v ``[b, s, hkv, d]``."""
    del s, hkv, dtype  # the grid does not depend on them; the key loop length is traced
    if d not in HEAD_DIMS:
        raise ValueError(f"head dim D={d}: the Mosaic GPU flash attention supports {HEAD_DIMS}; "
                         "use pallas_kernels.flash_attention for other head dims")
    config = config or DEFAULT_CONFIGS[d]
    return FlashPlan(config=config, grid=(C.cdiv(t, 2 * config.block_q), hq, b),
                     num_sms=num_sms or C.device_num_sms())
