"""The serving engine: requests in, tokens out, one scheduler loop over fixed decode slots.

:class:`Engine` runs the loop in a thread of its own. :meth:`Engine.submit` hands it a
:class:`Request` and a callback; the loop calls the callback from its thread with a
:class:`TokenEvent` for every token, stamped with the time the token reached the host. Each
iteration of the loop follows the policy:

* ``"prefill-first"`` (vLLM's first scheduler): every waiting prompt that has a free slot is
  prefilled whole, then one decode step advances every slot. A long prompt stalls every
  running request for as long as its prefill takes: one long gap in each of their streams.
* ``"chunked"`` (Sarathi-Serve, vLLM's default since): an iteration has a token budget,
  ``chunk_tokens``. Each running request's next token takes one token of it; the rest (rounded
  down to a multiple of 16) goes to the next piece of the oldest waiting prompt. No iteration
  grows past the budget, so no gap grows past one budget-sized iteration; a long prompt takes
  several iterations to prefill, so its own first token comes later instead. (The decode step
  and the chunk are two calls here: a fused mixed batch would read the weights once for both,
  which matters where reading them is the cost.)

The disaggregated policy (prefill and decode in two processes) is
:mod:`inference_lab.serving.disaggregated`; it takes the same requests and gives the same events.
Each of its two workers runs this loop in one of two roles: ``"prefill-only"`` (prefill whole
prompts, emit the first token, hand the cache on) and ``"decode-only"`` (insert caches that
arrive prefilled, then generate).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import queue
import threading
import time

import jax
import numpy as np

from inference_lab.base import tokenizer
from inference_lab.runtime import engine
from inference_lab.model.kv_cache import KVCache
from inference_lab.serving.slots import DecodeSlots, chunk_widths, prefill_widths, sample_row

POLICIES = ("prefill-first", "chunked", "disaggregated")
ROLES = ("prefill-only", "decode-only")   # the two pools' loops (serving.disaggregated)
DEFAULT_CHUNK_TOKENS = 64     # sized for the shipped models' 256-token context (a quarter of it)


class QueueFull(Exception):
    """The admission queue is full: the server answers 429 rather than queue without bound."""


@dataclasses.dataclass
class Request:
    """One request as the engine sees it: token ids (with BOS) and how to sample."""

    rid: str
    prompt: list
    max_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    seed: int = 0
    stop_at_eos: bool = True

    def finish_reason(self, token: int, index: int) -> str | None:
        """Why the request ends after its token number ``index`` (0 = the first), or None."""
        if self.stop_at_eos and token == tokenizer.EOS:
            return "stop"
        return "length" if index + 1 >= self.max_tokens else None


@dataclasses.dataclass(frozen=True)
class TokenEvent:
    """Token ``index`` of request ``rid`` reached the host at ``time`` (``time.perf_counter``,
    a system-wide monotonic clock on Linux, so worker processes' stamps compare). ``finish``:
    ``"length"``/``"stop"`` on the last token; ``"abort"``/``"error"`` end a request without one
    (``token`` is then -1 and ``error`` says why)."""

    rid: str
    token: int
    index: int
    time: float
    finish: str | None = None
    error: str = ""


def now() -> float:
    return time.perf_counter()


@dataclasses.dataclass
class _Running:
    request: Request
    emit: object
    produced: int = 0
    slot: int = -1
    row: object = None          # its one-row cache: while prefilled chunk by chunk, or as it arrived
    first: int = -1             # decode-only: the first token, sampled by the prefill pool


class Engine:
    """The scheduler loop over :class:`DecodeSlots`, in a thread: ``policy`` as the module says,
    ``n_slots`` decode rows, ``chunk_tokens`` the chunked policy's budget, at most ``max_queue``
    requests waiting for a slot (then :class:`QueueFull`). ``policy`` may also be one of the
    :data:`ROLES`; a prefill-only engine calls ``handoff(request, first_token, row_cache)`` for
    each request that goes on, instead of giving it a slot."""

    def __init__(self, model, *, policy: str = "chunked", n_slots: int = 8,
                 chunk_tokens: int = DEFAULT_CHUNK_TOKENS, max_queue: int = 64, handoff=None):
        if policy not in POLICIES[:2] + ROLES:
            raise ValueError(f"policy={policy!r}: the in-process engine runs 'prefill-first' or 'chunked' "
                             "('disaggregated' is serving.disaggregated.TwoPoolEngine)")
        if (handoff is None) == (policy == "prefill-only"):
            raise ValueError("handoff is what a prefill-only engine calls, and only it")
        for name, value, low in (("n_slots", n_slots, 1), ("max_queue", max_queue, 1),
                                 ("chunk_tokens", chunk_tokens, 16)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{name}={value!r} must be an integer >= {low}")
        if chunk_tokens <= n_slots:
            raise ValueError(f"chunk_tokens={chunk_tokens} leaves no room for a prompt chunk beside "
                             f"{n_slots} decode rows: make it larger than n_slots")
        self.model, self.policy, self.handoff = model, policy, handoff
        self.n_slots, self.chunk_tokens, self.max_queue = int(n_slots), int(chunk_tokens), int(max_queue)
        self.slots = DecodeSlots(model, self.n_slots)
        self.max_len = self.slots.max_len
        self._inbox = queue.SimpleQueue()       # ("submit", _Running) | ("cancel", rid) | ("stop", None)
        self._waiting: collections.deque[_Running] = collections.deque()
        self._running: dict[int, _Running] = {}  # slot -> request
        self._prefilling: _Running | None = None
        self._queued = 0                         # submitted, not yet given a slot
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self.iterations = 0

    # -- the outside: any thread
    def start(self) -> "Engine":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="inference-lab-engine", daemon=True)
            self._thread.start()
        return self

    def submit(self, request: Request, emit) -> None:
        """Queue ``request``; ``emit(TokenEvent)`` is called from the engine's thread. A request
        the model cannot hold is refused here (ValueError), before it could stop the loop."""
        self.check(request)
        with self._lock:
            if self.error is not None:
                raise RuntimeError(f"the engine stopped: {self.error}")
            if self._queued >= self.max_queue:
                raise QueueFull(f"{self._queued} requests are already waiting (max_queue={self.max_queue})")
            self._queued += 1
        self._inbox.put(("submit", _Running(request, emit)))

    def check(self, request: Request) -> None:
        """One-line errors for a request the engine cannot serve (the API answers them 400 first)."""
        vocab = self.model.cfg.vocab_size
        prompt = request.prompt
        if not isinstance(prompt, list) or isinstance(prompt and prompt[0], str):
            raise ValueError(f"request {request.rid}: prompt must be a list of token ids (tokenizer.encode(text))")
        try:
            engine.prompt_rows([prompt], vocab)   # generate()'s own check of token ids
        except ValueError as err:
            raise ValueError(f"request {request.rid}: bad token ids: {err}") from None
        if len(prompt) >= self.max_len:
            raise ValueError(f"request {request.rid}: a prompt of {len(prompt)} tokens leaves no room in "
                             f"max_len={self.max_len}; shorten it")
        if isinstance(request.max_tokens, bool) or not isinstance(request.max_tokens, int) or request.max_tokens < 1:
            raise ValueError(f"request {request.rid}: max_tokens={request.max_tokens!r} must be a positive integer")
        engine.check_sampling(request.temperature, request.top_k, vocab)

    def submit_prefilled(self, request: Request, emit, row, first_token: int) -> None:
        """A decode-only engine's arrival: ``request`` with its prompt in the one-row cache
        ``row`` and its first token already sent."""
        with self._lock:
            self._queued += 1
        self._inbox.put(("submit", _Running(request, emit, produced=1, row=row, first=first_token)))

    def cancel(self, rid: str) -> None:
        """Drop request ``rid`` (its client went away): its slot is free at the next iteration."""
        self._inbox.put(("cancel", rid))

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is not None:
            self._inbox.put(("stop", None))
            self._thread.join(timeout)
            self._thread = None

    def stats(self) -> dict:
        with self._lock:
            queued = self._queued
        return {"policy": self.policy, "slots": self.n_slots, "active": int(self.slots.active.sum()),
                "waiting": queued, "iterations": self.iterations, "error": self.error}

    def warmup(self) -> float:
        """Compile every program the policy will run (prefill or chunk widths, insert, step),
        so no request waits for the compiler. Returns the seconds it took."""
        t0 = now()
        if self.policy == "chunked":
            for width in chunk_widths(self.chunk_tokens):
                logits, row, _ = self.slots.prefill_chunk(self.slots.new_row(), [tokenizer.BOS] * width, width)
            self._insert_and_free(row)
        else:
            for width in prefill_widths(self.max_len):
                if self.policy == "decode-only":            # only the insert of each width
                    row = KVCache.create(self.model.cfg, 1, width)
                else:
                    logits, row = self.slots.prefill([tokenizer.BOS] * width)
                self._insert_and_free(row)
        if self.policy != "prefill-only":
            for width in self.slots.step_widths():       # each decode batch width, once
                self.slots.active[width - 1] = True
                greedy(self.slots.step())
                self.slots.active[width - 1] = False
            self.slots.cache = self.slots.cache.rewound(0)
        return now() - t0

    def _insert_and_free(self, row) -> None:
        self.slots.insert(0, row, tokenizer.BOS)
        self.slots.free(0)

    # -- the loop: the engine's thread only
    def _loop(self) -> None:
        try:
            while self._drain(block=not (self._running or self._waiting or self._prefilling)):
                self._iteration()
                self.iterations += 1
        except Exception as e:   # the model or a kernel failed: every request ends, with the reason
            self.error = f"{type(e).__name__}: {e}"
            for r in [*self._running.values(), *self._waiting] + ([self._prefilling] if self._prefilling else []):
                r.emit(TokenEvent(r.request.rid, -1, r.produced, now(), "error", self.error))

    def _drain(self, block: bool) -> bool:
        """Take in what other threads sent; False once asked to stop."""
        while True:
            try:
                kind, item = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if kind == "stop":
                return False
            if kind == "submit":
                self._waiting.append(item)
            else:
                self._drop(item)

    def _drop(self, rid: str) -> None:
        for slot, r in list(self._running.items()):
            if r.request.rid == rid:
                self._finish(r, "abort")
                return
        for r in list(self._waiting):
            if r.request.rid == rid:
                self._waiting.remove(r)
                self._dequeued()
                r.emit(TokenEvent(rid, -1, r.produced, now(), "abort"))
                return
        if self._prefilling is not None and self._prefilling.request.rid == rid:
            r, self._prefilling = self._prefilling, None
            self._dequeued()
            r.emit(TokenEvent(rid, -1, r.produced, now(), "abort"))

    def _dequeued(self) -> None:
        with self._lock:
            self._queued -= 1

    def _iteration(self) -> None:
        if self.policy == "decode-only":
            while self._waiting and self.slots.free_slots():
                r = self._waiting.popleft()
                self._dequeued()
                self._place(r, r.row, r.first)
            if self._running:
                self._decode()
            return
        if self.policy == "prefill-only":   # one prompt per iteration: a cancel is seen between two
            if not self._waiting:
                return
            r = self._waiting.popleft()
            self._dequeued()
            self._first_token(r, *self.slots.prefill(r.request.prompt))
            return
        if self.policy == "prefill-first":
            while self._waiting and self.slots.free_slots():
                r = self._waiting.popleft()
                self._dequeued()
                self._first_token(r, *self.slots.prefill(r.request.prompt))
            if self._running:
                self._decode()
            return
        if self._running:
            self._decode()
        if self._prefilling is None and self._waiting and len(self._running) < self.n_slots:
            self._prefilling = self._waiting.popleft()
            self._prefilling.row = self.slots.new_row()
        if self._prefilling is not None:
            r = self._prefilling
            room = max(self.chunk_tokens - len(self._running), 16)
            logits, r.row, _ = self.slots.prefill_chunk(r.row, r.request.prompt, room // 16 * 16)
            if logits is not None:
                self._prefilling = None
                self._dequeued()
                row, r.row = r.row, None
                self._first_token(r, logits, row)

    def _first_token(self, r: _Running, logits, row) -> None:
        token = self._sample(r, logits)
        if not self._emit(r, token):
            return
        if self.handoff is not None:
            self.handoff(r.request, token, row)
        else:
            self._place(r, row, token)

    def _place(self, r: _Running, row, token: int) -> None:
        r.slot, r.row = self.slots.free_slots()[0], None
        self.slots.insert(r.slot, row, token)
        self._running[r.slot] = r

    def _decode(self) -> None:
        logits = self.slots.step()
        greedy_rows = greedy(logits)
        for slot, r in list(self._running.items()):
            token = (int(greedy_rows[slot]) if r.request.temperature == 0
                     else self._sample(r, logits[slot:slot + 1]))
            if self._emit(r, token):
                self.slots.next_token[slot] = token

    def _sample(self, r: _Running, logits_row) -> int:
        q = r.request
        if q.temperature == 0:
            return int(greedy(logits_row)[0])
        return sample_row(logits_row, q.temperature, q.top_k, q.seed, r.produced)

    def _emit(self, r: _Running, token: int) -> bool:
        """Send the token; True while the request goes on."""
        index = r.produced
        r.produced += 1
        finish = r.request.finish_reason(token, index)
        if finish is None and len(r.request.prompt) + r.produced > self.max_len:
            finish = "length"   # no position left to feed it at (the server refuses such requests)
        r.emit(TokenEvent(r.request.rid, token, index, now(), finish))
        if finish is not None and r.slot >= 0:
            self._release(r)
        return finish is None

    def _finish(self, r: _Running, reason: str) -> None:
        r.emit(TokenEvent(r.request.rid, -1, r.produced, now(), reason))
        self._release(r)

    def _release(self, r: _Running) -> None:
        self._running.pop(r.slot, None)
        self.slots.free(r.slot)
        r.slot = -1


@functools.cache
def _unused_key():
    return jax.random.key(0)   # greedy sampling draws nothing; made once, not per step


def greedy(logits) -> np.ndarray:
    """The argmax of every row of float32 logits [B, V], on the host."""
    return np.asarray(engine.sample(logits, _unused_key(), 0.0))
