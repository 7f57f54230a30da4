"""Paged decode attention as a Pallas kernel: one new query token per sequence, its keys and values
read through a block table (vLLM's PagedAttention).

Layout: q ``[B, Hq, D]``; k_pages, v_pages ``[N, block_size, Hkv, D]``, a pool of ``N`` blocks of
``block_size`` positions shared by every sequence; block_tables ``[B, P]`` int32: position ``j``
of row ``b`` lives at ``k_pages[block_tables[b, j // block_size], j % block_size]``; lengths
``[B]`` int32 in 1..P * block_size: key ``j`` is visible iff ``j < lengths[b]``. Output ``[B, Hq, D]``.

It is :mod:`pallas_kernels.triton.decode_attention` with one more indirection. A program still owns
one KV head of one sequence and the G query heads that share it, and still runs the online softmax
over its share of the keys; it walks its sequence's *pages* (logical blocks) instead of a
contiguous row, and for each page first reads the physical block's number from the table (one
int32), then loads that block's ``[block_size, D]`` keys and values. So a sequence's cache need
not be contiguous, or even in order, and two sequences can share the blocks of a common prefix.

Grid ``(splits, Hkv, B)``: the pages are split into ``num_splits`` runs of ``pages_per_split``
(flash-decoding, so that one long sequence still fills the GPU), each program's partial merged by
:func:`online_softmax.combine` as in decode attention. Work follows each row's length: a program
visits only the pages that hold keys of its row (``cdiv(length, block_size)``), full ones
unmasked, the last one masked; a program whose run starts past the row's end loads nothing.

Blocks are powers of two of at least 16 positions (Triton's smallest dot; the serving engine's
prompt piece is 16 tokens). This kernel does not write the step's new K/V: the serving step
scatters every new K/V of an iteration into the pool in one go before any attention reads it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels import checks, device, reference
from pallas_kernels.mode import choose_tier
from pallas_kernels.triton import common, online_softmax
from pallas_kernels.triton.common import cdiv, pow2_block
from pallas_kernels.triton.decode_attention import LOG2E, MIN_SPLIT_KEYS, PROGRAMS_PER_SM

MIN_BLOCK_SIZE = 16      # Triton's dot needs 16 keys a block


# ----------------------------------------------------------------------------- the kernel
def paged_decode_attention_kernel(lengths_ref, tables_ref, q_ref, k_ref, v_ref, *outs, groups, group_rows,
                                  pages_per_split, block_size, scale_log2):
    # lengths_ref [B], tables_ref [B, P] int32, q_ref [B, Hq, D], k_ref, v_ref [N, block_size, Hkv, D];
    # one split: o_ref [B, Hq, D];  several: acc_ref [B, splits, Hq, D], m_ref, l_ref [B, splits, Hq] f32.
    d = q_ref.shape[-1]
    split, h, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    length = lengths_ref[b]
    first = split * pages_per_split
    end = jnp.minimum(first + pages_per_split, pl.cdiv(length, block_size))   # this program's pages: [first, end)
    n_total = jnp.maximum(end - first, 0)
    n_full = jnp.maximum(jnp.minimum(end, length // block_size) - first, 0)  # pages every key of which is visible

    row_ok = jnp.arange(group_rows) < groups           # real query heads of the group
    q = common.masked_load(q_ref.at[b, pl.ds(h * groups, group_rows), :],
                            common.block_mask(row_ok, None, (group_rows, d)))  # [group_rows, D]

    def step(j, carry, masked):
        page = first + j
        block = tables_ref[b, page]                                 # where this page lives in the pool
        k_ok = (page * block_size + jnp.arange(block_size)) < length if masked else None
        kv_mask = common.block_mask(k_ok, None, (block_size, d))
        k = common.masked_load(k_ref.at[block, pl.ds(0, block_size), h, :], kv_mask)   # [block_size, D]
        v = common.masked_load(v_ref.at[block, pl.ds(0, block_size), h, :], kv_mask)   # [block_size, D]
        sc = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST,
                             preferred_element_type=jnp.float32) * scale_log2   # [group_rows, block_size]
        if masked:
            sc = jnp.where(k_ok[None, :], sc, -jnp.inf)
        # The first page holds key `first * block_size` (< length), visible to every row: m is finite.
        return online_softmax.update(carry, sc, v)

    carry = online_softmax.start(group_rows, d)
    carry = lax.fori_loop(0, n_full, functools.partial(step, masked=False), carry)
    carry = lax.fori_loop(n_full, n_total, functools.partial(step, masked=True), carry)
    online_softmax.finish(outs, carry, b=b, split=split, heads=pl.ds(h * groups, group_rows), row_ok=row_ok)


# ----------------------------------------------------------------------------- launcher and entry points
def launch(q, k_pages, v_pages, block_tables, lengths, *, sm_scale, interpret: bool,
           config: PagedDecodeAttentionConfig | None = None):
    """Run :func:`paged_decode_attention_kernel` on checked operands over the plan's grid (splits,
    Hkv, B), then (with several splits) combine their partial results."""
    b, hq, d = q.shape
    block_size, hkv = k_pages.shape[1], k_pages.shape[2]
    p = plan(b, block_tables.shape[1], block_size, hkv, config=config)
    c = p.config
    groups = hq // hkv
    kernel = functools.partial(paged_decode_attention_kernel, groups=groups, group_rows=pow2_block(groups, 1 << 30),
                               pages_per_split=p.pages_per_split, block_size=block_size,
                               scale_log2=sm_scale * LOG2E)
    out_shape = tuple(online_softmax.split_outputs(b, p.num_splits, hq, d, q.dtype))
    outs = common.call(kernel, out_shape=out_shape, grid=p.grid, args=(lengths, block_tables, q, k_pages, v_pages),
                        interpret=interpret, num_warps=c.num_warps, num_stages=c.num_stages,
                        name="paged_decode_attention")
    return outs[0] if p.num_splits == 1 else online_softmax.combine(*outs, q.dtype)


def paged_decode_attention(q, k_pages, v_pages, block_tables, lengths, *, sm_scale=None, mode: str = "auto",
                           config: PagedDecodeAttentionConfig | None = None):
    """One decode step of attention through block tables: q ``[B, Hq, D]`` over the pool
    ``k_pages``, ``v_pages`` ``[N, block_size, Hkv, D]``, row ``b``'s position ``j`` in block
    ``block_tables[b, j // block_size]`` (``[B, P]`` int32), its first ``lengths[b]`` keys visible
    -> ``[B, Hq, D]``. ``sm_scale`` defaults to ``D ** -0.5``. ``mode``: see :mod:`pallas_kernels.mode`
    (the Hopper tier: ``mosaic.paged_decode_attention``, bf16/f16, head dims 64 and 128). ``config``: a
    :class:`PagedDecodeAttentionConfig` (Triton tier) or ``MosaicPagedDecodeConfig`` (Hopper tier)
    instead of the one the tier's plan picks.

    Checked where: shapes and dtypes always; table entries and lengths on the host in an eager
    call. Inside ``jit`` a row whose length is outside 1..P * block_size comes out zeros (never NaN)."""
    q, k_pages, v_pages, block_tables, lengths, sm_scale = check(q, k_pages, v_pages, block_tables, lengths, sm_scale)
    lengths, ok = checks.lengths_inside_jit(lengths, block_tables.shape[1] * k_pages.shape[1])
    return checks.zero_bad_rows(_paged_decode_attention(q, k_pages, v_pages, block_tables, lengths, sm_scale, mode,
                                                        config), ok)


def _paged_decode_attention(q, k_pages, v_pages, block_tables, lengths, sm_scale, mode, config):
    """:func:`paged_decode_attention` on checked operands: the tier the mode and the shapes choose."""
    tier = choose_tier(mode, config, triton_config=PagedDecodeAttentionConfig,
                       mosaic=("paged_decode_attention", "MosaicPagedDecodeConfig"),
                       mosaic_problem=lambda mosaic, copies: mosaic.unsupported(q, k_pages, allow_copies=copies))
    if tier.name == "reference":
        return reference.paged_decode_attention(q, k_pages, v_pages, block_tables, lengths, sm_scale=sm_scale)
    if tier.name == "mosaic":
        return tier.module.paged_decode_attention(q, k_pages, v_pages, block_tables, lengths, sm_scale=sm_scale,
                                                  config=config, interpret=tier.interpret)
    return launch(q, k_pages, v_pages, block_tables, lengths, sm_scale=sm_scale, interpret=tier.interpret,
                  config=config)


def pallas_paged_decode_attention(q, k_pages, v_pages, block_tables, lengths, *, sm_scale=None,
                                  config: PagedDecodeAttentionConfig | None = None, interpret: bool = False):
    """The Pallas kernel itself, without the mode decision (compiled, or under the interpreter):
    what :func:`paged_decode_attention` runs in modes "pallas" and "interpret"."""
    q, k_pages, v_pages, block_tables, lengths, sm_scale = check(q, k_pages, v_pages, block_tables, lengths, sm_scale)
    return launch(q, k_pages, v_pages, block_tables, lengths, sm_scale=sm_scale, interpret=interpret,
                  config=checks.check_config(config, PagedDecodeAttentionConfig))


def check(q, k_pages, v_pages, block_tables, lengths, sm_scale):
    """The operands as arrays after every check (one-line errors; table and length values when concrete)."""
    q, k_pages, v_pages, sm_scale = checks.attention_operands(
        q, k_pages, v_pages, q_rank=3, q_layout="[B, Hq, D]", k_name="k_pages", v_name="v_pages",
        kv_layout="[N, block_size, Hkv, D]", sm_scale=sm_scale, same_batch=False)
    b = q.shape[0]
    n_blocks, block_size = k_pages.shape[:2]
    if block_size < MIN_BLOCK_SIZE or block_size & (block_size - 1):
        raise ValueError(f"k_pages has blocks of {block_size} positions; use a power of two >= {MIN_BLOCK_SIZE} "
                         "(Triton's dot needs 16 keys a block)")
    block_tables = checks.as_array(block_tables, "block_tables")
    if block_tables.ndim != 2 or block_tables.shape[0] != b or not jnp.issubdtype(block_tables.dtype, jnp.integer):
        raise ValueError(f"block_tables has shape {tuple(block_tables.shape)} and dtype {block_tables.dtype}; it "
                         f"must be [B, pages] = ({b}, P) int32, one row of block numbers per sequence")
    lengths = checks.as_array(lengths, "lengths")
    if lengths.shape != (b,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(f"lengths has shape {tuple(lengths.shape)} and dtype {lengths.dtype}; it must be [B] = "
                         f"({b},) int32, one length per row")
    most = block_tables.shape[1] * block_size
    if checks.is_concrete(lengths):
        lo, hi = checks.value_range(lengths)
        if lo < 1 or hi > most:
            raise ValueError(f"lengths must lie in 1..pages * block_size = {most}; got values from {lo} to {hi}")
    if checks.is_concrete(block_tables) and block_tables.size:
        lo, hi = checks.value_range(block_tables)
        if lo < 0 or hi >= n_blocks:
            raise ValueError(f"block_tables holds block numbers from {lo} to {hi}; the pool has blocks 0..{n_blocks - 1}")
    return q, k_pages, v_pages, block_tables.astype(jnp.int32), lengths.astype(jnp.int32), sm_scale


# ----------------------------------------------------------------------------- config and plan
@dataclasses.dataclass(frozen=True)
class PagedDecodeAttentionConfig:
    """How many splits of a row's pages, warps, stages (a program loads one block at a time)."""

    num_splits: int = 1
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        checks.check_triton_config(self, ())
        if isinstance(self.num_splits, bool) or not isinstance(self.num_splits, int) or self.num_splits < 1:
            raise ValueError(f"PagedDecodeAttentionConfig.num_splits={self.num_splits!r} must be a positive integer")


@dataclasses.dataclass(frozen=True)
class PagedDecodeAttentionPlan:
    """What the kernel launches for one shape: config, pages per split, grid (splits, Hkv, B)."""

    config: PagedDecodeAttentionConfig
    pages_per_split: int
    grid: tuple

    @property
    def num_splits(self) -> int:
        return self.grid[0]

    @property
    def programs(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


def plan(batch: int, pages: int, block_size: int, hkv: int, *, num_sms: int | None = None,
         config: PagedDecodeAttentionConfig | None = None) -> PagedDecodeAttentionPlan:
    """The config and grid for ``batch`` rows of ``pages`` table entries of ``block_size`` positions
    and ``hkv`` KV heads: the pages split as decode attention splits its cache (about
    ``PROGRAMS_PER_SM`` programs per SM, no run shorter than ``MIN_SPLIT_KEYS`` keys)."""
    if config is None:
        splits = cdiv(PROGRAMS_PER_SM * device.num_sms(num_sms), batch * hkv)
        splits = max(1, min(splits, cdiv(pages * block_size, MIN_SPLIT_KEYS)))
        config = PagedDecodeAttentionConfig(splits, 4, 2)
    checks.check_config(config, PagedDecodeAttentionConfig)
    per_split = cdiv(pages, config.num_splits)
    return PagedDecodeAttentionPlan(config, per_split, (cdiv(pages, per_split), hkv, batch))
