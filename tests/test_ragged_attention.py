"""Ragged paged attention (``pk.ragged_paged_attention``): a serving iteration's prompt chunks,
decode tokens and padding at once, over a shuffled paged pool.

Against float64 NumPy (each request's blocks gathered, its tokens at the end of its context) on
awkward mixes: chunks of odd lengths beside single decode tokens, a request with no token this
iteration, padding tokens past the last request, head groups that are not powers of two, blocks
of 16 and 32, the three float dtypes; the Triton-style kernel under the interpreter (compiled
where a GPU is: ``gpu``) with every output poisoned first, and the XLA reference alike. Then the
plan, the refusals, the kernel lowered for CUDA on this CPU, and what the reference reads.
"""

from __future__ import annotations

import importlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels import testing
from pallas_kernels.mode import pallas_supported

ra_mod = importlib.import_module("pallas_kernels.triton.ragged_paged_attention")
GPU = pytest.mark.skipif(not pallas_supported(), reason="needs an NVIDIA GPU (compute capability >= 8.0)")
MODES = [pytest.param("interpret", id="interpret"), pytest.param("reference", id="reference"),
         pytest.param("pallas", id="pallas", marks=[pytest.mark.gpu, GPU])]
F32, BF16, F16 = jnp.float32, jnp.bfloat16, jnp.float16
S = jax.ShapeDtypeStruct


def _problem(rng, tokens, contexts, *, hq, hkv, d, bs, dtype, pad=3, pages=None):
    """Random q and pool, a shuffled table per request (block 0 unused), the bookkeeping."""
    r = len(tokens)
    pages = pages or max(1, -(-max(contexts) // bs))
    n_blocks = r * pages + 2
    t = sum(tokens) + pad
    q = jnp.asarray(rng.standard_normal((t, hq, d)), dtype)
    kp = jnp.asarray(rng.standard_normal((n_blocks, bs, hkv, d)), dtype)
    vp = jnp.asarray(rng.standard_normal((n_blocks, bs, hkv, d)), dtype)
    tables = jnp.asarray(rng.permutation(np.arange(1, n_blocks))[:r * pages].reshape(r, pages), jnp.int32)
    starts = jnp.asarray(np.concatenate([[0], np.cumsum(tokens)]), jnp.int32)
    return q, kp, vp, tables, starts, jnp.asarray(contexts, jnp.int32)


CASES = [
    # (tokens per request, their contexts after the step, Hq, Hkv, D, block size, dtype)
    ([5, 1, 17, 0, 1], [40, 3, 17, 0, 128], 8, 2, 32, 16, F32),     # chunks beside decode tokens, an idle request
    ([1, 1, 1, 1], [1, 100, 33, 16], 4, 4, 64, 16, F32),             # decode only, G = 1
    ([33], [60], 6, 2, 64, 16, F32),                                 # one long chunk, G = 3 (padded to 4)
    ([16, 3, 1], [16, 35, 200], 32, 8, 128, 16, BF16),               # the base model's heads
    ([7, 2], [70, 2], 8, 1, 64, 32, F16),                            # blocks of 32, one KV head
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tokens,contexts,hq,hkv,d,bs,dtype", CASES, ids=[str(i) for i in range(len(CASES))])
def test_ragged_paged_attention_matches_float64(mode, tokens, contexts, hq, hkv, d, bs, dtype):
    rng = np.random.default_rng(len(tokens) + hq)
    args = _problem(rng, tokens, contexts, hq=hq, hkv=hkv, d=d, bs=bs, dtype=dtype)
    want = testing.ragged_paged_attention_f64(*args)
    with testing.poisoned_outputs():
        out = pk.ragged_paged_attention(*args, mode=mode)
    out = np.asarray(jnp.asarray(out, F32), np.float64)
    assert np.all(np.isfinite(out)), "an element was not written"
    t = sum(tokens)
    assert np.all(out[t:] == 0), "padding tokens are answered with zeros"
    tolerance = 1e-5 if dtype == F32 else 2e-2
    assert testing.rel_err(out, want) <= tolerance, (mode, testing.rel_err(out, want))


@pytest.mark.parametrize("mode", ["interpret", "reference"])
@pytest.mark.parametrize("tokens,contexts", [
    ([40, 1, 3, 70, 2, 0], [300, 600, 3, 70, 520, 0]),     # a spread: the reference cuts blocks of 32
    ([200, 1], [530, 9]),                                  # one long chunk over three of its loop's reads
    ([3] * 9, [3, 40, 290, 3, 3, 17, 260, 5, 512]),         # many short ones
])
def test_max_query_len_and_ragged_spreads(mode, tokens, contexts):
    """With ``max_query_len`` the tightest bound, the grid (kernel) and the query blocks (reference)
    are sized for it; every spread of tokens over requests still matches float64, past the
    reference's 256-position reads too."""
    rng = np.random.default_rng(sum(tokens))
    args = _problem(rng, tokens, contexts, hq=8, hkv=2, d=32, bs=16, dtype=F32, pad=5)
    want = testing.ragged_paged_attention_f64(*args)
    with testing.poisoned_outputs():
        out = pk.ragged_paged_attention(*args, max_query_len=max(tokens), mode=mode)
    out = np.asarray(out, np.float64)
    assert np.all(out[sum(tokens):] == 0) and testing.rel_err(out, want) <= 1e-5, testing.rel_err(out, want)


@pytest.mark.parametrize("mode", ["interpret", "reference"])
def test_a_query_unit_packs_the_work_and_is_checked(mode):
    """``query_unit``: the requests' tokens, each rounded up to 16, fit T (a serving step packs its
    chunks so): the work is T / 16 query blocks (the grid, the reference's layout) and the answers
    are the same; bookkeeping that breaks the promise is refused."""
    tokens, contexts = [22, 3, 1, 13, 0], [300, 3, 40, 13, 0]           # 2 + 1 + 1 + 1 units of 16 = 80 places
    rng = np.random.default_rng(7)
    args = _problem(rng, tokens, contexts, hq=8, hkv=2, d=32, bs=16, dtype=F32, pad=80 - sum(tokens))
    want = testing.ragged_paged_attention_f64(*args)
    with testing.poisoned_outputs():
        out = pk.ragged_paged_attention(*args, max_query_len=80, query_unit=16, mode=mode)
    assert testing.rel_err(np.asarray(out, np.float64), want) <= 1e-5
    assert pk.ragged_paged_attention_plan(80, 5, 4, 2, max_query_len=80, query_unit=16).grid[0] == 80 // 8
    assert pk.ragged_paged_attention_plan(80, 5, 4, 2, max_query_len=80).grid[0] == 80 // 8 + 5
    short = _problem(rng, tokens, contexts, hq=8, hkv=2, d=32, bs=16, dtype=F32, pad=64 - sum(tokens))
    with pytest.raises(ValueError, match="query_unit=16"):
        pk.ragged_paged_attention(*short, query_unit=16, mode=mode)


@pytest.mark.parametrize("mode", ["interpret", "reference"])
def test_each_token_sees_only_its_own_request_causally(mode):
    """Moving a block of one request changes only that request's rows; a key written past a
    token's position (later in its own chunk) changes nothing for it."""
    rng = np.random.default_rng(5)
    q, kp, vp, tables, starts, ctx = _problem(rng, [4, 3], [20, 19], hq=4, hkv=2, d=32, bs=16, dtype=F32)
    base = np.asarray(pk.ragged_paged_attention(q, kp, vp, tables, starts, ctx, mode=mode))
    other = tables.at[1, 0].set(tables[1, 1])                         # request 1's first block replaced
    moved = np.asarray(pk.ragged_paged_attention(q, kp, vp, other, starts, ctx, mode=mode))
    assert np.array_equal(moved[:4], base[:4]) and not np.allclose(moved[4:7], base[4:7])
    # request 0's tokens sit at positions 16..19: rewrite position 19 (its last token's own key)
    block = int(tables[0, 1])
    changed = kp.at[block, 3].set(kp[block, 3] * 5)
    later = np.asarray(pk.ragged_paged_attention(q, changed, vp, tables, starts, ctx, mode=mode))
    assert np.array_equal(later[:3], base[:3]) and not np.allclose(later[3], base[3])


def test_plan_rows_and_grid():
    p = pk.ragged_paged_attention_plan(64, 8, 4, 8)                  # the base model: G = 4
    assert p.config.block_q * p.group_rows == ra_mod.ROWS and p.grid == (64 // p.config.block_q + 8, 8)
    assert pk.ragged_paged_attention_plan(10, 2, 3, 2).group_rows == 4
    assert pk.ragged_paged_attention_plan(10, 2, 32, 1).config.block_q == 1     # G = 32 fills the rows alone
    with pytest.raises(ValueError, match="at least 16"):
        pk.ragged_paged_attention_plan(10, 2, 2, 2, config=pk.RaggedAttentionConfig(block_q=2))
    with pytest.raises(ValueError, match="power of two"):
        pk.RaggedAttentionConfig(block_q=3)


def test_bad_bookkeeping_is_refused_in_one_line():
    rng = np.random.default_rng(1)
    q, kp, vp, tables, starts, ctx = _problem(rng, [2, 1], [5, 9], hq=4, hkv=2, d=32, bs=16, dtype=F32)
    f = pk.ragged_paged_attention
    cases = [((q, kp, vp, tables, starts[:2], ctx), "query_start has shape"),
             ((q, kp, vp, tables, jnp.asarray([0, 2, 1]), ctx), "never decrease"),
             ((q, kp, vp, tables, jnp.asarray([0, 2, 99]), ctx), "end at most at T"),
             ((q, kp, vp, tables, starts, jnp.asarray([1, 9])), "context_lens\\[0\\] = 1 must hold"),
             ((q, kp, vp, tables, starts, jnp.asarray([5, 99])), "fit its table"),
             ((q, kp, vp, tables + 100, starts, ctx), "block numbers"),
             ((q, kp[:, :8], vp[:, :8], tables, starts, ctx), "power of two >= 16")]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            f(*args, mode="reference")
    with pytest.raises(ValueError, match="no Mosaic GPU tier"):
        f(q, kp, vp, tables, starts, ctx, mode="mosaic_interpret")


@pytest.mark.parametrize("t,r,hq,hkv,d,bs,pages,dtype", [(64, 8, 32, 8, 128, 16, 16, BF16),
                                                         (512, 64, 32, 8, 128, 16, 512, BF16),
                                                         (40, 5, 6, 2, 64, 32, 8, F32)])
def test_ragged_paged_attention_lowers_for_cuda(t, r, hq, hkv, d, bs, pages, dtype):
    """The kernel through Pallas' Triton lowering for an H200 (power-of-two blocks, its ops):
    one Triton kernel, at the base model's shapes and an awkward one."""
    from jax._src import mesh as mesh_lib  # private: AbstractDevice has no public export yet

    pool = S((r * pages + 1, bs, hkv, d), dtype)
    i32 = jnp.int32
    args = (S((t, hq, d), dtype), pool, pool, S((r, pages), i32), S((r + 1,), i32), S((r,), i32))
    device = mesh_lib.AbstractDevice(device_kind="NVIDIA H200", num_cores=None, platform="cuda")
    mesh = mesh_lib.AbstractMesh((1,), ("x",), abstract_device=device)
    fn = lambda *a: ra_mod.launch(*a, sm_scale=d ** -0.5, interpret=False)   # noqa: E731
    with jax.sharding.use_abstract_mesh(mesh), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 1


def test_the_reference_reads_only_the_chunks_the_longest_context_needs():
    """The XLA path walks the pool 256 positions at a time up to the iteration's longest context
    (a loop, no gathered copy of whole rows): the same answer from a table of 64 pages as from one
    of 4, and a loop, not a row-sized gather, in its compiled program."""
    rng = np.random.default_rng(2)
    q, kp, vp, tables, starts, ctx = _problem(rng, [3, 1], [30, 50], hq=4, hkv=2, d=32, bs=16, dtype=F32, pages=64)
    short = tables[:, :4]
    a = pk.ragged_paged_attention(q, kp, vp, tables, starts, ctx, mode="reference")
    b = pk.ragged_paged_attention(q, kp, vp, short, starts, ctx, mode="reference")
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    text = jax.jit(lambda *x: pk.reference.ragged_paged_attention(*x)).lower(
        q, kp, vp, tables, starts, ctx).compile().as_text()
    assert " while(" in text
