"""Hopper decode attention (flash-decoding) in Mosaic GPU: TMA-fed K/V, wgmma, split over SMs.

Layout and math
---------------
q ``[B, Hq, D]`` (one new token per sequence); k_cache, v_cache ``[B, S_max, Hkv, D]`` in their
stored layout (never transposed or copied); lengths ``[B]`` int32 in ``1..S_max``: key ``j`` of
row ``b`` is visible iff ``j < lengths[b]``. Output ``[B, Hq, D]`` in q's dtype.
``out[b, h] = sum_j softmax_j(sm_scale * q[b, h] . k[b, j, h // G]) v[b, j, h // G]`` with
``G = Hq // Hkv``; f32 scores, running max/sum and accumulator, probabilities cast to the
input dtype for the second matmul (the same numerics as the other tiers).

Grid and why
------------
- A decode step reads each visible K/V byte once and does almost no arithmetic per byte, so
  the kernel is about keeping every SM's TMA queue full.
- Grid ``(splits, Hkv, B)``. A CTA owns one KV head of one sequence, all G query heads that
  share it, and one *chunk* of ``chunk`` cache positions (flash-decoding: the length is split
  across SMs so that even one long sequence fills the GPU; :func:`plan` picks ``splits`` so
  that ``splits * Hkv * B`` covers the SMs, with chunks of at least ``MIN_CHUNK`` keys).
- The G query heads are the rows of the wgmma tile: q is viewed as ``[B, Hkv, G, D]`` (free;
  G is padded to ``Gp``, a multiple of 8, see Edges) and one TMA copy brings the group's rows
  into a 64-row tile; the rows past ``Gp`` fall outside the array and TMA fills them with
  zeros. Each K/V block is loaded once for the whole group.
- Two warpgroups (``plgpu.emit_pipeline_warp_specialized``): a producer that issues TMA copies
  of ``[block_k, D]`` K and V blocks (each with its own barrier) into a ``stages``-deep ring,
  and one consumer that runs ``S = Q K^T`` (wgmma), the online softmax in f32 and
  ``acc += P V`` (wgmma; P goes through a shared-memory tile because GPU interpret mode's
  wgmma takes no register operand). One consumer suffices: per block the arithmetic is tiny
  next to the time the block takes to arrive. Tensor cores on a 64-row tile of which only G
  rows are real waste arithmetic, not bandwidth, and bandwidth is the limit here.
- Work follows each row's real length: the pipeline's length is the traced
  ``cdiv(min(chunk_end, lengths[b]) - chunk_start, block_k)``, so a chunk at or past the end
  of a row loads nothing; only the block holding the row's last key is masked.
- Each CTA writes an unnormalised partial: ``acc`` (its first ``Gp`` rows; the TMA store drops
  the rest), running max ``m`` and sum ``l`` (f32, base-2 logs). A few fused jnp ops combine the splits with the log-sum-exp rule:
  ``M = max_s m_s``, ``w_s = 2^(m_s - M)``, ``out = sum_s w_s acc_s / sum_s w_s l_s``
  (split 0 always holds key 0, so ``M`` is finite; empty splits weigh 0).

Edges
-----
S_max need not be a multiple of ``block_k``: TMA reads zeros past the end of the cache and
those keys are masked by the length. Mosaic GPU views TMA-copied arrays as whole 8-row tiles,
so ``S_max`` must be a multiple of 8 (the cache is never copied: a ``ValueError`` says so) and
q's group axis is padded to a multiple of 8 rows (a copy of q, a few KiB).
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
ROWS = 64            # wgmma M: the query tile holds the G heads of a group, zero-filled to 64
MIN_CHUNK = 256      # never split the cache into chunks shorter than this many keys


# ----------------------------------------------------------------------------- what a CTA does
def attend_block(carry, q_smem, k_smem, v_smem, k_bar, v_bar, p_smem, *, first_key, end, block_k, scale_log2):
    """One pipeline step of the consumer warpgroup: the scores of a K block ``[block_k, D]`` against
    the group's query tile (wgmma), keys from ``end`` on masked (only the block holding the last
    visible key pays for it), the online softmax in f32 and base 2, then ``acc += P V`` (wgmma).
    ``carry``: (acc [ROWS, D], m [ROWS], l [ROWS]) f32. The paged kernel calls it too."""
    acc, m_i, l_i = carry
    d = acc.shape[1]
    plgpu.barrier_wait(k_bar)

    def qk(s_ref):
        plgpu.wgmma(s_ref, q_smem, k_smem.transpose((1, 0)))
        return s_ref[...]
    sc = pl.run_scoped(qk, plgpu.ACC((ROWS, block_k), jnp.float32)) * scale_log2

    def masked(sc):
        keys = first_key + plgpu.broadcasted_iota(jnp.int32, (ROWS, block_k), 1, layout=plgpu.Layout.WGMMA)
        return jnp.where(keys < end, sc, -jnp.inf)
    sc = lax.cond(first_key + block_k > end, masked, lambda sc: sc, sc)

    # A CTA's first block holds its first key (< end), visible to every row: m is finite from then on.
    m_new = jnp.maximum(m_i, sc.max(axis=1))
    alpha = jnp.exp2(m_i - m_new)
    p = jnp.exp2(sc - lax.broadcast_in_dim(m_new, sc.shape, [0]))
    l_new = l_i * alpha + p.sum(axis=1)
    acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
    # P goes through shared memory: GPU interpret mode's wgmma takes no register operand.
    p_smem[...] = p.astype(p_smem.dtype)
    plgpu.commit_smem()
    plgpu.barrier_wait(v_bar)

    def pv(o_ref):
        plgpu.wgmma(o_ref, p_smem, v_smem)
        return o_ref[...]
    return acc + pl.run_scoped(pv, plgpu.ACC((ROWS, d), jnp.float32)), m_new, l_new


def group_consumer(q_src, q_smem, q_bar, o_smem, ml_smem, acc_dst, ml_dst, *, d):
    """The consumer warpgroup's frame around the pipeline: the group's query rows into their tile
    (rows past the group fall outside ``q_src``'s array and TMA fills them with zeros), the empty
    carry, then the CTA's partial (acc, and m and l) out to ``acc_dst`` and ``ml_dst``."""

    def consumer(run_pipeline):
        plgpu.copy_gmem_to_smem(q_src, q_smem, q_bar)
        plgpu.barrier_wait(q_bar)
        carry = (plgpu.layout_cast(jnp.zeros((ROWS, d), jnp.float32), plgpu.Layout.WGMMA),
                 plgpu.layout_cast(jnp.full((ROWS,), -jnp.inf, jnp.float32), plgpu.Layout.WGMMA.reduce(1)),
                 plgpu.layout_cast(jnp.zeros((ROWS,), jnp.float32), plgpu.Layout.WGMMA.reduce(1)))
        acc, m_i, l_i = run_pipeline(carry)
        o_smem[...] = acc
        ml_smem[0] = m_i
        ml_smem[1] = l_i
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, acc_dst)      # rows past the group dropped
        plgpu.copy_smem_to_gmem(ml_smem, ml_dst)
        plgpu.wait_smem_to_gmem(0)

    return consumer


# ----------------------------------------------------------------------------- the kernel
def decode_attention_kernel(lengths_ref, q_ref, k_ref, v_ref, acc_ref, ml_ref, q_smem, p_smem, o_smem,
                   ml_smem, q_bar, *, chunk, block_k, stages, scale_log2):
    # lengths_ref: [B] int32 (GMEM); q_ref: [B, Hkv, Gp, D]; k_ref, v_ref: [B, S_max, Hkv, D];
    # acc_ref: [B, Hkv, splits, Gp, D] f32; ml_ref: [B, Hkv, splits, 2, ROWS] f32 (m, l).
    # q_smem: [ROWS, D]; p_smem: [ROWS, block_k]; o_smem: [ROWS, D] f32; ml_smem: [2, ROWS] f32.
    d = q_ref.shape[-1]
    dtype = q_ref.dtype
    split = lax.axis_index("split")
    h = lax.axis_index("h")
    b = lax.axis_index("b")
    length = lengths_ref[b]
    start = split * chunk
    end = jnp.minimum(start + chunk, length)           # this CTA's keys: [start, end)
    n_blocks = pl.cdiv(jnp.maximum(end - start, 0), block_k)

    def step(idx, k_smem, v_smem, k_bar, v_bar, carry):
        (j,) = idx
        return attend_block(carry, q_smem, k_smem, v_smem, k_bar, v_bar, p_smem, first_key=start + j * block_k,
                            end=end, block_k=block_k, scale_log2=scale_log2)

    consumer = group_consumer(q_ref.at[b, h, pl.ds(0, ROWS)], q_smem, q_bar, o_smem, ml_smem,
                              acc_ref.at[b, h, split, pl.ds(0, ROWS)], ml_ref.at[b, h, split], d=d)
    kv_tf = C.swizzled(d, dtype)
    pipeline = plgpu.emit_pipeline_warp_specialized(
        step,
        grid=(n_blocks,),
        memory_registers=40,
        in_specs=[plgpu.BlockSpec((block_k, d), lambda j: (j, 0), transforms=kv_tf,
                                  memory_space=plgpu.SMEM)] * 2,
        wg_axis="wg",
        num_compute_wgs=1,
        max_concurrent_steps=stages,
        manual_produced_barriers=True,
        compute_context=consumer,
    )
    kv = pl.ds(start, chunk)
    pipeline(k_ref.at[b, kv, h, :], v_ref.at[b, kv, h, :])


# ----------------------------------------------------------------------------- entry points
@C.one_entry("sm_scale", "config", "interpret")
def decode_attention(q, k_cache, v_cache, lengths, *, sm_scale=None,
                     config: MosaicDecodeConfig | None = None, interpret=False):
    """One decode step: q ``[B,Hq,D]`` over caches ``[B,S_max,Hkv,D]`` -> ``[B,Hq,D]`` on Hopper.

    Assumes validated arguments (lengths in 1..S_max, matching dtypes, ``Hq % Hkv == 0``);
    raises ``ValueError`` only for what this tier alone rejects (f32, head dims other than 64
    and 128). A cache length that is not a multiple of 8 is padded in a copy of both caches.
    ``interpret=True`` (or a ``plgpu.InterpretGPUParams``) runs under GPU interpret mode.
    """
    C.check_mma_dtype(q, "q", "decode_attention")
    b, hq, d = q.shape
    s_max, hkv = k_cache.shape[1], k_cache.shape[2]
    if s_max % 8:   # TMA copies whole 8-row tiles: pad the caches (a copy); the lengths mask the padding
        s8 = C.round_up(s_max, 8)
        k_cache, v_cache = (jnp.pad(x, ((0, 0), (0, s8 - s_max), (0, 0), (0, 0))) for x in (k_cache, v_cache))
        s_max = s8
    groups = hq // hkv
    if groups > ROWS:
        raise ValueError(f"q has {groups} query heads per KV head; the Mosaic GPU decode attention "
                         f"holds at most {ROWS} in one tile (use pallas_kernels.decode_attention)")
    p = plan(b, s_max, hq, hkv, d, q.dtype, config=config)
    cfg = p.config
    gp = C.round_up(groups, 8)
    q4 = q.reshape(b, hkv, groups, d)
    if gp != groups:
        q4 = jnp.pad(q4, ((0, 0), (0, 0), (0, gp - groups), (0, 0)))
    sm_scale = d ** -0.5 if sm_scale is None else float(sm_scale)
    kernel = functools.partial(decode_attention_kernel, chunk=p.chunk, block_k=cfg.block_k, stages=cfg.stages,
                               scale_log2=sm_scale * LOG2E)
    acc, ml = plgpu.kernel(
        kernel,
        out_type=(jax.ShapeDtypeStruct((b, hkv, p.splits, gp, d), jnp.float32),
                  jax.ShapeDtypeStruct((b, hkv, p.splits, 2, ROWS), jnp.float32)),
        scratch_types=[plgpu.SMEM((ROWS, d), q.dtype, transforms=C.swizzled(d, q.dtype)),
                       plgpu.SMEM((ROWS, cfg.block_k), q.dtype, transforms=C.swizzled(cfg.block_k, q.dtype)),
                       plgpu.SMEM((ROWS, d), jnp.float32, transforms=C.swizzled(d, jnp.float32)),
                       plgpu.SMEM((2, ROWS), jnp.float32),
                       plgpu.Barrier(num_barriers=1)],
        grid=p.grid,
        grid_names=("split", "h", "b"),
        num_threads=2,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
        interpret=C.interpret_params(interpret),
    )(lengths.astype(jnp.int32), q4, k_cache, v_cache)
    # Combine the splits (log-sum-exp in base 2); rows >= G of the tile are dropped.
    m, l = ml[..., :groups][:, :, :, 0], ml[..., :groups][:, :, :, 1]   # [B, Hkv, splits, G]
    acc = acc[:, :, :, :groups]                                          # [B, Hkv, splits, G, D]
    m_max = jnp.max(m, axis=2, keepdims=True)
    w = jnp.exp2(m - m_max)                                              # 0 for empty splits
    num = jnp.sum(w[..., None] * acc, axis=2)                            # [B, Hkv, G, D]
    den = jnp.sum(w * l, axis=2)                                         # [B, Hkv, G]
    return (num / den[..., None]).reshape(b, hq, d).astype(q.dtype)


def decode_step(q, k_cache, v_cache, lengths, k_new=None, v_new=None, *, sm_scale=None,
                config: MosaicDecodeConfig | None = None, interpret=False):
    """The public decode attention's contract on this tier: with ``k_new``/``v_new`` (this step's
    keys and values, ``[B, Hkv, D]``), write them at ``lengths - 1`` first and return ``(out,
    k_cache, v_cache)``. The kernel does not write them itself yet: an XLA scatter does, in place
    inside a jitted step whose caches are donated (the Triton kernel writes them in the kernel)."""
    if k_new is not None:
        rows, pos = jnp.arange(q.shape[0]), lengths - 1
        k_cache = k_cache.at[rows, pos].set(k_new, mode="promise_in_bounds")
        v_cache = v_cache.at[rows, pos].set(v_new, mode="promise_in_bounds")
    out = decode_attention(q, k_cache, v_cache, lengths, sm_scale=sm_scale, config=config, interpret=interpret)
    return (out, k_cache, v_cache) if k_new is not None else out


def unsupported(q, k_cache, *, allow_copies: bool = True) -> str | None:
    """Why this tier cannot (or, with ``allow_copies=False``, should not) take these operands: a
    one-line reason, or None. A cache whose length is not a multiple of 8 costs a padded copy of
    both caches on every call: where another tier runs without one (mode "pallas"), it should."""
    if jnp.dtype(q.dtype) not in C.MMA_DTYPES:
        return f"q has dtype {q.dtype}; the Mosaic GPU decode attention takes bfloat16 or float16"
    if q.shape[-1] not in HEAD_DIMS:
        return f"head dim {q.shape[-1]}: the Mosaic GPU decode attention supports {HEAD_DIMS}"
    if k_cache.shape[1] % 8 and not allow_copies:
        return (f"S_max={k_cache.shape[1]} is not a multiple of 8: the Mosaic GPU decode attention would copy "
                "the caches to pad them to whole 8-row TMA tiles")
    if q.shape[1] // k_cache.shape[2] > ROWS:
        return f"{q.shape[1] // k_cache.shape[2]} query heads per KV head; the Mosaic GPU tile holds {ROWS}"
    return None


# ----------------------------------------------------------------------------- config and plan
@dataclasses.dataclass(frozen=True)
class MosaicDecodeConfig:
    block_k: int = 64          # keys per pipeline step (a multiple of 64)
    stages: int = 4            # K/V slots in the TMA ring
    splits: int | None = None  # None: plan() chooses
    num_sms: int | None = None

    def __post_init__(self):
        if self.block_k % 64:
            raise ValueError(f"block_k={self.block_k} must be a multiple of 64")
        if self.stages < 1:
            raise ValueError(f"stages={self.stages} must be >= 1")


DEFAULT_CONFIGS = {  # by head dim; SMEM: Q + stages x (K + V) + P + the f32 output tile
    64: MosaicDecodeConfig(block_k=128, stages=4),   # 8 + 4*32 + 16 + 16 = 168 KiB
    128: MosaicDecodeConfig(block_k=64, stages=4),   # 16 + 4*32 + 8 + 32 = 184 KiB
}


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    config: MosaicDecodeConfig   # splits and num_sms resolved
    chunk: int                   # cache positions per split, a multiple of block_k
    grid: tuple[int, int, int]   # (splits, Hkv, B)

    @property
    def splits(self) -> int:
        return self.grid[0]

    @property
    def num_ctas(self) -> int:
        return math.prod(self.grid)


def plan(b: int, s_max: int, hq: int, hkv: int, d: int, dtype=jnp.bfloat16, *,
         num_sms: int | None = None, config: MosaicDecodeConfig | None = None) -> DecodePlan:
    """Grid and chunking for B rows of an ``S_max``-slot cache with Hkv KV heads."""
    del hq, dtype
    if d not in HEAD_DIMS:
        raise ValueError(f"head dim D={d}: the Mosaic GPU decode attention supports {HEAD_DIMS}; "
                         "use pallas_kernels.decode_attention for other head dims")
    config = config or DEFAULT_CONFIGS[d]
    num_sms = num_sms or config.num_sms or C.device_num_sms()
    if config.splits is not None:
        splits = config.splits
    else:  # enough CTAs for every SM, never chunks shorter than MIN_CHUNK keys
        splits = max(1, min(C.cdiv(num_sms, b * hkv), C.cdiv(s_max, MIN_CHUNK)))
    chunk = C.round_up(C.cdiv(s_max, splits), config.block_k)
    splits = C.cdiv(s_max, chunk)                    # no split that starts past S_max
    config = dataclasses.replace(config, splits=splits, num_sms=num_sms)
    return DecodePlan(config=config, chunk=chunk, grid=(splits, hkv, b))
