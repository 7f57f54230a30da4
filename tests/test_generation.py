"""KV cache and the generation calls: the cache invariant, row independence, sampling, errors, no copies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from inference_lab.runtime import generation, hlo
from inference_lab.base import tokenizer
from inference_lab.model.kv_cache import KVCache
from inference_lab.base.config import ModelConfig
from inference_lab.runtime.generation import decode_step, generate, prefill
from inference_lab.model.transformer import Transformer

TINY = ModelConfig.preset("tiny")
TOL = dict(rtol=2e-4, atol=2e-4)
# Most tests share one set of shapes (batch 2, prompt width 7, cache 12) so the compiled
# prefill/decode programs are reused across tests (compiles dominate a CPU test's time).
B, T, S = 2, 7, 12


@pytest.fixture(scope="module")
def model():
    return Transformer(TINY, rngs=nnx.Rngs(0), kernels="reference")


def rand_tokens(shape, seed=0):
    return np.random.default_rng(seed).integers(0, TINY.vocab_size, shape)


def test_cache_create_and_nbytes():
    c = KVCache.create(TINY, batch=3, max_len=10)
    assert len(c.k) == len(c.v) == TINY.n_layers
    assert c.k[0].shape == (3, 10, TINY.n_kv_heads, TINY.head_dim) and c.k[0].dtype == jnp.float32
    assert c.nbytes == sum(x.nbytes for x in c.k + c.v)
    np.testing.assert_array_equal(c.lengths, [0, 0, 0])
    with pytest.raises(ValueError, match="max_len"):
        KVCache.create(TINY, batch=1, max_len=0)


def test_kv_cache_invariant_ragged(model):
    """prefill + N decode steps == one pass over the whole sequence, per row, ragged rows."""
    full = rand_tokens((2, 12), seed=1)
    want = np.asarray(model(full))                      # [B, T, V]: logits at every position
    lengths = np.array([7, 4])                          # row 1 is right-padded
    prompt = full[:, :7].copy()
    prompt[1, 4:] = tokenizer.PAD
    cache = KVCache.create(TINY, 2, 12)
    logits, cache = prefill(model, prompt, cache, lengths)
    np.testing.assert_array_equal(cache.lengths, lengths)
    np.testing.assert_allclose(np.asarray(logits), want[[0, 1], lengths - 1], **TOL)
    for step in range(5):                               # feed each row its own next true token
        pos = lengths + step
        logits, cache = decode_step(model, full[[0, 1], pos], cache)
        np.testing.assert_allclose(np.asarray(logits), want[[0, 1], pos], **TOL)
    np.testing.assert_array_equal(cache.lengths, lengths + 5)


def test_decode_loop_matches_steps(model):
    prompt = rand_tokens((B, T), seed=2)
    c1 = KVCache.create(TINY, B, S)
    logits, c1 = prefill(model, prompt, c1)
    first = np.asarray(jnp.argmax(logits, -1))
    out, c1 = generation.decode_loop(model, first, c1, steps=4)
    c2 = KVCache.create(TINY, B, S)
    _, c2 = prefill(model, prompt, c2)
    tok, manual = first, []
    for _ in range(4):
        lg, c2 = decode_step(model, tok, c2)
        tok = np.asarray(jnp.argmax(lg, -1))
        manual.append(tok)
    np.testing.assert_array_equal(np.asarray(out), np.stack(manual, 1))
    np.testing.assert_array_equal(c1.lengths, c2.lengths)


def test_rows_are_independent(model):
    a = rand_tokens((B, T), seed=3)
    b = a.copy()
    b[1] = rand_tokens((T,), seed=4)                    # change every row but row 0
    outs = []
    for toks, lengths in ((a, [6, 3]), (b, [6, 7])):
        c = KVCache.create(TINY, B, S)
        first, c = prefill(model, toks, c, lengths=lengths)
        second, c = decode_step(model, [9, toks[1, 0]], c)
        outs.append((np.asarray(first[0]), np.asarray(second[0])))
    for x, y in zip(*outs):
        np.testing.assert_allclose(x, y, **TOL)


def test_generate_greedy_deterministic_and_text(model):
    prompts = [[1, 2, 3, 4, 5, 6, 7], [5, 6]]           # ragged; width 7, 5 new: cache 12
    g1 = generate(model, prompts, max_new_tokens=5)
    assert [len(r) for r in g1] == [5, 5] and g1 == generate(model, prompts, max_new_tokens=5)
    # greedy by hand with prefill + decode_step
    tokens = np.full((B, T), tokenizer.PAD)
    tokens[0], tokens[1, :2] = prompts[0], prompts[1]
    lg, c = prefill(model, tokens, KVCache.create(TINY, B, S), lengths=[7, 2])
    manual = []
    for _ in range(5):
        tok = np.argmax(np.asarray(lg), -1)
        manual.append(tok)
        lg, c = decode_step(model, tok, c)
    assert g1 == np.stack(manual, 1).tolist()
    texts = generate(model, ["hello!", "hi"], max_new_tokens=5)   # BOS + bytes: same shapes
    assert isinstance(texts, list) and all(isinstance(t, str) for t in texts)


def test_generate_sampling_seeded(model):
    prompts = [[7, 8, 9, 10, 11, 12, 13]] * 2
    s0 = generate(model, prompts, max_new_tokens=5, temperature=1.5, seed=0)
    assert s0 == generate(model, prompts, max_new_tokens=5, temperature=1.5, seed=0)
    assert s0 != generate(model, prompts, max_new_tokens=5, temperature=1.5, seed=1)
    assert all(0 <= t < TINY.vocab_size for row in s0 for t in row)


def test_sample_top_k_and_greedy():
    logits = jnp.asarray(np.random.default_rng(5).normal(size=(2, 50)), jnp.float32)
    best = np.argmax(np.asarray(logits), -1)
    key = jax.random.key(0)
    np.testing.assert_array_equal(generation._sample(logits, key, None, None), best)
    np.testing.assert_array_equal(generation._sample(logits, key, jnp.float32(5.0), 1), best)
    draws = np.stack([generation._sample(logits, jax.random.key(i), jnp.float32(5.0), 3) for i in range(20)])
    top3 = np.argsort(-np.asarray(logits), -1)[:, :3]
    assert all(d in top3[r] for r in range(2) for d in draws[:, r]) and len(np.unique(draws[:, 0])) > 1


def test_sample_rows_draws_what_sample_draws_row_by_row():
    """The serving engine's batched sampler: each row its own seed (64-bit ones among them), token
    index, temperature, top-k, top-p, min-p and banned tokens (greedy, top-1, all of the vocabulary,
    a row whose likeliest token is banned among them), equal to one sample() call per row on the
    same logits with the banned ones at -inf; a different seed, index or temperature moves a
    sampled row."""
    v = 259
    logits = jnp.asarray(np.random.default_rng(6).normal(size=(8, v)) * 3, jnp.float32)
    seeds = [7, 123, 2**40 + 5, 0, 99, 2**64 - 1, 5, 6]
    index = [0, 3, 1, 10, 2, 7, 0, 4]
    temps = [0.9, 1.0, 0.5, 1.3, 0.0, 1.0, 2.0, 1e-6]
    top_k = [None, 5, None, 40, 1, v, 3, None]
    top_p = [1.0, 0.8, 0.5, 1.0, 1.0, 0.95, 1.0, 0.3]
    min_p = [0.0, 0.0, 0.2, 0.05, 0.0, 0.0, 0.5, 0.0]
    banned = np.full((8, 3), v, np.int32)
    banned[0, :2] = np.argsort(-np.asarray(logits[0]))[:2]       # its two likeliest tokens may not be drawn
    banned[4, 0] = int(np.argmax(np.asarray(logits[4])))         # greedy, its argmax banned
    masked = np.asarray(logits).copy()
    for r in range(8):
        masked[r, banned[r][banned[r] < v]] = -np.inf
    want = [int(generation.sample(jnp.asarray(masked[r:r + 1]), jax.random.fold_in(generation.seed_key(s), i), t, k,
                                  None if p == 1 else p, None if m == 0 else m)[0])
            for r, (s, i, t, k, p, m) in enumerate(zip(seeds, index, temps, top_k, top_p, min_p))]
    words = np.stack([generation.seed_words(s) for s in seeds])
    args = (jnp.asarray(index, jnp.int32), jnp.asarray(temps, jnp.float32),
            jnp.asarray([v if k is None else k for k in top_k], jnp.int32), jnp.asarray(top_p, jnp.float32),
            jnp.asarray(min_p, jnp.float32), jnp.asarray(banned))
    draw = jax.jit(generation.sample_rows)
    got = np.asarray(draw(logits, jnp.asarray(words), *args))
    assert got.tolist() == want
    assert got[0] not in banned[0] and got[4] == np.argsort(-np.asarray(logits[4]))[1]
    moved = [np.asarray(draw(logits, jnp.asarray(words + 1), *args)),
             np.asarray(draw(logits, jnp.asarray(words), args[0] + 1, *args[1:])),
             np.asarray(draw(logits, jnp.asarray(words), args[0], args[1] * 3, *args[2:]))]
    sampled = [r for r, t in enumerate(temps) if t > 1e-5 and top_k[r] != 1]
    assert all((m[sampled] != np.array(want)[sampled]).any() for m in moved)


def test_top_p_and_min_p_keep_what_they_should():
    """Nucleus and min-p by hand on one distribution: top-p keeps the fewest likeliest tokens that
    reach p (the likeliest always), min-p the tokens at least that share of the likeliest."""
    probs = np.array([0.5, 0.25, 0.15, 0.1])
    scaled = jnp.asarray(np.log(probs), jnp.float32)[None]
    kept = lambda x: np.isfinite(np.asarray(x))[0].tolist()   # noqa: E731
    assert kept(generation.keep_top_p(scaled, 0.7)) == [True, True, False, False]    # 0.5 + 0.25 >= 0.7
    assert kept(generation.keep_top_p(scaled, 0.75)) == [True, True, False, False]
    assert kept(generation.keep_top_p(scaled, 0.76)) == [True, True, True, False]
    assert kept(generation.keep_top_p(scaled, 0.01)) == [True, False, False, False]
    assert kept(generation.keep_top_p(scaled, 1.0)) == [True] * 4
    assert kept(generation.keep_min_p(scaled, 0.3)) == [True, True, True, False]      # 0.1 < 0.3 * 0.5
    assert kept(generation.keep_min_p(scaled, 0.6)) == [True, False, False, False]


def test_seeds_use_all_64_bits(model):
    """Below 2**32 a seed's key is jax.random.key's; above, every bit counts (jax without 64-bit
    types keeps the low word alone): seeds differing only in their high word draw differently."""
    for seed in (0, 1, 7, 2**31 - 1, 2**31, 2**32 - 1):
        assert generation.seed_words(seed).tolist() == np.asarray(jax.random.key_data(jax.random.key(seed))).tolist()
    assert generation.seed_words(2**40 + 5).tolist() == [2**8, 5]
    logits = jnp.zeros((1, 256), jnp.float32)
    draws = {int(generation.sample(logits, generation.seed_key(s), 1.0)[0]) for s in (5, 2**32 + 5, 2**63 + 5)}
    assert len(draws) == 3
    with pytest.raises(ValueError, match="2\\*\\*64 - 1"):
        generation.generate(model, "a", 2, seed=2**64)


def test_tokenizer_round_trip():
    ids = tokenizer.encode("héllo")
    assert ids[0] == tokenizer.BOS and max(ids) < tokenizer.MIN_VOCAB
    assert tokenizer.decode(ids) == "héllo"
    assert tokenizer.decode([104, 400, 105, tokenizer.EOS]) == "hi"


def test_errors_before_any_work(model):
    def fresh(b=B, s=S):
        return KVCache.create(TINY, b, s)

    toks = rand_tokens((B, T))
    with pytest.raises(ValueError, match="longer than the cache"):
        prefill(model, rand_tokens((B, S + 1)), fresh())
    with pytest.raises(ValueError, match="batch"):
        prefill(model, rand_tokens((3, T)), fresh())
    with pytest.raises(ValueError, match="vocabulary"):
        prefill(model, np.full((B, T), TINY.vocab_size), fresh())
    with pytest.raises(ValueError, match="vocabulary"):
        prefill(model, -toks - 1, fresh())
    with pytest.raises(ValueError, match="lengths"):
        prefill(model, toks, fresh(), lengths=[0, 4])
    with pytest.raises(ValueError, match="shape"):
        prefill(model, toks[0], fresh())
    _, c = prefill(model, toks, fresh())
    with pytest.raises(ValueError, match="empty cache"):
        prefill(model, toks, c)
    with pytest.raises(ValueError, match="batch"):
        decode_step(model, [1, 2, 3], c)
    with pytest.raises(ValueError, match="vocabulary"):
        decode_step(model, [1, TINY.vocab_size], c)
    old = c
    _, c = decode_step(model, [1, 2], c)
    with pytest.raises(ValueError, match="donated to decode_step"):
        decode_step(model, [1, 2], old)               # the old cache is gone
    with pytest.raises(ValueError, match="donated"):
        old.k
    for _ in range(S - T - 1):                        # fill the cache to its last slot
        _, c = decode_step(model, [1, 2], c)
    with pytest.raises(ValueError, match="past max_len"):
        decode_step(model, [1, 2], c)
    assert not c.consumed                              # a refused call leaves the cache usable
    with pytest.raises(ValueError, match="past max_len"):
        generation.decode_loop(model, [1, 2], c, steps=1)
    with pytest.raises(ValueError, match="does not match"):
        prefill(model, toks, KVCache.create(TINY.replace(n_layers=3), B, S))
    with pytest.raises(ValueError, match="temperature"):
        generate(model, [[1]], temperature=-1.0)
    with pytest.raises(ValueError, match=r"prompts\[1\] holds a value that is not an integer"):
        generate(model, [[1, 2], [3.5]])
    with pytest.raises(ValueError, match=r"prompts\[1\] is str"):
        generate(model, [[1, 2], "hi"])
    with pytest.raises(ValueError, match=r"prompts\[0\] holds ids such as"):
        generate(model, [[1, TINY.vocab_size]])
    assert len(generate(model, [[1, 2]], max_new_tokens=2, temperature=np.float32(0.5))[0]) == 2
    with pytest.raises(ValueError, match="top_k"):
        generate(model, [[1]], top_k=0)
    with pytest.raises(ValueError, match="empty"):
        generate(model, [[1], []])
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, [[1]], max_new_tokens=0)


def test_vocabulary_and_max_seq_len_at_every_entry_point(model):
    """Refused on the host, before anything compiles: ids a gather would clamp silently, and
    sequences longer than the model's max_seq_len (512 for tiny)."""
    L = TINY.max_seq_len

    def big_cache(length):  # a cache made by hand, longer than the model allows
        shape = (1, L + 8, TINY.n_kv_heads, TINY.head_dim)
        zeros = [jnp.zeros(shape, jnp.float32) for _ in range(TINY.n_layers)]
        return KVCache(zeros, list(zeros), np.array([length], np.int32))

    with pytest.raises(ValueError, match="vocabulary is 0..511"):
        model(np.array([[1, TINY.vocab_size]]))                   # the no-cache forward too
    with pytest.raises(ValueError, match=f"{L + 1} positions per row, past the model's max_seq_len={L}"):
        model(np.ones((1, L + 1), np.int32))
    with pytest.raises(ValueError, match=f"max_len={L + 1} is past the model's max_seq_len={L}"):
        KVCache.create(TINY, 1, L + 1)
    with pytest.raises(ValueError, match="past the model's max_seq_len"):
        prefill(model, np.ones((1, L + 1), np.int32), big_cache(0))
    with pytest.raises(ValueError, match="decoding past max_seq_len: 1 step from 512 tokens"):
        decode_step(model, [1], big_cache(L))
    with pytest.raises(ValueError, match="decoding past max_seq_len: 5 steps from 508 tokens"):
        generation.decode_loop(model, [1], big_cache(L - 4), steps=5)
    with pytest.raises(ValueError, match=r"longest prompt \(500 tokens\) \+ max_new_tokens=13 is past"):
        generate(model, [[1] * 500], max_new_tokens=13)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, [[1]], max_new_tokens=True)


def _cache_elements(cache):
    return cache.batch * cache.max_len * cache.n_kv_heads * cache.head_dim


def test_copy_counter_sees_copies():
    """The HLO check can fail: updating a cache that is NOT donated forces a copy of it."""
    c = jnp.zeros((2, 64, 4, 32))
    txt = jax.jit(lambda c, x: c.at[:, 3].set(x)).lower(c, jnp.ones((2, 4, 32))).compile().as_text()
    assert hlo.count_cache_copies(txt, c.size) >= 1 and hlo.aliased_parameters(txt) == set()
    donated = jax.jit(lambda c, x: c.at[:, 3].set(x), donate_argnums=0).lower(c, jnp.ones((2, 4, 32)))
    txt = donated.compile().as_text()
    assert hlo.count_cache_copies(txt, c.size) == 0 and hlo.aliased_parameters(txt) == {0}


def test_relayout_counter():
    """A kernel that reads the cache transposed writes a cache-sized buffer: counted, whatever
    XLA names the fusion (the check looks at what the fusion computes, not its name)."""
    c = jnp.zeros((2, 64, 4, 32))
    for f in (lambda c: jnp.transpose(c, (0, 2, 1, 3)) * 2.0, lambda c: c * 2.0 + 1.0):
        assert hlo.count_cache_copies(jax.jit(f).lower(c).compile().as_text(), c.size) >= 1


def test_lowered_copy_finder_follows_views_and_updates_and_sees_reads_that_copy():
    """hlo.lowered_cache_copies on small programs: a reshape and a scatter keep the cache itself,
    a kernel-free read of rows (gather), a slice or arithmetic on it makes a new array."""
    c = jax.ShapeDtypeStruct((2, 64, 4, 32), jnp.float32)
    i = jax.ShapeDtypeStruct((3,), jnp.int32)
    kind = "tensor<2x64x4x32xf32>"

    def copies(f):
        return hlo.lowered_cache_copies(jax.jit(f).lower(c, i).as_text(), kind)

    assert copies(lambda c, i: c.reshape(128, 4, 32).at[i].set(1.0).reshape(c.shape)) == {}
    assert copies(lambda c, i: (c.reshape(128, 4, 32).at[i].set(1.0), c.reshape(-1)[i])) != {}   # a gather after
    assert "stablehlo.gather" in copies(lambda c, i: c[i])
    assert "stablehlo.slice" in copies(lambda c, i: c[:1])
    assert "stablehlo.multiply" in copies(lambda c, i: c * 2.0)
    with pytest.raises(ValueError, match="no argument of type"):
        hlo.lowered_cache_copies(jax.jit(lambda c, i: c).lower(c, i).as_text(), "tensor<9xf32>")


@pytest.mark.parametrize("steps", [None, 4])
def test_no_cache_sized_copies_and_every_cache_aliased(model, steps):
    """The compiled decode step (and the jitted loop) update the donated cache in place: no
    cache-sized copy, and every cache parameter's buffer is reused for an output."""
    cache = KVCache.create(TINY, 2, 64)
    txt = hlo.compiled_decode_text(model, cache, steps=steps)
    assert hlo.count_cache_copies(txt, _cache_elements(cache)) == 0
    cache_params = hlo.parameters_shaped(txt, (2, 64, TINY.n_kv_heads, TINY.head_dim))
    assert len(cache_params) == 2 * TINY.n_layers
    assert cache_params <= hlo.aliased_parameters(txt)
    assert hlo.count_all_reduces(txt) == 0
    assert not cache.consumed


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("decode_rows,chunks", [(8, 4), (1, 0)], ids=["mixed", "one-row"])
def test_the_serving_step_writes_no_row_sized_buffer(paged, decode_rows, chunks):
    """The serving engine's step (transformer.step_forward, XLA path, compiled for this CPU) over
    8 rows of a 4,096-position cache: 8 decode rows and 4 prompt chunks in 64 tokens, or one decode
    row alone. The new K/V go into the donated cache in place and attention reads it where it is,
    so nothing in the program writes a buffer as large as one request's row of one layer's cache
    (the cache itself updated in place aside). Before the ragged attention each 16-token piece
    gathered its row whole (and scored all of it), 12 or more such buffers; a lone decode row's
    write, a dynamic-update-slice that read the old value, made XLA:CPU copy every layer's cache."""
    from inference_lab.model import transformer as M

    cfg = TINY.replace(n_layers=2, max_seq_len=4096)
    params = Transformer(cfg, rngs=nnx.Rngs(0), kernels="reference").params()
    rows, context, block = 8, 4096, 16
    shape = ((rows * context // block + 1, block) if paged else (rows, context)) + (cfg.n_kv_heads, cfg.head_dim)
    cache = [jax.ShapeDtypeStruct(shape, jnp.float32)] * cfg.n_layers
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
    table = i32(rows, context // block) if paged else None

    def step(p, tokens, lengths, active, chunk_tokens, bounds, slots, starts, heads, k, v, table):
        return M.step_forward(p, tokens, lengths, active, chunk_tokens, bounds, slots, starts, heads, k, v, cfg=cfg,
                              mode="reference", block_table=table, chunk_unit=16)

    args = (params, i32(decode_rows), i32(decode_rows), jax.ShapeDtypeStruct((decode_rows,), jnp.bool_),
            i32(16 * chunks), i32(chunks + 1), i32(chunks), i32(chunks), i32(decode_rows + chunks), cache, cache, table)
    text = jax.jit(step, donate_argnums=(9, 10)).lower(*args).compile().as_text()
    row = context * cfg.n_kv_heads * cfg.head_dim
    assert hlo.count_cache_copies(text, row) == 0
    assert hlo.parameters_shaped(text, shape) <= hlo.aliased_parameters(text)


def test_kernel_counter_counts_per_layer():
    """Kernels grow by the same number with each layer; loops count their body once."""
    counts = []
    for layers in (1, 2, 3):
        cfg = TINY.replace(n_layers=layers)
        m = Transformer(cfg, rngs=nnx.Rngs(0), kernels="reference")
        counts.append(hlo.count_kernels(hlo.compiled_decode_text(m, KVCache.create(cfg, 2, 64))))
    assert counts[1] - counts[0] == counts[2] - counts[1] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("steps", [None, 4])
def test_no_cache_sized_copies_pallas(steps):
    m = Transformer(TINY, rngs=nnx.Rngs(0), kernels="pallas")
    cache = KVCache.create(TINY, 8, 256)
    txt = hlo.compiled_decode_text(m, cache, steps=steps)
    assert hlo.count_cache_copies(txt, _cache_elements(cache)) == 0
    assert hlo.parameters_shaped(txt, (8, 256, TINY.n_kv_heads, TINY.head_dim)) <= hlo.aliased_parameters(txt)


@pytest.mark.gpu
def test_pallas_decode_layer_kernel_count():
    """On the Pallas path a decode layer is 5 Pallas kernels (QKV, attention with the K/V write,
    output, gate/up, down) plus XLA's fusions for norms, RoPE and residual adds."""
    cfg = ModelConfig.preset("base", n_layers=1)
    per_layer = []
    for layers in (1, 2):
        c = cfg.replace(n_layers=layers)
        m = Transformer(c, rngs=nnx.Rngs(0), kernels="pallas")
        txt = hlo.compiled_decode_text(m, KVCache.create(c, 1, 1024))
        per_layer.append((hlo.count_pallas_calls(txt), hlo.count_kernels(txt)))
    pallas, kernels = per_layer[1][0] - per_layer[0][0], per_layer[1][1] - per_layer[0][1]
    print(f"base decode layer: {pallas} Pallas kernels, {kernels} kernels in all")
    assert pallas == 5
    assert kernels <= 12, f"{kernels} kernels per decode layer"

def test_decode_step_keeps_device_tokens_on_the_device(model, monkeypatch):
    """Feeding back the token a step sampled must not copy it to the host (a device sync per
    step): the engine's NumPy conversions refuse device arrays while it runs."""
    logits, cache = prefill(model, np.ones((2, 3), np.int32), KVCache.create(TINY, 2, 16))
    token = jnp.argmax(logits, -1).astype(jnp.int32)

    class HostOnlyNumpy:
        def __getattr__(self, name):
            return getattr(np, name)

        def asarray(self, x, *args, **kwargs):
            if isinstance(x, jax.Array):
                raise AssertionError("a device array was copied to the host")
            return np.asarray(x, *args, **kwargs)

    monkeypatch.setattr(generation, "np", HostOnlyNumpy())
    with pytest.raises(AssertionError, match="copied to the host"):   # the spy itself works
        generation.np.asarray(token)
    logits, cache = decode_step(model, token, cache)
    logits, cache = decode_step(model, jnp.argmax(logits, -1).astype(jnp.int32), cache)
    assert cache.host_lengths.tolist() == [5, 5]
