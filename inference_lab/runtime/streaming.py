"""Watching an answer being written: tokens one at a time, each with the moment it appeared.

:func:`stream` is :func:`inference_lab.runtime.generation.generate` for one prompt, unrolled so you can see
it happen: one prefill (the wait for the first token, TTFT), then one ``decode_step`` per token
(the gap between tokens, ITL). It yields each token as soon as it exists, with its text and the
seconds since the request started. Same model, prompt, seed and sampling: same tokens as
``generate``.

:func:`generate_without_cache` writes the same greedy answer the slow way: no KV cache, so every
step runs the model over the whole text so far. Equal text, a step that grows with the length:
what the cache saves.
"""

from __future__ import annotations

import codecs
import dataclasses
import time
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from inference_lab.base import checks, tokenizer
from inference_lab.base.progress import bar as progress_bar
from inference_lab.runtime import generation
from inference_lab.model.kv_cache import KVCache
from pallas_kernels.timing import timed_call


@dataclasses.dataclass(frozen=True)
class StreamedToken:
    """One generated token: its id, the text it adds (may be "" mid-character) and when it came."""

    token: int
    text: str
    seconds: float   # since the request started: the first token's is the TTFT


def _check_prompt(model, prompt: str, max_new_tokens: int) -> list[int]:
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"prompt must be a non-empty str, got {prompt!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be a positive integer")
    ids = tokenizer.encode(prompt)
    if len(ids) + max_new_tokens > model.cfg.max_seq_len:
        raise ValueError(f"the prompt ({len(ids)} tokens) and max_new_tokens={max_new_tokens} pass the model's "
                         f"max_seq_len={model.cfg.max_seq_len}; generate fewer tokens")
    return ids


def stream(model, prompt: str, max_new_tokens: int = 64, *, temperature: float = 0.0, top_k=None,
           seed: int = 0) -> Iterator[StreamedToken]:
    """Yield the answer to ``prompt`` token by token, as each is computed.

    Each token is copied to the host as soon as it exists (that is what a streaming server
    does, and why each step here waits for the device: the timings are honest per token).
    """
    ids = _check_prompt(model, prompt, max_new_tokens)
    top_k = checks.sampling(temperature, top_k, model.cfg.vocab_size)
    key = generation.seed_key(checks.seed("seed", seed))
    text = codecs.getincrementaldecoder("utf-8")(errors="replace")
    cache = KVCache.create(model.cfg, 1, len(ids) + max_new_tokens)
    t0 = time.perf_counter()
    logits, cache = generation.prefill(model, np.asarray([ids], np.int32), cache)
    # The same keys as generate(): fold_in(key, 0) for the token prefill makes, i for step i.
    token = generation.sample(logits, jax.random.fold_in(key, 0), temperature, top_k)
    for i in range(max_new_tokens):
        tid = int(token[0])  # waits for the device: the token exists now
        last = i + 1 == max_new_tokens
        # A character may span several byte tokens: the decoder holds its first bytes back, and
        # the last token flushes what is left (an unfinished character becomes U+FFFD).
        piece = text.decode(bytes([tid]) if tid < 256 else b"", final=last)
        yield StreamedToken(tid, piece, time.perf_counter() - t0)
        if last:
            return
        logits, cache = generation.decode_step(model, token, cache)
        token = generation.sample(logits, jax.random.fold_in(key, i + 1), temperature, top_k)


@dataclasses.dataclass
class Uncached:
    """The greedy answer written without a KV cache, and what each step cost."""

    tokens: list
    text: str
    lengths: list        # tokens the model read at each step (prompt + tokens so far)
    step_seconds: list   # time of each step


@jax.jit
def _greedy_at(logits, position):
    """The most likely next token after ``position``: the index is traced, so one compile per
    width serves every length (a Python-int index would compile a new slice for each)."""
    return jnp.argmax(jax.lax.dynamic_index_in_dim(logits[0], position, keepdims=False))


def generate_without_cache(model, prompt: str, max_new_tokens: int = 64, *, bucket: int = 16) -> Uncached:
    """Greedy decoding that recomputes the whole prefix at every step (no KV cache).

    Each step runs the full forward over the text so far and keeps the logits of its last
    position. The text is padded to a multiple of ``bucket`` tokens so that only a few shapes
    are compiled (the causal mask makes the padding invisible to the real positions); the work
    of a step still grows with the length, one bucket at a time.
    """
    ids = _check_prompt(model, prompt, max_new_tokens)
    if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 1:
        raise ValueError(f"bucket={bucket!r} must be a positive integer")
    widths = sorted({-(-n // bucket) * bucket for n in range(len(ids), len(ids) + max_new_tokens)})
    with progress_bar(total=len(widths) + max_new_tokens, desc="without a cache", unit="call",
                      transient=True) as bar:
        for width in widths:  # compile every shape first: the step times below are the model's, not XLA's
            int(_greedy_at(model(np.full((1, width), tokenizer.PAD, np.int32)), 0))
            bar.update()
        return _timed_uncached(model, ids, max_new_tokens, bucket, bar)


def _timed_uncached(model, ids, max_new_tokens: int, bucket: int, bar) -> Uncached:
    """generate_without_cache's timed steps, once every width is compiled."""
    out, lengths, times = [], [], []
    seq = list(ids)
    for _ in range(max_new_tokens):
        n = len(seq)
        width = -(-n // bucket) * bucket
        padded = np.full((1, width), tokenizer.PAD, np.int32)
        padded[0, :n] = seq
        seconds, tid = timed_call(lambda: int(_greedy_at(model(padded), n - 1)))   # every position, again
        times.append(seconds)
        lengths.append(n)
        out.append(tid)
        seq.append(tid)
        bar.update()   # after the timed call, never inside it
    return Uncached(out, tokenizer.decode(out), lengths, times)
