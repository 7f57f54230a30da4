"""Prefill, decode and generate: running the model on prompts, in a page (the serving engine
built on these pieces is :mod:`inference_lab.serving`).

- :func:`prefill` runs whole prompts through the model at once (compute-bound: every weight
  is used for ``B x T`` tokens) and fills the KV cache.
- :func:`decode_step` runs one new token per row (memory-bound at small batch: every weight
  is read for just ``B`` tokens) and appends its K/V to the cache.
- :func:`generate` = prefill + a jitted loop of decode steps with sampling.
- :func:`sample` draws the next token of every row from its logits (greedy, or softmax at a
  temperature over the top k); :func:`sample_rows` is the same draw with every row's own
  temperature, top-k, seed and token index as arrays (a serving engine's batch of strangers).
- :func:`verify` runs a few new tokens per row in one forward; :func:`check_guesses` is
  speculative decoding's greedy check built on it (argmax, the guesses kept, the rollback).

How it is compiled (each choice was measured; docs/architecture.md has the figures):
- The model's weights are taken out as a plain dict (``model.params()``) and passed to a
  ``jax.jit``-ed pure function; ``nnx.jit`` would walk the module graph on every call
  (~3 ms), more than a whole small-model decode step.
- The cache arrays are *donated*: XLA overwrites them in place, so a step moves only the
  bytes it must (weights + the cache it reads), never a copy of the cache.
- Layers are a Python loop (unrolled in the program): no ``lax.scan`` over stacked layers.
- :func:`decode_loop` runs many steps inside one ``lax.fori_loop``: the measurement path,
  free of per-call Python overhead.
- A model split by :func:`inference_lab.model.parallel.shard` (it has a ``mesh``) runs the same
  forward functions per device inside ``jax.shard_map``, its cache split by KV heads.

Every input is checked before anything runs on the device: the token ids by
:func:`inference_lab.model.transformer.check_tokens`, the cache, its room and the sampling
arguments here. (How to look at the compiled programs, e.g. to check that no step copies the
cache: :func:`lower_decode` and :mod:`inference_lab.runtime.hlo`.)

One decode step, from the top: :func:`decode_step` checks its inputs, donates the cache and
calls ``_decode_jit``, which runs ``transformer.decode_forward`` (per device under a mesh): the
embedding, then for each layer ``transformer.block`` (RMSNorm, ``transformer.decode_attention``:
QKV via ``pk.matmul``, RoPE, ``pk.decode_attention`` handed the new K/V, which it writes into the
donated cache in place and attends over, the output projection; RMSNorm,
``transformer.mlp``: two more ``pk.matmul``), then the head (``pk.matmul``). Each ``pk.*`` call
asks :func:`pallas_kernels.mode.choose_tier` (once, at trace time) which kernels to run.
"""

from __future__ import annotations

import collections
import functools
import weakref

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from inference_lab.model import parallel
from inference_lab.base import checks, tokenizer
from inference_lab.model.kv_cache import KVCache
from inference_lab.model.transformer import check_tokens, decode_forward, prefill_forward, verify_forward


# ----------------------------------------------------------------------------- jitted cores
def _spmd(fn, mesh, *, cfg, mode):
    """``fn`` (``prefill_forward`` or ``decode_forward``) with ``cfg`` and ``mode`` bound; under
    a mesh, run per device: weights and caches split, tokens and lengths whole, logits whole."""
    bound = functools.partial(fn, cfg=cfg, mode=mode)
    if mesh is None:
        return bound

    def run(params, tokens, lengths, k_caches, v_caches):
        caches = [parallel.CACHE_SPEC] * len(k_caches)
        mapped = parallel.per_device(bound, mesh, in_specs=(parallel.param_specs(params), P(), P(), caches, caches),
                                     out_specs=(P(), caches, caches))
        return mapped(params, tokens, lengths, list(k_caches), list(v_caches))

    return run


# `mesh` is None for a one-device model, else the mesh its weights are split over.
@functools.partial(jax.jit, static_argnames=("cfg", "mode", "mesh"), donate_argnames=("k_caches", "v_caches"))
def _prefill_jit(params, tokens, lengths, k_caches, v_caches, *, cfg, mode, mesh=None):
    return _spmd(prefill_forward, mesh, cfg=cfg, mode=mode)(params, tokens, lengths, k_caches, v_caches)


@functools.partial(jax.jit, static_argnames=("cfg", "mode", "mesh"), donate_argnames=("k_caches", "v_caches"))
def _decode_jit(params, tokens, lengths, k_caches, v_caches, *, cfg, mode, mesh=None):
    logits, k_caches, v_caches = _spmd(decode_forward, mesh, cfg=cfg, mode=mode)(
        params, tokens, lengths, k_caches, v_caches)
    return logits, k_caches, v_caches, lengths + 1


@functools.partial(jax.jit, static_argnames=("cfg", "mode", "mesh"), donate_argnames=("k_caches", "v_caches"))
def _verify_jit(params, tokens, lengths, k_caches, v_caches, *, cfg, mode, mesh=None):
    logits, k_caches, v_caches = _spmd(verify_forward, mesh, cfg=cfg, mode=mode)(
        params, tokens, lengths, k_caches, v_caches)
    return logits, k_caches, v_caches, lengths + tokens.shape[1]


@functools.partial(jax.jit, static_argnames=("cfg", "mode", "mesh"), donate_argnames=("k_caches", "v_caches"))
def _check_guesses_jit(params, tokens, lengths, k_caches, v_caches, active, *, cfg, mode, mesh=None):
    logits, k_caches, v_caches = _spmd(verify_forward, mesh, cfg=cfg, mode=mode)(
        params, tokens, lengths, k_caches, v_caches)
    chosen = jnp.argmax(logits, axis=-1).astype(jnp.int32)                       # [B, T]
    right = jnp.sum(jnp.cumprod(chosen[:, :-1] == tokens[:, 1:], axis=1), axis=1).astype(jnp.int32)
    return chosen, right, k_caches, v_caches, lengths + jnp.where(active, right + 1, 0)


def _sample(logits, key, temperature, top_k, top_p=None, min_p=None):
    """float32 logits [B, V] -> int32 tokens [B]: argmax if ``temperature`` is None (greedy),
    else softmax sampling at that (traced) temperature, over the ``top_k`` largest logits
    when given, then (traced, when given) the tokens at least ``min_p`` times as likely as the
    likeliest and the smallest set holding ``top_p`` of the probability (vLLM's order:
    :func:`keep_min_p`, :func:`keep_top_p`). Greedy is a separate compiled program so measured
    decode steps pay for an argmax only, not for drawing random numbers."""
    if temperature is None:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    scaled = logits / temperature
    if min_p is not None:
        scaled = keep_min_p(scaled, min_p)
    if top_p is not None:
        scaled = keep_top_p(scaled, top_p)
    return jax.random.categorical(key, scaled, axis=-1).astype(jnp.int32)


def keep_min_p(scaled, min_p):
    """Logits (already divided by the temperature) [..., V] with every token less than ``min_p``
    times as likely as the likeliest set to -inf (min-p sampling; ``min_p`` 0 keeps all)."""
    floor = jnp.max(scaled, axis=-1, keepdims=True) + jnp.log(jnp.asarray(min_p, jnp.float32))
    return jnp.where(scaled < floor, -jnp.inf, scaled)


def keep_top_p(scaled, top_p):
    """Logits [..., V] keeping the smallest set of the likeliest tokens whose probabilities add up
    to at least ``top_p`` (nucleus sampling; ``top_p`` 1 keeps all; the likeliest is always kept):
    sorted ascending, the leading tokens whose running total stays within ``1 - top_p`` go."""
    ascending = jnp.sort(scaled, axis=-1)
    total = jnp.cumsum(jax.nn.softmax(ascending, axis=-1), axis=-1)
    dropped = jnp.sum(total[..., :-1] <= 1 - jnp.asarray(top_p, jnp.float32), axis=-1, keepdims=True)
    threshold = jnp.take_along_axis(ascending, dropped, axis=-1)
    return jnp.where(scaled < threshold, -jnp.inf, scaled)


MIN_TEMPERATURE = 1e-5   # below this, sampling is greedy: logits / 1e-40 overflow float32 into NaN


def _temperature(t: float):
    """0 (or below :data:`MIN_TEMPERATURE`, sampling's limit) -> None (greedy, static); otherwise a
    traced float32 scalar."""
    return None if t < MIN_TEMPERATURE else jnp.float32(t)


@functools.partial(jax.jit, static_argnames=("steps", "top_k", "cfg", "mode", "mesh"),
                   donate_argnames=("k_caches", "v_caches"))
def _decode_loop_jit(params, tokens, lengths, k_caches, v_caches, key, temperature, top_p=None, min_p=None, *, steps,
                     top_k, cfg, mode, mesh=None):
    """``steps`` decode steps in one program. Step i feeds ``tokens`` (i = 0) or the token
    sampled at step i-1 (with key ``fold_in(key, i + 1)``: generate used 0 for the token
    sampled from the prefill logits); returns (tokens sampled at each step [B, steps], caches, lengths)."""
    b = tokens.shape[0]
    step = _spmd(decode_forward, mesh, cfg=cfg, mode=mode)

    def body(i, carry):
        tok, lens, ks, vs, out = carry
        logits, ks, vs = step(params, tok, lens, ks, vs)
        nxt = _sample(logits, jax.random.fold_in(key, i + 1), temperature, top_k, top_p, min_p)
        return nxt, lens + 1, ks, vs, out.at[:, i].set(nxt)

    out = jnp.zeros((b, steps), jnp.int32)
    _, lengths, k_caches, v_caches, out = jax.lax.fori_loop(
        0, steps, body, (tokens, lengths, list(k_caches), list(v_caches), out))
    return out, k_caches, v_caches, lengths


_sample_jit = jax.jit(_sample, static_argnames=("top_k",))


def sample(logits, key, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
           min_p: float | None = None):
    """float32 logits [B, V] -> int32 tokens [B]: greedy (argmax) at ``temperature`` 0, else
    softmax sampling at that temperature over the ``top_k`` largest logits (all when None), then
    min-p and top-p (None: off), with ``key``. Arguments as :func:`inference_lab.base.checks.sampling`
    returns them. The same program ``generate`` and ``streaming.stream`` draw with, so they draw
    the same tokens."""
    temperature = _temperature(temperature)
    tokens = _sample_jit(logits, key, temperature, top_k=top_k, top_p=_traced(top_p, temperature),
                         min_p=_traced(min_p, temperature))
    _DRAWN.append(weakref.ref(tokens))
    return tokens


# The token arrays sample() drew lately, by identity (weakly: a dropped array is gone): fed back
# to decode_step they are known to be in the vocabulary, so their values are not read back to
# the host (a wait for the device on every step). Any other array on the device is range-checked.
_DRAWN: collections.deque = collections.deque(maxlen=64)


def _drawn_here(tokens) -> bool:
    return any(ref() is tokens for ref in _DRAWN)


def _traced(value, temperature):
    """A top-p or min-p setting as a traced float32, or None where it does nothing (off, or greedy)."""
    return None if value is None or temperature is None else jnp.float32(value)


def sample_rows(logits, seed_words, index, temperature, top_k, top_p, min_p, banned):
    """float32 logits [R, V] -> int32 tokens [R], every row with its own sampling arrays (traced:
    no setting compiles a program of its own): ``seed_words`` [R, 2] uint32 (:func:`seed_words`),
    ``index`` [R] (which token of its request this is, 0 = the first), ``temperature`` [R] (below
    :data:`MIN_TEMPERATURE`: greedy), ``top_k`` [R] in 1..V (V: every logit), ``top_p`` [R] (1:
    off), ``min_p`` [R] (0: off), ``banned`` [R, S] token ids that may not be drawn now (a
    request's end-of-sequence and stop tokens before its ``min_tokens``; V pads). Row ``r`` draws
    exactly what :func:`sample` draws for a one-row batch with ``fold_in(key(seed), index)``, so a
    request served among others gets the tokens ``generate(..., seed=)`` gives it alone: the same
    key, the same shape of draw ([1, V]), the same k-th-largest cut (a sort instead of
    ``lax.top_k``, whose ``k`` must be static), the same division by the temperature, the same
    min-p and top-p, applied only where they are on."""
    def one(row, words, i, t, k, p, m, ban):
        row = row.at[ban].set(-jnp.inf, mode="drop")
        greedy = t < MIN_TEMPERATURE
        kth = jnp.sort(row)[row.shape[0] - k]                   # the k-th largest logit
        scaled = jnp.where(row < kth, -jnp.inf, row)[None] / jnp.where(greedy, 1.0, t)
        scaled = jnp.where(m > 0, keep_min_p(scaled, jnp.maximum(m, 1e-30)), scaled)
        scaled = jnp.where(p < 1, keep_top_p(scaled, p), scaled)
        key = jax.random.fold_in(jax.random.wrap_key_data(words), i)
        drawn = jax.random.categorical(key, scaled, axis=-1)[0]
        return jnp.where(greedy, jnp.argmax(row), drawn).astype(jnp.int32)

    return jax.vmap(one)(logits, seed_words, index, temperature, top_k, top_p, min_p, banned)


def logprobs(logits, tokens):
    """The model's log-probabilities (the raw logits' log-softmax, as vLLM reports by default) of
    ``tokens`` [R] and of the ``checks.MAX_LOGPROBS`` likeliest tokens of each row: (chosen [R],
    top values [R, N], top ids [R, N])."""
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    top, ids = jax.lax.top_k(lp, min(checks.MAX_LOGPROBS, lp.shape[-1]))
    return jnp.take_along_axis(lp, tokens[:, None], axis=-1)[:, 0], top, ids.astype(jnp.int32)


def seed_words(seed: int) -> np.ndarray:
    """The two uint32 words of a 64-bit ``seed`` as a threefry key's data (high, low), computed on
    the host (no device call per request). Every bit counts, with or without 64-bit jax (whose
    ``jax.random.key`` would keep the low word alone): :func:`seed_key` makes the same key."""
    seed = int(seed)
    return np.array([(seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF], np.uint32)


def seed_key(seed: int):
    """The random key of a 64-bit ``seed``: what ``generate``, ``stream``, ``decode_loop`` and the
    serving engine draw with (``jax.random.key(seed)`` for seeds below 2**32)."""
    return jax.random.wrap_key_data(jnp.asarray(seed_words(seed)))


# ----------------------------------------------------------------------------- checks
def _as_tokens(tokens, name: str, ndim: int, cfg) -> np.ndarray:
    drawn = ndim == 1 and isinstance(tokens, jax.Array) and _drawn_here(tokens)   # (prompts: never looked up)
    return check_tokens(tokens, name, ndim, cfg, drawn_on_device=drawn)


def _check_room(model, cache, steps: int, what: str) -> None:
    """``steps`` more tokens must fit in the cache and within the model's ``max_seq_len``."""
    held = int(cache.host_lengths.max())
    if held + steps > cache.max_len:
        raise ValueError(f"decoding past max_len: {what} from {held} tokens exceed max_len={cache.max_len}; "
                         "create the cache with a larger max_len")
    if held + steps > model.cfg.max_seq_len:
        raise ValueError(f"decoding past max_seq_len: {what} from {held} tokens exceed the model's "
                         f"max_seq_len={model.cfg.max_seq_len}; generate fewer tokens")


def _check_cache(model, cache, what: str) -> None:
    if not isinstance(cache, KVCache):
        raise ValueError(f"cache must be a KVCache (KVCache.create(cfg, batch, max_len)), got {type(cache).__name__}")
    cache.check_alive(what)
    cfg = model.cfg
    kv_dtype = np.dtype("int8") if cfg.kv_cache_dtype == "int8" else np.dtype(cfg.dtype)
    want = (cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, kv_dtype)
    have = (cache.n_layers, cache.n_kv_heads, cache.head_dim, np.dtype(cache.dtype))
    if want != have:
        raise ValueError(f"cache (layers, kv heads, head_dim, dtype)={have} does not match the model's {want}; "
                         "create it with KVCache.create(model.cfg, batch, max_len)")


def _tokens_per_row(model, tokens, cache, what: str) -> np.ndarray:
    """tokens [B, T] checked for ``what`` (verify, check_guesses): one row per cache row, room for T."""
    _check_cache(model, cache, f"{what}()")
    tokens = _as_tokens(tokens, "tokens", 2, model.cfg)
    if tokens.shape[0] != cache.batch:
        raise ValueError(f"tokens has batch {tokens.shape[0]} but the cache holds {cache.batch} rows; "
                         "give T tokens per row, as tokens [B, T]")
    _check_room(model, cache, tokens.shape[1], f"{what} of {tokens.shape[1]} tokens")
    return tokens


# ----------------------------------------------------------------------------- public API
def prefill(model, tokens, cache: KVCache, lengths=None):
    """Run prompts through the model and fill an empty cache.

    tokens [B, T] int32, right-padded; lengths [B] real tokens per row (None: all T).
    Returns (float32 logits [B, V] at each row's last real token, the filled cache with
    ``cache.lengths == lengths``). The cache passed in is donated.
    """
    _check_cache(model, cache, "prefill()")
    tokens = _as_tokens(tokens, "tokens", 2, model.cfg)
    b, t = tokens.shape
    if b != cache.batch:
        raise ValueError(f"tokens has batch {b} but the cache was created for batch {cache.batch}; "
                         "make them equal")
    if t > cache.max_len:
        raise ValueError(f"prompt length {t} is longer than the cache (max_len={cache.max_len}); "
                         "create a larger cache with KVCache.create(cfg, batch, max_len)")
    held = cache.host_lengths
    if held.any():
        raise ValueError(f"prefill needs an empty cache but this one already holds "
                         f"{held.tolist()} tokens per row; use a fresh "
                         "KVCache.create(...) or continue with decode_step")
    if lengths is None:
        lengths = np.full((b,), t, np.int32)
    else:
        lengths = np.asarray(lengths)
        if lengths.shape != (b,) or not np.issubdtype(lengths.dtype, np.integer):
            raise ValueError(f"lengths must be [B]=[{b}] integers, got shape {lengths.shape} dtype {lengths.dtype}")
        if lengths.min() < 1 or lengths.max() > t:
            raise ValueError(f"lengths {lengths.tolist()} must be in 1..{t} (the prompt width)")
        lengths = lengths.astype(np.int32)
    ks, vs = parallel.place_cache(model.mesh, *cache.donate("prefill"))
    logits, ks, vs = _prefill_jit(model.params(), jnp.asarray(tokens), jnp.asarray(lengths), ks, vs,
                                  cfg=model.cfg, mode=model.kernels, mesh=model.mesh)
    return logits, KVCache(ks, vs, jnp.asarray(lengths), host_lengths=lengths)


def decode_step(model, next_tokens, cache: KVCache):
    """One token per row: written at ``cache.lengths[b]``, attending to ``lengths[b] + 1`` keys.

    Returns (float32 logits [B, V], the cache with lengths + 1). The cache passed in is
    donated: use the returned one.
    """
    _check_cache(model, cache, "decode_step()")
    tokens = _as_tokens(next_tokens, "next_tokens", 1, model.cfg)
    if tokens.shape[0] != cache.batch:
        raise ValueError(f"next_tokens has batch {tokens.shape[0]} but the cache holds {cache.batch} rows; "
                         "give one token per row")
    _check_room(model, cache, 1, "1 step")
    host = cache.host_lengths + 1
    lengths = cache.lengths
    ks, vs = parallel.place_cache(model.mesh, *cache.donate("decode_step"))
    logits, ks, vs, lengths = _decode_jit(model.params(), jnp.asarray(tokens), lengths, ks, vs,
                                          cfg=model.cfg, mode=model.kernels, mesh=model.mesh)
    return logits, KVCache(ks, vs, lengths, host_lengths=host)


def verify(model, tokens, cache: KVCache):
    """``T`` tokens per row in one forward: tokens [B, T] written at ``cache.lengths[b]`` onwards,
    token ``j`` attending to the cache and the new tokens before it. What ``T`` decode steps fed
    these tokens would compute, with the weights read once (speculative decoding checks its
    guesses so: :mod:`inference_lab.runtime.speculative`).

    Returns (float32 logits [B, T, V], the cache with lengths + T). The cache passed in is donated;
    :meth:`KVCache.rewound` takes back the positions a caller does not keep.
    """
    tokens = _tokens_per_row(model, tokens, cache, "verify")
    host = cache.host_lengths + tokens.shape[1]
    lengths = cache.lengths
    ks, vs = parallel.place_cache(model.mesh, *cache.donate("verify"))
    logits, ks, vs, lengths = _verify_jit(model.params(), jnp.asarray(tokens), lengths, ks, vs,
                                          cfg=model.cfg, mode=model.kernels, mesh=model.mesh)
    return logits, KVCache(ks, vs, lengths, host_lengths=host)


def check_guesses(model, tokens, cache: KVCache, active=None):
    """Speculative decoding's greedy check, in one program: :func:`verify` of tokens [B, T] (each
    row's last emitted token, then its ``T - 1`` guesses), the model's argmax at every position,
    how many leading guesses equal it, and the cache rolled back to keep just those.

    Returns (``chosen`` [B, T] int32: the argmax after each fed token, ``right`` [B] int32: leading
    guesses that were right, both NumPy; the cache, each ``active`` row (default: all) holding its
    last token and its ``right`` kept guesses, the others back where they were). Row ``b``'s new
    tokens are ``tokens[b, 1:right[b] + 1]`` and then ``chosen[b, right[b]]``. The cache is donated.
    """
    tokens = _tokens_per_row(model, tokens, cache, "check_guesses")
    active = np.ones(cache.batch, bool) if active is None else np.asarray(active)
    if active.shape != (cache.batch,) or active.dtype != bool:
        raise ValueError(f"active must be [B]=[{cache.batch}] booleans (the rows still writing), "
                         f"got shape {active.shape} dtype {active.dtype}")
    held, lengths = cache.host_lengths, cache.lengths
    ks, vs = parallel.place_cache(model.mesh, *cache.donate("check_guesses"))
    chosen, right, ks, vs, lengths = _check_guesses_jit(model.params(), jnp.asarray(tokens), lengths, ks, vs,
                                                        jnp.asarray(active), cfg=model.cfg, mode=model.kernels,
                                                        mesh=model.mesh)
    chosen, right = (np.asarray(x) for x in jax.device_get((chosen, right)))
    host = held + np.where(active, right + 1, 0).astype(np.int32)
    return chosen, right, KVCache(ks, vs, lengths, host_lengths=host)


def decode_loop(model, tokens, cache: KVCache, steps: int, *, temperature: float = 0.0,
                top_k: int | None = None, seed: int = 0, top_p: float | None = None, min_p: float | None = None):
    """``steps`` decode steps in one jitted ``fori_loop``, each feeding the token it sampled
    (sampling as :func:`sample` says).

    tokens [B]: the first token of each row. Returns (int32 [B, steps] sampled tokens,
    the cache advanced by ``steps``). The cache is donated.
    """
    _check_cache(model, cache, "decode_loop()")
    tokens = _as_tokens(tokens, "tokens", 1, model.cfg)
    if tokens.shape[0] != cache.batch:
        raise ValueError(f"tokens has batch {tokens.shape[0]} but the cache holds {cache.batch} rows")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps={steps!r} must be a positive integer")
    seed = checks.seed("seed", seed)
    top_k = checks.sampling(temperature, top_k, model.cfg.vocab_size)
    top_p, min_p = checks.probability_cuts(top_p, min_p)
    _check_room(model, cache, int(steps), f"{steps} steps")
    host = cache.host_lengths + steps
    lengths = cache.lengths
    ks, vs = parallel.place_cache(model.mesh, *cache.donate("decode_loop"))
    out, ks, vs, lengths = _decode_loop_jit(
        model.params(), jnp.asarray(tokens), lengths, ks, vs, seed_key(seed), _temperature(temperature),
        _traced(top_p, _temperature(temperature)), _traced(min_p, _temperature(temperature)),
        steps=int(steps), top_k=top_k, cfg=model.cfg, mode=model.kernels, mesh=model.mesh)
    return out, KVCache(ks, vs, lengths, host_lengths=host)


def prompt_rows(prompts, vocab_size: int):
    """``prompts`` as token-id rows after checking them: a str, a list of str (encoded by the
    byte-level tokenizer, with BOS) or a list of token-id lists (ragged allowed). Returns
    ``(rows, as_text, single)``: the rows, whether text came in (text goes out) and whether it
    was a single str."""
    single = isinstance(prompts, str)
    as_text = single or (isinstance(prompts, (list, tuple)) and prompts and all(isinstance(p, str) for p in prompts))
    if single:
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of token-id lists, or a str / list of str")
    if as_text:
        return [tokenizer.encode(p) for p in prompts], True, single
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            raise ValueError(f"prompts[{i}] is str; give every prompt as a list of token ids, or every prompt "
                             "as a str (not a mix)")
    rows = [checks.token_ids(f"prompts[{i}]", p, vocab_size) for i, p in enumerate(prompts)]
    return rows, False, single


def padded(rows) -> tuple[np.ndarray, np.ndarray]:
    """Ragged token rows as ``(tokens [B, T] right-padded with PAD, lengths [B])`` for :func:`prefill`."""
    lengths = np.array([len(r) for r in rows], np.int32)
    tokens = np.full((len(rows), int(lengths.max())), tokenizer.PAD, np.int64)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
    return tokens, lengths


def generate(model, prompts, max_new_tokens: int = 16, temperature: float = 0.0, top_k=None, seed: int = 0,
             top_p: float | None = None, min_p: float | None = None):
    """Continue each prompt by exactly ``max_new_tokens`` tokens (no early stop).

    prompts: a list of token-id lists (ragged allowed), or a str / list of str (encoded by
    the byte-level tokenizer, with BOS). Returns lists of new ids, or strs for str input
    (a single str in, a single str out). Same seed, same output. Sampling as :func:`sample`
    says (``top_p``/``min_p`` None: off); the serving engine draws the same tokens.
    """
    rows, as_text, single = prompt_rows(prompts, model.cfg.vocab_size)
    if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be a positive integer")
    top_k = checks.sampling(temperature, top_k, model.cfg.vocab_size)
    top_p, min_p = checks.probability_cuts(top_p, min_p)
    seed = checks.seed("seed", seed)
    longest = max(len(r) for r in rows)
    if longest + max_new_tokens > model.cfg.max_seq_len:
        raise ValueError(f"the longest prompt ({longest} tokens) + max_new_tokens={max_new_tokens} is past the "
                         f"model's max_seq_len={model.cfg.max_seq_len}; shorten the prompt or generate fewer tokens")

    tokens, lengths = padded(rows)
    cache = KVCache.create(model.cfg, batch=len(rows), max_len=tokens.shape[1] + int(max_new_tokens))
    logits, cache = prefill(model, tokens, cache, lengths)
    key = seed_key(seed)
    first = sample(logits, jax.random.fold_in(key, 0), temperature, top_k, top_p, min_p)
    if max_new_tokens > 1:
        rest, cache = decode_loop(model, first, cache, int(max_new_tokens) - 1,
                                  temperature=temperature, top_k=top_k, seed=seed, top_p=top_p, min_p=min_p)
        new = np.concatenate([np.asarray(first)[:, None], np.asarray(rest)], axis=1)
    else:
        new = np.asarray(first)[:, None]
    out = [row.tolist() for row in new]
    if as_text:
        out = [tokenizer.decode(r) for r in out]
        return out[0] if single else out
    return out


def lower_decode(model, cache: KVCache, *, steps: int | None = None):
    """The jitted :func:`decode_step` (``steps=None``) or :func:`decode_loop` of ``steps`` steps,
    lowered for these shapes (``jax.stages.Lowered``: ``.compile().as_text()`` is the program XLA
    runs; :mod:`inference_lab.runtime.hlo` reads it). Nothing runs; the cache is only used for its
    shapes (it is not donated)."""
    _check_cache(model, cache, "lower_decode()")
    mesh = model.mesh
    ks, vs = parallel.place_cache(mesh, cache.k, cache.v)   # shapes and shardings as a real call
    args = (model.params(), jnp.zeros((cache.batch,), jnp.int32), cache.lengths, ks, vs)
    if steps is None:
        return _decode_jit.lower(*args, cfg=model.cfg, mode=model.kernels, mesh=mesh)
    return _decode_loop_jit.lower(*args, jax.random.key(0), None, steps=int(steps), top_k=None,
                                  cfg=model.cfg, mode=model.kernels, mesh=mesh)
