"""Ragged paged attention as a Pallas kernel: one serving iteration's query tokens, of every request
at once, attending to their requests' keys and values in place in a paged pool (vLLM v1's step).

Layout: q ``[T, Hq, D]``, the iteration's tokens request by request: request ``i`` owns tokens
``query_start[i] .. query_start[i + 1] - 1`` (``query_start`` ``[R + 1]`` int32, non-decreasing; its
``n_i`` tokens are a prompt chunk of any length, one decode token, or a token and its speculative
guesses; tokens past ``query_start[R]`` pad a compiled shape and are answered with zeros).
``context_lens`` ``[R]``: the positions request ``i`` holds *after* this iteration (its new K/V are in
the pool already), so its query ``j`` sits at position ``context_lens[i] - n_i + j`` and sees every
key at or before it (causal). k_pages, v_pages ``[N, block_size, Hkv, D]``: the pool;
block_tables ``[R, P]`` int32: request ``i``'s position ``p`` lives at
``k_pages[block_tables[i, p // block_size], p % block_size]``. Output ``[T, Hq, D]``.

A prompt chunk and a decode token are the same thing here, a run of queries at the end of a
request's context, so one kernel serves both, and nothing is copied: each program reads the
blocks of its request through the table, as paged decode attention does.

Rows, grid and why
------------------
- The ``G = Hq / Hkv`` query heads that share a KV head, and ``block_q`` consecutive tokens of one
  request, are the rows of one program: ``block_q * G`` rows (G padded to a power of two), so a
  decode token's G heads fill rows that a head-per-program layout would leave empty, and every
  key block loaded serves them all. Q is rearranged on the XLA side to ``[Hkv, T * G, D]`` so those
  rows are contiguous (a copy of the iteration's queries: kilobytes), and the output back.
- A request of ``n_i`` tokens is ``ceil(n_i / block_q)`` *query blocks*; the grid is
  ``(query blocks, Hkv)``, sized for the worst case (``ceil(T / block_q) + R``): which request
  and which tokens a query block holds is computed on the XLA side (``reference.query_blocks``), and a
  program past the last real block does nothing.
- A program walks its request's pages from the first to the one holding its last query's
  position: pages every key of which its first row sees unmasked, the rest masked causally per
  row. The online softmax (:mod:`pallas_kernels.triton.online_softmax`) as in the other kernels;
  every row sees key 0, so the first page makes every running maximum finite.

The kernel does not write the iteration's new K/V: the serving step scatters them into the pool in
one in-place scatter before any attention reads it. No Mosaic GPU tier yet: ``"pallas"`` runs this
kernel on the Triton tier on every GPU.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels import checks, reference
from pallas_kernels.mode import choose_tier
from pallas_kernels.triton import common, online_softmax
from pallas_kernels.triton.common import cdiv, next_pow2
from pallas_kernels.triton.decode_attention import LOG2E
from pallas_kernels.triton.paged_decode_attention import MIN_BLOCK_SIZE


# ----------------------------------------------------------------------------- the kernel
def ragged_paged_attention_kernel(qb_req_ref, qb_first_ref, qb_count_ref, qb_pos_ref, tables_ref, q_ref, k_ref,
                                  v_ref, o_ref, *, groups, group_rows, block_q, block_size, scale_log2):
    # qb_*_ref [QB] int32 (a query block's request, first token, token count, first token's position);
    # tables_ref [R, P]; q_ref, o_ref [Hkv, T * group_rows, D]; k_ref, v_ref [N, block_size, Hkv, D].
    d = q_ref.shape[-1]
    rows = block_q * group_rows
    qb, h = pl.program_id(0), pl.program_id(1)
    count = qb_count_ref[qb]

    @pl.when(count > 0)
    def _():
        req, first, first_pos = qb_req_ref[qb], qb_first_ref[qb], qb_pos_ref[qb]
        r = jnp.arange(rows)
        token = r // group_rows                                  # which of the block's tokens a row is
        row_ok = (token < count) & (r % group_rows < groups)
        row_pos = first_pos + token                              # the row's query position
        q_rows = q_ref.at[h, pl.ds(first * group_rows, rows), :]
        q = common.masked_load(q_rows, common.block_mask(row_ok, None, (rows, d)))   # [rows, D]
        last_pos = first_pos + count - 1
        # (a query past the table, a speculative lane's unchecked guess, sees the keys that exist)
        n_pages = jnp.minimum(pl.cdiv(last_pos + 1, block_size), tables_ref.shape[1])
        n_full = (first_pos + 1) // block_size                   # pages every row sees whole

        def step(page, carry, masked):
            block = tables_ref[req, page]                         # where this page lives in the pool
            k = common.masked_load(k_ref.at[block, pl.ds(0, block_size), h, :], None)   # [block_size, D]
            v = common.masked_load(v_ref.at[block, pl.ds(0, block_size), h, :], None)
            sc = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST,
                                 preferred_element_type=jnp.float32) * scale_log2    # [rows, block_size]
            if masked:
                key_pos = page * block_size + jnp.arange(block_size)
                sc = jnp.where(key_pos[None, :] <= row_pos[:, None], sc, -jnp.inf)
            return online_softmax.update(carry, sc, v)

        carry = online_softmax.start(rows, d)
        carry = lax.fori_loop(0, n_full, functools.partial(step, masked=False), carry)
        carry = lax.fori_loop(n_full, n_pages, functools.partial(step, masked=True), carry)
        acc, _, l_sum = carry
        out = (acc / l_sum[:, None]).astype(o_ref.dtype)
        common.masked_store(o_ref.at[h, pl.ds(first * group_rows, rows), :], out,
                            common.block_mask(row_ok, None, (rows, d)))


# ----------------------------------------------------------------------------- launcher and entry points
def launch(q, k_pages, v_pages, block_tables, query_start, context_lens, *, sm_scale, interpret: bool,
           config: RaggedAttentionConfig | None = None, max_query_len: int | None = None,
           query_unit: int | None = None):
    """Run :func:`ragged_paged_attention_kernel` on checked operands: Q in the ``[Hkv, T * G, D]``
    row layout, the query blocks' bookkeeping, the grid (query blocks, Hkv), the output back to
    ``[T, Hq, D]`` with padding tokens zero."""
    t, hq, d = q.shape
    block_size, hkv = k_pages.shape[1], k_pages.shape[2]
    groups = hq // hkv
    p = plan(t, block_tables.shape[0], groups, hkv, config=config, max_query_len=max_query_len, query_unit=query_unit)
    gp = p.group_rows
    q4 = q.reshape(t, hkv, groups, d)
    if gp != groups:
        q4 = jnp.pad(q4, ((0, 0), (0, 0), (0, gp - groups), (0, 0)))
    q_rows = q4.transpose(1, 0, 2, 3).reshape(hkv, t * gp, d)
    blocks = reference.query_blocks(query_start, context_lens, p.grid[0], p.config.block_q)
    kernel = functools.partial(ragged_paged_attention_kernel, groups=groups, group_rows=gp, block_q=p.config.block_q,
                               block_size=block_size, scale_log2=sm_scale * LOG2E)
    out = common.call(kernel, out_shape=jax.ShapeDtypeStruct(q_rows.shape, q.dtype), grid=p.grid,
                      args=(*blocks, block_tables, q_rows, k_pages, v_pages), interpret=interpret,
                      num_warps=p.config.num_warps, num_stages=p.config.num_stages, name="ragged_paged_attention")
    out = out.reshape(hkv, t, gp, d)[:, :, :groups].transpose(1, 0, 2, 3).reshape(t, hq, d)
    real = jnp.arange(t) < query_start[-1]
    return jnp.where(real[:, None, None], out, 0).astype(q.dtype)


def ragged_paged_attention(q, k_pages, v_pages, block_tables, query_start, context_lens, *, sm_scale=None,
                           max_query_len: int | None = None, query_unit: int | None = None, mode: str = "auto",
                           config: RaggedAttentionConfig | None = None):
    """One serving iteration's attention: the tokens ``q [T, Hq, D]`` of ``R`` requests (request
    ``i``: tokens ``query_start[i]:query_start[i + 1]``, ``query_start [R + 1]`` int32) over their
    keys and values in the pool ``k_pages``, ``v_pages`` ``[N, block_size, Hkv, D]`` through
    ``block_tables [R, P]``, each request holding ``context_lens[i]`` positions after this iteration
    (its tokens are the last ones, causal) -> ``[T, Hq, D]``, zeros for tokens past
    ``query_start[R]``. ``sm_scale`` defaults to ``D ** -0.5``. ``max_query_len`` (static): no request
    has more tokens than this (1: a decode batch; None: T). ``query_unit`` (static, a power of two):
    the requests' tokens, each rounded up to a multiple of it, fit in T (a serving step that
    packs its chunks so promises it): then the work is ``T / query_unit`` query blocks, not the
    worst case of ``T / block + R``. Both size the work: the grid, and the reference's query blocks. ``mode``: see :mod:`pallas_kernels.mode` (no Mosaic GPU
    tier: ``"pallas"`` runs the Triton tier). ``config``: a :class:`RaggedAttentionConfig` instead of
    the one :func:`plan` picks."""
    q, k_pages, v_pages, block_tables, query_start, context_lens, sm_scale = check(
        q, k_pages, v_pages, block_tables, query_start, context_lens, sm_scale, max_query_len, query_unit)
    tier = choose_tier(mode, config, triton_config=RaggedAttentionConfig, mosaic=None, mosaic_problem=None)
    if tier.name == "reference":
        return reference.ragged_paged_attention(q, k_pages, v_pages, block_tables, query_start, context_lens,
                                                sm_scale=sm_scale, max_query_len=max_query_len, query_unit=query_unit)
    return launch(q, k_pages, v_pages, block_tables, query_start, context_lens, sm_scale=sm_scale,
                  interpret=tier.interpret, config=config, max_query_len=max_query_len, query_unit=query_unit)


def check(q, k_pages, v_pages, block_tables, query_start, context_lens, sm_scale, max_query_len=None,
          query_unit=None):
    """The operands as arrays after every check (one-line errors; the bookkeeping's values when concrete)."""
    q, k_pages, v_pages, sm_scale = checks.attention_operands(
        q, k_pages, v_pages, q_rank=3, q_layout="[T, Hq, D]", k_name="k_pages", v_name="v_pages",
        kv_layout="[N, block_size, Hkv, D]", sm_scale=sm_scale, same_batch=False)
    n_blocks, block_size = k_pages.shape[:2]
    if block_size < MIN_BLOCK_SIZE or block_size & (block_size - 1):
        raise ValueError(f"k_pages has blocks of {block_size} positions; use a power of two >= {MIN_BLOCK_SIZE} "
                         "(Triton's dot needs 16 keys a block)")
    block_tables = checks.as_array(block_tables, "block_tables")
    if block_tables.ndim != 2 or block_tables.shape[0] < 1 or not jnp.issubdtype(block_tables.dtype, jnp.integer):
        raise ValueError(f"block_tables has shape {tuple(block_tables.shape)} and dtype {block_tables.dtype}; it "
                         "must be [R, pages] int32, one row of block numbers per request")
    r = block_tables.shape[0]
    query_start = checks.as_array(query_start, "query_start")
    context_lens = checks.as_array(context_lens, "context_lens")
    for name, x, shape in (("query_start", query_start, (r + 1,)), ("context_lens", context_lens, (r,))):
        if x.shape != shape or not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(f"{name} has shape {tuple(x.shape)} and dtype {x.dtype}; it must be {list(shape)} int32 "
                             f"(R = {r} requests, the rows of block_tables)")
    t = q.shape[0]
    if max_query_len is not None and (isinstance(max_query_len, bool) or not isinstance(max_query_len, int)
                                      or not 1 <= max_query_len <= max(t, 1)):
        raise ValueError(f"max_query_len={max_query_len!r} must be None or a static integer in 1..T = {t}")
    if query_unit is not None and (isinstance(query_unit, bool) or not isinstance(query_unit, int) or query_unit < 1
                                   or query_unit & (query_unit - 1)):
        raise ValueError(f"query_unit={query_unit!r} must be None or a static power of two")
    most = block_tables.shape[1] * block_size
    if checks.is_concrete(query_start) and checks.is_concrete(context_lens):
        starts, lens = [int(x) for x in query_start], [int(x) for x in context_lens]
        n = [b - a for a, b in zip(starts, starts[1:])]
        if starts[0] != 0 or min(n) < 0 or starts[-1] > t:
            raise ValueError(f"query_start must start at 0, never decrease and end at most at T = {t}; got {starts}")
        if max_query_len is not None and max(n) > max_query_len:
            raise ValueError(f"a request has {max(n)} tokens, more than max_query_len={max_query_len}")
        if query_unit is not None and sum(-(-x // query_unit) for x in n) * query_unit > -(-t // query_unit) * query_unit:
            raise ValueError(f"the requests' tokens, each rounded up to query_unit={query_unit}, take more than the "
                             f"{t} tokens of q: pass query_unit=None or give q more places")
        bad = [i for i in range(r) if n[i] and not n[i] <= lens[i] <= most]
        if bad:
            i = bad[0]
            raise ValueError(f"context_lens[{i}] = {lens[i]} must hold request {i}'s {n[i]} new tokens and fit its "
                             f"table ({most} positions)")
    if checks.is_concrete(block_tables) and block_tables.size:
        lo, hi = checks.value_range(block_tables)
        if lo < 0 or hi >= n_blocks:
            raise ValueError(f"block_tables holds block numbers from {lo} to {hi}; the pool has blocks 0..{n_blocks - 1}")
    return (q, k_pages, v_pages, block_tables.astype(jnp.int32), query_start.astype(jnp.int32),
            context_lens.astype(jnp.int32), sm_scale)


# ----------------------------------------------------------------------------- config and plan
@dataclasses.dataclass(frozen=True)
class RaggedAttentionConfig:
    """Tokens of one request per program (``block_q``: with the G heads of a KV head, ``block_q * G``
    rows, at least 16), warps, pipeline stages."""

    block_q: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        checks.check_triton_config(self, ())
        if isinstance(self.block_q, bool) or not isinstance(self.block_q, int) or self.block_q < 1 \
                or self.block_q & (self.block_q - 1):
            raise ValueError(f"RaggedAttentionConfig.block_q={self.block_q!r} must be a power of two >= 1")


@dataclasses.dataclass(frozen=True)
class RaggedAttentionPlan:
    """What the kernel launches: config, the rows of a KV head's query group (G padded to a power of
    two), the grid (query blocks, Hkv)."""

    config: RaggedAttentionConfig
    group_rows: int
    grid: tuple


MIN_ROWS = 16     # Triton's smallest dot
ROWS = 32         # rows a program aims for: a decode token's heads, or a chunk's tokens times its heads


def plan(n_tokens: int, n_requests: int, groups: int, hkv: int, *, config: RaggedAttentionConfig | None = None,
         max_query_len: int | None = None, query_unit: int | None = None) -> RaggedAttentionPlan:
    """The config and grid for ``n_tokens`` tokens of at most ``n_requests`` requests (none with more
    than ``max_query_len``; with ``query_unit``, each rounded up to it fitting ``n_tokens``),
    ``groups`` query heads per KV head. ``block_q`` = ``ROWS / G`` tokens by default (at least enough
    for 16 rows; no more than ``max_query_len`` rounded up to a power of two, nor than ``query_unit``
    where the rows allow). The grid holds the most query blocks the iteration can need."""
    gp = next_pow2(groups)
    if config is None:
        block_q = max(1, max(ROWS, MIN_ROWS) // gp)
        for cap in (next_pow2(max_query_len) if max_query_len is not None else None, query_unit):
            if cap is not None:
                block_q = max(min(block_q, cap), -(-MIN_ROWS // gp))
        config = RaggedAttentionConfig(block_q=block_q)
    checks.check_config(config, RaggedAttentionConfig)
    if config.block_q * gp < MIN_ROWS:
        raise ValueError(f"block_q={config.block_q} x {gp} query heads per KV head is {config.block_q * gp} rows; "
                         f"Triton's dot needs at least {MIN_ROWS}: raise block_q")
    most = cdiv(n_tokens, config.block_q) + n_requests
    if max_query_len is not None:
        most = min(most, n_requests * cdiv(max_query_len, config.block_q))
    if query_unit is not None and query_unit % config.block_q == 0:   # blocks tile each request's units
        most = min(most, cdiv(n_tokens, query_unit) * (query_unit // config.block_q))
    return RaggedAttentionPlan(config, gp, (most, hkv))
