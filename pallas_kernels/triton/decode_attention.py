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
- This step's new K/V (``k_new``, ``v_new``) can be handed to the kernel instead of being
  scattered into the cache first: split 0 folds the new key and value into its online softmax
  straight from registers (so its running max is finite from the start) and stores them at
  position ``lengths[b] - 1`` of the caches, which are aliased input to output
  (``input_output_aliases``) and so updated in place. Every program then reads only cached
  positions ``< lengths[b] - 1``: nothing reads the row being written, so nothing races.
- With one split the kernel normalises and writes the output itself; with several it writes
  partials and the combine below merges them.
- Work follows each row's real length: the loop bound is
  ``cdiv(min(chunk_end, cached) - chunk_start, block_k)`` (``cached`` = ``lengths[b]``, or
  ``lengths[b] - 1`` when the new key comes in registers), so a program whose chunk
  starts at or past ``lengths[b]`` loads no K/V at all (it writes ``m = -inf, l = 0``, which
  the combine weighs by 0). Full blocks run unmasked; only the block holding the row's last
  key is masked.
- ``block_k`` and warps by head dim, and the number of splits by how many (sequence, KV
  head) pairs there are against the SM count: :func:`plan`. All blocks are powers of two.
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

from pallas_kernels import checks, device, reference
from pallas_kernels.mode import choose_tier
from pallas_kernels.triton import common, online_softmax
from pallas_kernels.triton.common import cdiv, pow2_block

LOG2E = math.log2(math.e)
PROGRAMS_PER_SM = 8      # decode attention is bandwidth-bound: keep many loads in flight per SM
MIN_SPLIT_KEYS = 128     # never split the cache into chunks shorter than this


# ----------------------------------------------------------------------------- the kernel
def decode_attention_kernel(*refs, groups, group_rows, chunk, block_k, scale_log2, fused, int8_cache=False):
    # The refs, in order (inputs, then outputs):
    #   lengths_ref [B] int32, q_ref [B, Hq, D], k_ref, v_ref [B, S_max, Hkv, D],
    #   int8 cache only: ks_ref, vs_ref [B, S_max, Hkv] f32 (each cached vector's scale),
    #   fused only: knew_ref, vnew_ref [B, Hkv, D] (this step's K/V),
    #   one split: o_ref [B, Hq, D];  several: acc_ref [B, splits, Hq, D], m_ref, l_ref [B, splits, Hq] f32,
    #   fused only: k_out_ref, v_out_ref [B, S_max, Hkv, D] (the same buffers as k_ref, v_ref: aliased).
    lengths_ref, q_ref, k_ref, v_ref = refs[:4]
    rest = list(refs[4:])
    knew_ref = vnew_ref = k_out_ref = v_out_ref = ks_ref = vs_ref = None
    if int8_cache:
        ks_ref, vs_ref = rest[:2]
        rest = rest[2:]
    if fused:
        knew_ref, vnew_ref = rest[:2]
        k_out_ref, v_out_ref = rest[-2:]
        rest = rest[2:-2]
    outs = rest
    d = q_ref.shape[-1]
    split = pl.program_id(0)
    h = pl.program_id(1)
    b = pl.program_id(2)
    length = lengths_ref[b]
    cached = length - 1 if fused else length          # keys read from the cache: [0, cached)
    start = split * chunk
    end = jnp.minimum(start + chunk, cached)          # this program's keys: [start, end)
    n_keys = jnp.maximum(end - start, 0)
    n_full = n_keys // block_k                         # blocks with every key visible
    n_total = pl.cdiv(n_keys, block_k)                 # 0 when the chunk is past the row's end

    row_ok = jnp.arange(group_rows) < groups           # real query heads of the group
    q = common.masked_load(q_ref.at[b, pl.ds(h * groups, group_rows), :],
                            common.block_mask(row_ok, None, (group_rows, d)))  # [group_rows, D]

    def step(j, carry, masked):
        k0 = start + j * block_k
        k_ok = (k0 + jnp.arange(block_k)) < end if masked else None
        kv_mask = common.block_mask(k_ok, None, (block_k, d))
        k = common.masked_load(k_ref.at[b, pl.ds(k0, block_k), h, :], kv_mask)   # [block_k, D]
        v = common.masked_load(v_ref.at[b, pl.ds(k0, block_k), h, :], kv_mask)   # [block_k, D]
        v_scales = None
        if int8_cache:   # widen in registers (exact: int8 fits q's dtype); scales apply after the dots
            k, v = k.astype(q.dtype), v.astype(q.dtype)
            k_scales = common.masked_load(ks_ref.at[b, pl.ds(k0, block_k), h], k_ok)        # [block_k]
            v_scales = common.masked_load(vs_ref.at[b, pl.ds(k0, block_k), h], k_ok)
        sc = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST,
                             preferred_element_type=jnp.float32) * scale_log2  # [group_rows, block_k]
        if int8_cache:
            sc = sc * k_scales[None, :]
        if masked:
            sc = jnp.where(k_ok[None, :], sc, -jnp.inf)
        # The first block holds key `start` (< end), visible to every row: m becomes finite.
        return online_softmax.update(carry, sc, v, v_scales)

    carry = online_softmax.start(group_rows, d)
    if fused:
        # This step's K/V come in registers: split 0 folds them in first (one key every row sees,
        # so m is finite from the start) and writes them to position length - 1 of the caches.
        # No program reads that position from memory, so the write races with nothing.
        first = split == 0
        k_new = plgpu.load(knew_ref.at[b, pl.ds(h, 1), :])                   # [1, D]
        v_new = plgpu.load(vnew_ref.at[b, pl.ds(h, 1), :])                   # [1, D]
        s_new = jnp.sum(q.astype(jnp.float32) * k_new.astype(jnp.float32), axis=1) * scale_log2
        in_rows, in_tile = jnp.full((group_rows,), first), jnp.full((group_rows, d), first)
        carry = (jnp.where(in_tile, jnp.broadcast_to(v_new.astype(jnp.float32), (group_rows, d)),
                           jnp.zeros((group_rows, d), jnp.float32)),
                 jnp.where(in_rows, s_new, jnp.full_like(s_new, -jnp.inf)),
                 jnp.where(in_rows, jnp.ones_like(s_new), jnp.zeros_like(s_new)))
        # Inside jit the lengths are not checked: never write outside the row for a bad one.
        only_first = jnp.full((1, d), first & (length >= 1) & (length <= k_out_ref.shape[1]))
        plgpu.store(k_out_ref.at[b, pl.ds(length - 1, 1), h, :], k_new, mask=only_first)
        plgpu.store(v_out_ref.at[b, pl.ds(length - 1, 1), h, :], v_new, mask=only_first)
    carry = lax.fori_loop(0, n_full, functools.partial(step, masked=False), carry)
    carry = lax.fori_loop(n_full, n_total, functools.partial(step, masked=True), carry)
    # one split: normalise here, no combine afterwards; several: this split's partial
    online_softmax.finish(outs, carry, b=b, split=split, heads=pl.ds(h * groups, group_rows), row_ok=row_ok)


# ----------------------------------------------------------------------------- launcher and entry points
def launch(q, k_cache, v_cache, lengths, k_new=None, v_new=None, *, sm_scale, interpret: bool,
           config: DecodeAttentionConfig | None = None, k_scales=None, v_scales=None):
    """Run :func:`decode_attention_kernel` on checked operands over the plan's grid (splits, Hkv,
    B), then (with several splits) combine their partial results. ``k_scales``/``v_scales``: an
    int8 cache's scales (never with ``k_new``: :func:`check` refuses it)."""
    b, hq, d = q.shape
    s_max, hkv = k_cache.shape[1], k_cache.shape[2]
    p = plan(b, s_max, hkv, d, config=config)
    c = p.config
    splits = p.num_splits
    fused = k_new is not None
    groups = hq // hkv
    kernel = functools.partial(decode_attention_kernel, groups=groups, group_rows=pow2_block(groups, 1 << 30),
                               chunk=p.chunk, block_k=c.block_k, scale_log2=sm_scale * LOG2E,
                               fused=fused, int8_cache=k_scales is not None)
    out_shape = online_softmax.split_outputs(b, splits, hq, d, q.dtype)
    args = [lengths, q, k_cache, v_cache] + ([k_scales, v_scales] if k_scales is not None else [])
    aliases = {}
    if fused:  # the caches come back as outputs, updated in place (their buffers are reused)
        args += [k_new, v_new]
        aliases = {2: len(out_shape), 3: len(out_shape) + 1}
        out_shape += [jax.ShapeDtypeStruct(k_cache.shape, k_cache.dtype),
                      jax.ShapeDtypeStruct(v_cache.shape, v_cache.dtype)]
    outs = common.call(kernel, out_shape=tuple(out_shape), grid=p.grid, args=tuple(args), interpret=interpret,
                        num_warps=c.num_warps, num_stages=c.num_stages, name="decode_attention",
                        input_output_aliases=aliases)
    # one split: normalised already; several: merged (log-sum-exp)
    out = outs[0] if splits == 1 else online_softmax.combine(*outs[:3], q.dtype)
    return (out, outs[-2], outs[-1]) if fused else out


def decode_attention(q, k_cache, v_cache, lengths, *, k_new=None, v_new=None, sm_scale=None,
                     mode: str = "auto", config: DecodeAttentionConfig | None = None, k_scales=None, v_scales=None):
    """One decode step of attention: q ``[B,Hq,D]`` over caches ``[B,S_max,Hkv,D]`` -> ``[B,Hq,D]``.

    Row ``b`` attends to its first ``lengths[b]`` cached keys (1..S_max). With ``k_new``,
    ``v_new`` ``[B, Hkv, D]`` (this step's keys and values), they are first written to
    position ``lengths[b] - 1`` of the caches, in place, and the call returns
    ``(out, k_cache, v_cache)``: use the returned caches (inside ``jit`` with the caches
    donated, no copy is made). ``sm_scale`` defaults to ``D ** -0.5``. ``mode``: see
    :mod:`pallas_kernels.mode`. ``config``: a :class:`DecodeAttentionConfig` (Triton tier) or
    ``mosaic.decode_attention.MosaicDecodeConfig`` (Hopper tier) instead of the one the tier's
    ``plan`` picks.

    An int8 cache (``pallas_kernels.quantization.quantize_kv``): int8 ``k_cache``/``v_cache`` with
    ``k_scales``/``v_scales`` float32 ``[B, S_max, Hkv]`` (one per cached vector), widened in
    registers; write this step's K/V into it first (there is no ``k_new`` for an int8 cache). It
    runs on the Triton tier (``"pallas"`` on a Hopper GPU too; the Mosaic modes refuse it).

    Checked where: shapes and dtypes always (at trace time inside ``jit``); the values of
    ``lengths`` on the host in an eager call (one-line errors). Inside ``jit`` they cannot be read:
    a row whose length is outside 1..S_max comes out zeros (no keys to attend to, never NaN), and
    its ``k_new`` lands inside its own cache row; no other row is touched.
    """
    q, k_cache, v_cache, lengths, sm_scale, k_new, v_new = check(q, k_cache, v_cache, lengths, sm_scale,
                                                                 k_new, v_new, k_scales, v_scales)
    lengths, ok = checks.lengths_inside_jit(lengths, k_cache.shape[1])
    result = _decode_attention(q, k_cache, v_cache, lengths, k_new, v_new, sm_scale, mode, config, k_scales, v_scales)
    if k_new is None:
        return checks.zero_bad_rows(result, ok)
    out, k_cache, v_cache = result
    return checks.zero_bad_rows(out, ok), k_cache, v_cache


def _decode_attention(q, k_cache, v_cache, lengths, k_new, v_new, sm_scale, mode, config, k_scales, v_scales):
    """:func:`decode_attention` on checked operands: the tier the mode and the shapes choose."""
    int8_cache = k_scales is not None

    def mosaic_problem(mosaic, copies):
        if int8_cache:
            return "an int8 KV cache runs on the Triton tier only"
        return mosaic.unsupported(q, k_cache, allow_copies=copies)

    tier = choose_tier(mode, config, triton_config=DecodeAttentionConfig,
                       mosaic=("decode_attention", "MosaicDecodeConfig"), mosaic_problem=mosaic_problem)
    if tier.name == "reference":
        return reference.decode_attention(q, k_cache, v_cache, lengths, k_new=k_new, v_new=v_new, sm_scale=sm_scale,
                                          k_scales=k_scales, v_scales=v_scales)
    if tier.name == "mosaic":
        return tier.module.decode_step(q, k_cache, v_cache, lengths, k_new, v_new, sm_scale=sm_scale, config=config,
                                       interpret=tier.interpret)
    return launch(q, k_cache, v_cache, lengths, k_new, v_new, sm_scale=sm_scale, interpret=tier.interpret,
                  config=config, k_scales=k_scales, v_scales=v_scales)


def pallas_decode_attention(q, k_cache, v_cache, lengths, *, k_new=None, v_new=None, sm_scale=None,
                            config: DecodeAttentionConfig | None = None, interpret: bool = False,
                            k_scales=None, v_scales=None):
    """The Pallas kernel itself, without the mode decision (compiled, or under the
    interpreter): what :func:`decode_attention` runs in modes "pallas" and "interpret"."""
    q, k_cache, v_cache, lengths, sm_scale, k_new, v_new = check(q, k_cache, v_cache, lengths, sm_scale,
                                                                 k_new, v_new, k_scales, v_scales)
    return launch(q, k_cache, v_cache, lengths, k_new, v_new, sm_scale=sm_scale, interpret=interpret,
                  config=checks.check_config(config, DecodeAttentionConfig), k_scales=k_scales, v_scales=v_scales)


def check(q, k_cache, v_cache, lengths, sm_scale, k_new=None, v_new=None, k_scales=None, v_scales=None):
    """The operands as arrays after every check (one-line errors; ``lengths`` values when concrete)."""
    int8_cache = checks.kv_scales(k_cache, v_cache, k_scales, v_scales)
    if int8_cache and k_new is not None:
        raise ValueError("k_new with an int8 cache: write this step's K/V into the cache first (as "
                         "inference_lab.model.kv_cache.write_rows does) and pass lengths + 1 without k_new")
    q, k_cache, v_cache, sm_scale = checks.attention_operands(
        q, k_cache, v_cache, q_rank=3, q_layout="[B, Hq, D]", k_name="k_cache", v_name="v_cache",
        kv_layout="[B, S_max, Hkv, D]", sm_scale=sm_scale, int8_cache=int8_cache)
    b, s_max = q.shape[0], k_cache.shape[1]
    lengths = checks.as_array(lengths, "lengths")
    if lengths.shape != (b,):
        raise ValueError(f"lengths has shape {tuple(lengths.shape)}; it must be [B] = ({b},), one length per row")
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(f"lengths has dtype {lengths.dtype}; use int32 (lengths.astype(jnp.int32))")
    if checks.is_concrete(lengths):
        lo, hi = checks.value_range(lengths)
        if lo < 1 or hi > s_max:
            raise ValueError(f"lengths must lie in 1..S_max={s_max}; got values from {lo} to {hi} "
                             "(every row needs at least one cached key and at most the cache size)")
    if (k_new is None) != (v_new is None):
        raise ValueError("pass k_new and v_new together (this step's keys and values), or neither")
    if k_new is not None:
        want = (b, k_cache.shape[2], k_cache.shape[3])
        k_new, v_new = checks.as_array(k_new, "k_new"), checks.as_array(v_new, "v_new")
        for x, name in ((k_new, "k_new"), (v_new, "v_new")):
            if x.shape != want:
                raise ValueError(f"{name} has shape {tuple(x.shape)}; it must be [B, Hkv, D] = {want}")
            checks.check_same_dtype(k_cache, x, "k_cache", name)
    return q, k_cache, v_cache, lengths.astype(jnp.int32), sm_scale, k_new, v_new



# ----------------------------------------------------------------------------- config and plan
@dataclasses.dataclass(frozen=True)
class DecodeAttentionConfig:
    """Keys per block (a power of two >= 16), how many splits of the cache length, warps, stages."""

    block_k: int
    num_splits: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        checks.check_triton_config(self, ("block_k",))
        if isinstance(self.num_splits, bool) or not isinstance(self.num_splits, int) or self.num_splits < 1:
            raise ValueError(f"DecodeAttentionConfig.num_splits={self.num_splits!r} must be a positive integer")


@dataclasses.dataclass(frozen=True)
class DecodeAttentionPlan:
    """What the kernel launches for one shape: config, keys per split, grid (splits, Hkv, B)."""

    config: DecodeAttentionConfig
    chunk: int        # cache positions per split, a multiple of block_k
    grid: tuple

    @property
    def num_splits(self) -> int:
        return self.grid[0]

    @property
    def programs(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


# Blocks by head dim: (block_k, num_warps, num_stages). Tune here.
_TILES = {
    16: (128, 4, 3),
    32: (128, 4, 3),
    64: (128, 4, 3),
    128: (64, 4, 3),
    256: (32, 4, 2),
}


def plan(batch: int, s_max: int, hkv: int, d: int, *, num_sms: int | None = None,
         config: DecodeAttentionConfig | None = None) -> DecodeAttentionPlan:
    """The config and grid :func:`decode_attention` uses for ``batch`` rows of an ``s_max``
    cache with ``hkv`` KV heads of dim ``d``. The cache length is split until there are about
    ``PROGRAMS_PER_SM`` programs per SM (``num_sms``: None reads the device, or assumes an
    H200), never into chunks shorter than ``MIN_SPLIT_KEYS``; ``config`` overrides the choice."""
    if config is None:
        if d not in _TILES:
            raise ValueError(f"d={d!r}: the kernels support head dims {tuple(_TILES)}")
        bk, warps, stages = _TILES[d]
        bk = pow2_block(s_max, bk)
        splits = cdiv(PROGRAMS_PER_SM * device.num_sms(num_sms), batch * hkv)
        splits = max(1, min(splits, cdiv(s_max, MIN_SPLIT_KEYS)))
        config = DecodeAttentionConfig(bk, splits, warps, stages)
    checks.check_config(config, DecodeAttentionConfig)
    chunk = cdiv(cdiv(s_max, config.num_splits), config.block_k) * config.block_k   # a multiple of block_k
    return DecodeAttentionPlan(config, chunk, (cdiv(s_max, chunk), hkv, batch))   # no split starts past S_max
