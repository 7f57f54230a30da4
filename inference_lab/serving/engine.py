"""The serving engine: requests in, tokens out, one forward per iteration, in a thread.

:meth:`Engine.submit` hands the engine a :class:`~inference_lab.serving.requests.Request` and a
callback; the engine's thread calls the callback with a
:class:`~inference_lab.serving.requests.TokenEvent` for every token, stamped with the time the
token reached the host, and ends every request with exactly one final event: its last token
(``"length"``/``"stop"``), or ``"abort"``/``"error"`` with the reason, whatever happens to the
engine (a cancel, :meth:`Engine.stop`, a failure inside the loop).

One iteration (vLLM v1's EngineCore, JetStream's orchestrator in one thread):

1. take in what other threads sent (submissions, cancels, a stop);
2. ask the :class:`~inference_lab.serving.scheduler.Scheduler` for the next step (decode rows and
   prompt chunks within the token budget) and **dispatch** it to the device
   (:meth:`~inference_lab.serving.slots.DecodeSlots.run`: one compiled forward, the sampling inside);
3. **then** read the tokens of the step before it and send them out. While the host does this
   (reading, sending events, scheduling the next step) the device is already computing, so with
   ``async_scheduling`` (the default, vLLM's ``--async-scheduling``) the device never waits on
   the host. The price: a request that ends with an end-of-sequence token has already been given
   a row in the step after; that row's token is thrown away.

Speculative decoding (``speculative=("ngram", k)``, vLLM's ``--speculative-config '{"method":
"ngram", "num_speculative_tokens": k}'``): an iteration with only decode rows becomes a verify
step (each row feeds its last token and up to ``k`` guesses from prompt lookup in one forward,
and keeps the leading guesses its own draws agree with: rejection sampling for a one-token draft,
so greedy and seeded sampled text alike are what they would be without it); it needs each row's
text so far, so those iterations run without the overlap.

The KV cache is contiguous slots by default; ``block_size``, ``num_kv_blocks``, ``kv_cache_memory``
or ``enable_prefix_caching`` (vLLM's names) make it paged (:mod:`inference_lab.serving.blocks`):
memory in blocks, as many requests running as their real lengths fit, recompute preemption when the
pool runs dry, and with prefix caching a prompt's cached leading blocks are not prefilled again.

``step_timeline=N`` keeps a record of each of the last N iterations
(:mod:`inference_lab.serving.timeline`); ``target_itl_ms`` (chunked) chooses each iteration's token
budget to hold an inter-token latency target (:mod:`inference_lab.serving.slo`). Both time every
step shape at warm-up: what a step of each shape costs on this machine.

The two pools (:mod:`inference_lab.serving.disaggregated`) run this loop in the roles
``"prefill-only"`` (prefill whole prompts, send the first token, hand the cache on through
``handoff``) and ``"decode-only"`` (requests arrive prefilled, :meth:`Engine.submit_prefilled`).
"""

from __future__ import annotations

import queue
import threading
import traceback

import numpy as np

from inference_lab.serving.blocks import paged_kv
from inference_lab.serving.requests import QueueFull, Request, TokenEvent, check_request, now
from inference_lab.serving.scheduler import DEFAULT_BUDGET, PIECE, POLICIES, ROLES, Scheduler, Sequence
from inference_lab.serving.slo import SLO_BUDGET, ItlBudget, check_target
from inference_lab.serving.slots import DecodeSlots
from inference_lab.serving.timeline import Timeline

SPECULATIVE_METHODS = ("ngram",)


class Engine:
    """The scheduler loop over :class:`DecodeSlots`, in a thread: ``policy`` as
    :mod:`inference_lab.serving.scheduler` says (or one of its ROLES), ``n_slots`` slots,
    ``max_num_batched_tokens`` the token budget of an iteration (chunked: default
    :data:`~inference_lab.serving.scheduler.DEFAULT_BUDGET`; prefill-first: the context, so any prompt
    fits whole), at most ``n_slots + max_queue`` requests held at once (then :class:`QueueFull`).
    A prefill-only engine calls ``handoff(request, first_token, copy)`` for each request that
    goes on, where ``copy(out)`` puts its cache into ``out`` and returns the padded width, and
    ``forward_cancel(rid)`` for a cancel of a request it no longer holds (handed on already).

    A paged cache: ``block_size`` positions a block (default 16), ``num_kv_blocks`` blocks (the
    null block included) or as many as ``kv_cache_memory`` holds (bytes, or a size such as
    ``"64MiB"``), by default the memory ``n_slots`` contiguous slots would take;
    ``enable_prefix_caching`` shares cached prompt blocks between requests."""

    def __init__(self, model, *, policy: str = "chunked", n_slots: int = 8, max_num_batched_tokens: int | None = None,
                 max_queue: int = 64, handoff=None, async_scheduling: bool = True, speculative: tuple | None = None,
                 forward_cancel=None, block_size: int | None = None, num_kv_blocks: int | None = None,
                 kv_cache_memory=None, enable_prefix_caching: bool = False, step_timeline: int = 0,
                 target_itl_ms: float | None = None):
        if policy not in POLICIES[:2] + ROLES:
            raise ValueError(f"policy={policy!r}: the in-process engine runs 'prefill-first' or 'chunked' "
                             "('disaggregated' is serving.disaggregated.TwoPoolEngine)")
        if (handoff is None) == (policy == "prefill-only"):
            raise ValueError("handoff is what a prefill-only engine calls, and only it")
        for name, value in (("n_slots", n_slots), ("max_queue", max_queue)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer >= 1")
        if not isinstance(async_scheduling, bool):
            raise ValueError(f"async_scheduling={async_scheduling!r} must be True or False")
        if target_itl_ms is not None and policy != "chunked":
            raise ValueError(f"target_itl_ms applies to the 'chunked' policy (it sizes the prompt chunks beside the "
                             f"decode rows); policy={policy!r} has no budget to choose")
        if target_itl_ms is not None:   # checked now, before anything is compiled
            check_target(target_itl_ms)
        self.model, self.policy, self.handoff, self.forward_cancel = model, policy, handoff, forward_cancel
        self.n_slots, self.max_queue = int(n_slots), int(max_queue)
        self.max_len = model.cfg.max_seq_len
        self.kv = paged_kv(model.cfg, policy=policy, n_slots=self.n_slots, block_size=block_size,
                           num_kv_blocks=num_kv_blocks, kv_cache_memory=kv_cache_memory,
                           prefix_caching=enable_prefix_caching, piece=PIECE)
        self.target_itl_ms = target_itl_ms
        self.budget = self._budget(max_num_batched_tokens)
        self.speculative = self._speculative(speculative)
        self.slots = DecodeSlots(model, self.n_slots, self.max_len,
                                 blocks=None if self.kv is None else (self.kv.pool.num_blocks, self.kv.block_size))
        self.async_scheduling = async_scheduling and self.speculative is None
        self.scheduler = Scheduler(policy, n_slots=self.n_slots, max_len=self.max_len, budget=self.budget, kv=self.kv)
        self._inbox = queue.SimpleQueue()       # ("submit", Sequence) | ("cancel", rid) | ("stop", reason)
        self._lock = threading.Lock()
        self._held = 0                          # submitted and not yet ended (the back-pressure count)
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self.stopped: str | None = None
        self.iterations = 0
        self.timeline = Timeline(step_timeline) if step_timeline else None
        # what times the steps: the timeline, or (a latency target alone) a record of the last step
        self._steps = self.timeline or (Timeline(1) if target_itl_ms is not None else None)
        self.step_costs: dict | None = None     # {shape: seconds}, measured at warm-up for the timeline and the SLO
        self.itl: ItlBudget | None = None
        self.proposed = self.accepted = 0       # speculative decoding: guesses checked, guesses kept
        self.drafts = 0                         # rows that were given guesses (vLLM's num_drafts)

    def _budget(self, budget) -> int:
        whole = self.max_len - 1                            # the longest prompt
        if budget is None:
            budget = (SLO_BUDGET if self.target_itl_ms else DEFAULT_BUDGET) if self.policy == "chunked" else whole
        if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
            raise ValueError(f"max_num_batched_tokens={budget!r} must be an integer")
        if self.policy == "chunked" and budget < self.n_slots + PIECE:
            raise ValueError(f"max_num_batched_tokens={budget} leaves under {PIECE} prompt tokens beside "
                             f"{self.n_slots} decode rows: make it at least {self.n_slots + PIECE}")
        if self.policy in ("prefill-first", "prefill-only") and budget < whole:
            raise ValueError(f"max_num_batched_tokens={budget} cannot hold a whole prompt of up to {self.max_len - 1} "
                             f"tokens, which prefill-first never cuts: make it at least {whole}, or use 'chunked'")
        return int(budget)

    def _speculative(self, spec):
        if spec is None:
            return None
        from inference_lab.runtime.speculative import NgramDraft

        method, k = spec
        if method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative method {method!r} is not one of {SPECULATIVE_METHODS}")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k < PIECE:
            raise ValueError(f"num_speculative_tokens={k!r} must be an integer in 1..{PIECE - 1}")
        if self.policy == "prefill-only":
            raise ValueError("a prefill-only engine decodes nothing: speculative decoding belongs to the decode pool")
        return NgramDraft(), int(k)

    # -- the outside: any thread
    def start(self) -> "Engine":
        if self.target_itl_ms is not None and self.itl is None:   # its budgets come from the measured steps
            self.warmup()
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="inference-lab-engine", daemon=True)
            self._thread.start()
        return self

    def check(self, request: Request) -> None:
        """One-line errors for a request the engine cannot serve (the API answers them 400 first)."""
        check_request(request, vocab_size=self.model.cfg.vocab_size, max_len=self.max_len)

    def submit(self, request: Request, emit) -> None:
        """Queue ``request``; ``emit(TokenEvent)`` is called from the engine's thread. A request
        the model cannot hold is refused here (ValueError), before it could reach the loop."""
        self.check(request)
        self._admit(Sequence(request, emit))

    def submit_prefilled(self, request: Request, emit, rows: np.ndarray, first_token: int, inserted=None) -> None:
        """A decode-only engine's arrival: ``request`` with its prompt's cache ``rows`` (as
        :meth:`DecodeSlots.insert` takes them) and its first token already sent;
        ``inserted(seconds)`` is called once the rows are on the device (their buffer may then be
        reused), with the seconds the copy took, or ``inserted(None)`` if the request ends first."""
        self.check(request)
        self._admit(Sequence(request, emit, arrival=(rows, int(first_token), inserted)))

    def _admit(self, seq: Sequence) -> None:
        # The check and the put under one lock: the loop's last drain (_end_all) takes it too, so a
        # submission is either in the inbox before that drain (and ended there) or refused here.
        with self._lock:
            if self.error is not None or self.stopped is not None:
                raise RuntimeError(f"the engine stopped: {self.error or self.stopped}")
            if self._held >= self.n_slots + self.max_queue:
                raise QueueFull(f"{self._held} requests are already held ({self.n_slots} slots, "
                                f"max_queue={self.max_queue})")
            self._held += 1
            self._inbox.put(("submit", seq))

    def cancel(self, rid: str) -> None:
        """Drop request ``rid`` (its client went away): its slot is free at the next iteration."""
        self._inbox.put(("cancel", rid))

    def stop(self, timeout: float = 10.0, reason: str = "the engine was stopped") -> None:
        """Stop the loop (waiting up to ``timeout`` for it); every request still held ends with
        ``"abort"`` and ``reason``. Later submissions are refused."""
        if self._thread is not None:
            self._inbox.put(("stop", reason))
            self._thread.join(timeout)
        else:   # never started: end what was submitted, here
            self._end_all("abort", reason)

    def stats(self) -> dict:
        with self._lock:
            held = self._held
        running = len(self.scheduler.running)
        out = {"policy": self.policy, "slots": self.n_slots, "active": running, "waiting": max(held - running, 0),
               "held": held, "iterations": self.iterations, "max_num_batched_tokens": self.budget,
               "async_scheduling": self.async_scheduling, "error": self.error,
               "preemptions": self.scheduler.preemptions, "preempted_tokens": self.scheduler.preempted_tokens,
               "kv_cache": {"layout": "contiguous", "slots": self.n_slots, "max_len": self.max_len}
               if self.kv is None else {"layout": "paged", **self.kv.stats()}}
        if self.speculative is not None:
            out["speculative"] = {"method": "ngram", "num_speculative_tokens": self.speculative[1],
                                  "drafts": self.drafts, "proposed": self.proposed, "accepted": self.accepted,
                                  "acceptance_rate": self.accepted / self.proposed if self.proposed else None}
        return out

    def warmup(self) -> float:
        """Compile every program this engine will run (each step shape its scheduler can make,
        the inserts or extracts of the two pools, the verify steps), so that no request ever waits
        for the compiler. Returns the seconds it took."""
        t0 = now()
        shapes = self.scheduler.shapes()
        self.slots.warmup(shapes, extracts=self.policy == "prefill-only",
                          inserts=self.policy == "decode-only", speculative=self.speculative[1] if self.speculative else 0)
        if self.timeline is not None or self.target_itl_ms is not None:
            self.step_costs = self.slots.time_shapes(shapes, context=self.max_len // 2, repeats=3, back_to_back=2)
        if self.target_itl_ms is not None:
            self.itl = ItlBudget(self.target_itl_ms / 1e3, self.step_costs, n_slots=self.n_slots, most=self.budget)
            self.scheduler.budget_for = self.itl.budget
        return now() - t0

    # -- the loop: the engine's thread only
    def _loop(self) -> None:
        pending = None               # (step, its tokens on the device): dispatched, not yet read
        step = None                  # the step planned now: its finishing requests left the scheduler
        wait = 0.0                   # how long the next drain may wait for a message
        try:
            while self._drain(wait):
                step = None
                step = self.scheduler.schedule()
                if step is not None and self.speculative and step.decode and not step.chunks:
                    if pending is not None:
                        self._deliver(*pending)
                        pending = None
                    self._insert(step)
                    started = now()
                    self._speculate(step)
                    self._record(step, "verify", started, self.iterations)
                elif step is not None:
                    self._insert(step)
                    started = now()
                    tokens = self.slots.run(step) if step.decode or step.chunks else None
                    if self.handoff is not None:   # each finished prompt's cache, queued behind its step
                        for chunk in step.chunks:
                            if chunk.samples:
                                chunk.seq.cache_out = self.slots.extract(chunk.seq.slot, chunk.seq.prompt_len)
                    if pending is not None:
                        self._deliver(*pending)
                    pending = (step, tokens, started, self.iterations)
                    if not self.async_scheduling:
                        self._deliver(*pending)
                        pending = None
                elif pending is not None:
                    self._deliver(*pending)
                    pending = None
                self.iterations += 1
                # Nothing on the device and nothing to run: sleep until a message comes (or, when
                # requests wait for a slot that a step will not free, look again shortly).
                idle = pending is None and step is None
                wait = (None if self.scheduler.idle() else 0.01) if idle else 0.0
        except Exception as e:   # the model, a kernel or a callback failed: every request ends, with the reason
            self.error = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            # the step being run when it failed counts too: a request whose last token it planned
            # has already left the scheduler (released at plan time) and would end nowhere else
            self._end_all("error", self.error, pending, step)
            return
        self._end_all("abort", self.stopped or "the engine was stopped", pending)

    def _drain(self, wait: float | None) -> bool:
        """Take in what other threads sent, waiting up to ``wait`` seconds (None: until something
        comes) for the first message; False once asked to stop."""
        while True:
            try:
                kind, item = self._inbox.get(block=wait != 0.0, timeout=wait)
            except queue.Empty:
                return True
            wait = 0.0
            if kind == "stop":
                self.stopped = item
                return False
            if kind == "submit":
                self.scheduler.add(item, arrived=item.arrival is not None)
            else:
                seq = self.scheduler.remove(item)
                if seq is not None:
                    self._end(seq, "abort", "")
                elif self.forward_cancel is not None:
                    self.forward_cancel(item)

    def _insert(self, step) -> None:
        """Decode-only: put the step's arrivals' caches into their slots before it runs."""
        for seq in step.arrivals:
            rows, first, inserted = seq.arrival
            t0 = now()
            self.slots.insert(seq.slot, rows, first)
            seq.arrival = None
            seq.output.append(first)
            if inserted is not None:
                inserted(now() - t0)

    def _deliver(self, step, out, started: float, iteration: int) -> None:
        """Send the tokens ``step`` (dispatched at ``started``, in loop iteration ``iteration``)
        sampled (in order, per request), and end what they finish. ``out``: (tokens,
        log-probabilities) as :meth:`DecodeSlots.run` returns them."""
        tokens, logprobs = out if out is not None else (None, None)
        tokens = np.asarray(tokens) if tokens is not None else None
        if tokens is not None:
            self._record(step, "step", started, iteration)
        if logprobs is not None and any(seq.request.logprobs is not None for _, seq, _ in step.sampled):
            logprobs = tuple(np.asarray(x) for x in logprobs)
        for row, seq, index in step.sampled:
            if seq.finished:        # ended meanwhile (a cancel, or an end-of-sequence token a step ago)
                continue
            if not self._send(seq, int(tokens[row]), index, logprobs, row):
                continue
            if index == 0 and self.handoff is not None:
                self.handoff(seq.request, int(tokens[row]), seq.cache_out)
                seq.cache_out = None
                self._retire(seq)

    def _record(self, step, kind: str, started: float, iteration: int) -> None:
        """The step's record in the timeline, and its measured time for the latency target."""
        if self._steps is None:
            return
        predicted = self.step_costs.get(step.shape) if self.step_costs and kind == "step" else None
        record = self._steps.add(
            iteration, started, now(), kind=kind, decode_rows=len(step.decode), prompt_tokens=step.prompt_tokens,
            chunks=len(step.chunks), shape=step.shape, budget=step.budget,
            blocks_used=None if self.kv is None else self.kv.pool.usable - self.kv.pool.num_free,
            waiting=len(self.scheduler.waiting), predicted_s=predicted)
        if self.itl is not None and kind == "step":
            self.itl.observe(predicted, record.seconds)

    def _send(self, seq: Sequence, token: int, index: int, logprobs=None, row: int = 0) -> bool:
        """Token ``index`` of ``seq`` out, with its log-probabilities where the request asked
        (``logprobs``: host arrays of :func:`generation.logprobs`, its row ``row``); True while the
        request goes on."""
        finish = seq.finish_reason(token, index, self.max_len)
        seq.delivered = index + 1
        seq.output.append(token)
        extra = {}
        if seq.request.logprobs is not None and logprobs is not None:
            chosen, top, ids = logprobs
            n = seq.request.logprobs
            extra = {"logprob": float(chosen[row]),
                     "top_logprobs": tuple((int(i), float(v)) for i, v in zip(ids[row, :n], top[row, :n]))}
        if index == 0:
            extra["scheduled"] = seq.scheduled
        self._call(seq, TokenEvent(seq.rid, token, index, now(), finish, **extra))
        if finish is not None:
            self._retire(seq)
            return False
        return True

    def _speculate(self, step) -> None:
        """A verify step instead of ``step``'s decode rows: each greedy row's guesses (prompt
        lookup on its text so far) checked in one forward; the kept ones and the model's next token
        sent. The scheduler moved each row by one token; the kept guesses move it further."""
        draft, k = self.speculative
        starts, guesses = [], []
        for (row, seq, index), at in zip(step.sampled, step.positions):
            room = min(k, seq.last_token(self.max_len) - index, self.max_len - 1 - at)
            # guesses for rows past their min_tokens (whose stop tokens are banned from each draw)
            # and without log-probabilities (given for the first token alone); greedy or sampled
            # alike: each kept guess is a draw of the row's own (_verify_jit)
            q = seq.request
            guessing = index >= q.min_tokens and q.logprobs is None
            if guessing and room > 0 and self.kv is not None:   # guesses only where blocks are free for them
                if not self.kv.grow(seq.table, at + 1 + room):
                    room = len(seq.table.blocks) * self.kv.block_size - at - 1
                step.block_table[seq.slot, :len(seq.table.blocks)] = seq.table.blocks
            guesses.append(draft.guess_row(seq.tokens(), room) if guessing and room > 0 else [])
            starts.append(at)
        chosen, right, logprobs = self.slots.verify(step.decode_width, step.sampled, starts, guesses, k,
                                                    step.block_table)
        if any(seq.request.logprobs is not None for _, seq, _ in step.sampled):
            logprobs = tuple(np.asarray(x) for x in logprobs)
        for (row, seq, index), g in zip(step.sampled, guesses):
            kept = int(right[row])
            self.proposed += len(g)
            self.accepted += kept
            self.drafts += bool(g)
            if kept:   # the scheduler counted one token; the kept guesses are more
                seq.produced += kept
                if seq.produced > seq.last_token(self.max_len):
                    self.scheduler.release(seq)
            for j in range(kept + 1):
                if seq.finished or not self._send(seq, int(chosen[row, j]), index + j, logprobs if j == 0 else None, row):
                    break

    def _call(self, seq: Sequence, event: TokenEvent) -> None:
        try:
            seq.emit(event)
        except Exception:   # a listener's bug must not stop the engine for everyone else
            traceback.print_exc()

    def _retire(self, seq: Sequence) -> None:
        """``seq`` is done here (its last event sent, or its cache handed on): its slot is free and
        it no longer counts against the bound."""
        seq.finished = True
        self.scheduler.release(seq)
        with self._lock:
            self._held -= 1

    def _end(self, seq: Sequence, finish: str, reason: str) -> None:
        """End ``seq`` without a token (``"abort"`` or ``"error"``, with the reason)."""
        if seq.finished:
            return
        if seq.arrival is not None:   # a decode-only arrival never inserted: its buffer is free again
            if seq.arrival[2] is not None:
                seq.arrival[2](None)
            seq.arrival = None
        self._call(seq, TokenEvent(seq.rid, -1, seq.delivered, now(), finish, reason))
        self._retire(seq)

    def _end_all(self, finish: str, reason: str, pending=None, failed=None) -> None:
        """Every request the engine holds ends: the scheduler's, those of the step that was still on
        the device (``pending``) or being run (``failed``), and those still in the inbox. Later
        submissions are refused: the refusal and the inbox's last drain happen under one lock, so a
        submission racing the stop is either drained here or refused (:meth:`_admit`)."""
        seqs = self.scheduler.held()
        for step in (pending[0] if pending is not None else None, failed):
            if step is not None:
                seqs += [seq for _, seq, _ in step.sampled] + [chunk.seq for chunk in step.chunks]
        with self._lock:
            if self.error is None and self.stopped is None:
                self.stopped = reason
            while True:
                try:
                    kind, item = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if kind == "submit":
                    seqs.append(item)
        for seq in seqs:
            self._end(seq, finish, reason)
