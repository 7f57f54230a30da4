"""Fixed decode slots: the static-shape core of the serving engine (JetStream's split).

A server cannot recompile for every mix of requests, so the decode batch has a fixed shape:
``n_slots`` rows of one :class:`~inference_lab.model.kv_cache.KVCache` of ``max_len`` positions.
A request goes through three calls:

1. **prefill** its prompt into a one-row cache of its own: whole (:meth:`DecodeSlots.prefill`,
   the prompt padded to a power-of-two width so a few compiled programs serve every length) or
   a chunk at a time (:meth:`DecodeSlots.prefill_chunk`, chunked prefill);
2. **insert** that row into a free slot (:meth:`DecodeSlots.insert`: one in-place copy);
3. **generate**: one :meth:`DecodeSlots.step` advances every busy slot by a token. It steps the
   smallest of a few compiled batch widths (1, 2, 4, ... up to ``n_slots``) that holds every busy
   slot; free slots inside it ride along at length 0 (their work is wasted, their shape is what
   lets the program stay compiled) and are set back to 0 after each step.

Sampling is per request (:func:`sample_row`): greedy rows by one argmax over the batch, and a
seeded row with the key :func:`inference_lab.runtime.engine.generate` would use for that row's
token (``fold_in(key(seed), index)``), so a request served alone draws what ``generate`` draws.
"""

from __future__ import annotations

import jax
import numpy as np

from inference_lab.base import tokenizer
from inference_lab.model.kv_cache import KVCache
from inference_lab.runtime import engine

MIN_WIDTH = 16   # the narrowest prefill: shorter prompts are padded to it


def prefill_width(n_tokens: int, max_len: int) -> int:
    """The padded width a prompt of ``n_tokens`` is prefilled at: the next power of two
    (>= :data:`MIN_WIDTH`), at most ``max_len``."""
    width = MIN_WIDTH
    while width < n_tokens:
        width *= 2
    return min(width, max_len)


def prefill_widths(max_len: int) -> list[int]:
    """Every width :func:`prefill_width` gives for prompts of 1..``max_len`` tokens."""
    widths = [prefill_width(1, max_len)]
    while widths[-1] < max_len:
        widths.append(prefill_width(widths[-1] + 1, max_len))
    return widths


def chunk_widths(chunk_tokens: int) -> list[int]:
    """The chunk widths chunked prefill compiles for: multiples of 16 up to ``chunk_tokens``."""
    return list(range(MIN_WIDTH, chunk_tokens + 1, MIN_WIDTH))


def sample_row(logits_row, temperature: float, top_k, seed: int, index: int) -> int:
    """Token ``index`` (0 = the first) of a request sampled from its logits [1, V] as
    ``generate(..., seed=seed)`` would sample it for a one-prompt batch."""
    key = jax.random.fold_in(jax.random.key(seed), index)
    return int(np.asarray(engine.sample(logits_row, key, temperature, top_k))[0])


class DecodeSlots:
    """``n_slots`` decode rows of ``max_len`` positions for ``model``, and the calls that fill them."""

    def __init__(self, model, n_slots: int, max_len: int | None = None):
        self.model = model
        self.max_len = int(max_len or model.cfg.max_seq_len)
        self.n_slots = int(n_slots)
        self.cache = KVCache.create(model.cfg, self.n_slots, self.max_len)
        self.next_token = np.full(self.n_slots, tokenizer.PAD, np.int32)   # what each slot feeds next
        self.active = np.zeros(self.n_slots, bool)

    # -- prefill: a one-row cache per request
    def prefill(self, prompt: list[int]):
        """The whole prompt in one call, padded to :func:`prefill_width`. Returns (float32 logits
        [1, V] after its last token, its one-row cache)."""
        width = prefill_width(len(prompt), self.max_len)
        tokens = np.full((1, width), tokenizer.PAD, np.int32)
        tokens[0, :len(prompt)] = prompt
        cache = KVCache.create(self.model.cfg, 1, width)
        logits, cache = engine.prefill(self.model, tokens, cache, np.array([len(prompt)], np.int32))
        return logits, cache

    def new_row(self) -> KVCache:
        """An empty one-row cache as long as a slot, for a prompt prefilled chunk by chunk."""
        return KVCache.create(self.model.cfg, 1, self.max_len)

    def prefill_chunk(self, row: KVCache, prompt: list[int], width: int):
        """The next ``width`` tokens of ``prompt`` into ``row`` (it holds the ones before them):
        one :func:`~inference_lab.runtime.engine.verify` call, padded at the prompt's end.
        Returns (logits [1, V] after the prompt's last token, or None while more is to come;
        the row cache; how many tokens this chunk took)."""
        start = int(row.host_lengths[0])
        real = min(width, len(prompt) - start)
        width = min(width, self.max_len - start)          # a padded last chunk must fit the row
        tokens = np.full((1, width), tokenizer.PAD, np.int32)
        tokens[0, :real] = prompt[start:start + real]
        logits, row = engine.verify(self.model, tokens, row)
        if start + real < len(prompt):
            return None, row, real
        return logits[:, real - 1], row.rewound(len(prompt)), real

    # -- insert and generate
    def insert(self, slot: int, row: KVCache, first_token: int) -> None:
        """Put a prefilled request into free slot ``slot``; it feeds ``first_token`` next."""
        self.cache = self.cache.inserted(slot, row)
        self.next_token[slot] = first_token
        self.active[slot] = True

    def free(self, slot: int) -> None:
        """Slot ``slot`` is free again: back to length 0 (what it held is overwritten later)."""
        self.active[slot] = False
        self.next_token[slot] = tokenizer.PAD
        held = self.cache.host_lengths
        held[slot] = 0
        self.cache = self.cache.rewound(held)

    def step(self):
        """One decode step of the busy slots: of the smallest prefix of :meth:`step_widths` rows
        that holds every active slot (slots are given out lowest first, so a few requests step a
        few rows). Returns float32 logits [width, V] (rows of free slots are garbage); free slots
        are back at length 0 afterwards."""
        busy = np.flatnonzero(self.active)
        width = next((w for w in self.step_widths() if w > (busy.max() if len(busy) else 0)), self.n_slots)
        if width == self.n_slots:
            logits, cache = engine.decode_step(self.model, self.next_token, self.cache)
        else:
            logits, cache = engine.decode_rows(self.model, self.next_token[:width], self.cache, width)
        held = cache.host_lengths
        if not self.active.all():
            cache = cache.rewound(np.where(self.active, held, 0))
        self.cache = cache
        return logits

    def busy_step(self, width: int | None = None):
        """A step as when the first ``width`` slots (default: all) are busy, the slots' state put
        back after: what the step-cost measurements time. Only while the engine is not serving."""
        active, lengths = self.active.copy(), self.cache.host_lengths
        self.active[:] = False
        self.active[:width or self.n_slots] = True
        try:
            return self.step()
        finally:
            self.active[:] = active
            self.cache = self.cache.rewound(lengths)

    def step_widths(self) -> list[int]:
        """The decode batch widths a step compiles for: powers of two below ``n_slots``, then it."""
        widths, w = [], 1
        while w < self.n_slots:
            widths.append(w)
            w *= 2
        return widths + [self.n_slots]

    def free_slots(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(~self.active)]

    def context(self, slot: int) -> int:
        return int(self.cache.host_lengths[slot])
