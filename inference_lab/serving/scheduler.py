"""The scheduler: which requests the next forward serves, and how many tokens each. Host logic
only (no jax), so it is read, and tested, without a model.

Every iteration of the engine is **one forward** over a token budget (vLLM v1's scheduler,
``max_num_batched_tokens``, counted in real tokens): a row for each request that is decoding (one
token each) and **chunks** of prompts, each of any length, packed back to back into the step's
chunk tokens. A chunk writes its K/V into its request's cache and attends to what the cache
holds, so a prompt can be prefilled a chunk at a time over several iterations, or whole in one.
A step is one compiled program of a few shapes: decode rows (:func:`decode_widths`) and chunk
tokens (:func:`token_counts`: each chunk rounded up to a :data:`PIECE` fits them; packed tight).

Policies:

* ``"chunked"`` (Sarathi-Serve, vLLM's default): each iteration every decoding request takes one
  token of the budget; the rest goes to prompts, oldest first: those already being prefilled,
  then waiting requests that get a free slot, each a chunk of as much of its remaining prompt as
  the budget has left. No iteration grows past the budget, so no inter-token gap grows past
  one budget-sized iteration.
* ``"prefill-first"`` (vLLM's first scheduler): when requests wait and slots are free, an
  iteration prefills whole prompts, as many as fit the budget and the free slots, and decodes
  nothing; otherwise it is one decode step of every running request. A long prompt stalls every
  running stream for as long as its prefill takes.
* ``"prefill-only"`` and ``"decode-only"``: the two pools of :mod:`inference_lab.serving.disaggregated`.
  The first prefills whole prompts as prefill-first does and keeps each finished prompt's slot
  until its cache is handed on (:meth:`Scheduler.release`); the second only decodes requests
  that arrive prefilled (:meth:`Scheduler.add` with ``arrived=True``).

The plan of an iteration (:class:`Step`) is made as if the iteration succeeds (a request's
counts move at once), so the engine can dispatch the next forward before it reads this one's
tokens: only an end-of-sequence token is news afterwards, and the engine drops that request then.

**The paged cache** (``kv=``, a :class:`~inference_lab.serving.blocks.PagedKV`): a slot is then only
a decode row, and memory is blocks. A request starts only when the pool could hold its whole
prompt (less what the prefix cache gave it) and still keep a block free per running request, for
their answers to grow into; it takes blocks as its chunks come, and each step grows the tables of
the requests it writes. When a decode row needs a block and none is free, the **newest** running request is
**preempted** (vLLM v1's recompute preemption): its blocks go back, and it returns to the front of
the queue to prefill its prompt and the tokens it had so far again, then goes on where it stopped;
a chunk of a prompt may preempt only requests newer than its own. The oldest request can always
preempt the others, and the pool holds one request of the full context, so every request finishes.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools

from inference_lab.serving.blocks import BlockTable, PagedKV
from inference_lab.serving.requests import Request, now

POLICIES = ("prefill-first", "chunked", "disaggregated")
ROLES = ("prefill-only", "decode-only")   # the two pools' schedulers (serving.disaggregated)
PIECE = 16                # the unit of a step's chunk tokens (and of the paged cache's blocks): Triton's smallest dot
DEFAULT_BUDGET = 64       # chunked: tokens per iteration, sized for the shipped models' 256-token context


@dataclasses.dataclass(eq=False)
class Sequence:
    """A request inside the engine. ``prefilled``: tokens of :meth:`prefill_tokens` scheduled into
    its cache; ``produced``: tokens scheduled to be sampled (the next one sampled is token
    ``produced``); ``delivered``: tokens whose event went out, ``output`` those tokens.
    ``finished``: nothing more will be sent. ``resumed_at``: how many output tokens it had when its
    prefill (re)started: 0, or more after a preemption (its prefill is then the prompt and those
    tokens). ``table``: its blocks, in a paged cache; ``order``: when it (re)started running."""

    request: Request
    emit: object
    slot: int = -1
    prefilled: int = 0
    produced: int = 0
    delivered: int = 0
    finished: bool = False
    arrival: tuple | None = None   # decode-only: (its cache rows, first token, called once inserted)
    cache_out: object = None       # prefill-only: the copy of its cache off the device, under way
    output: list = dataclasses.field(default_factory=list)
    resumed_at: int = 0
    table: BlockTable = dataclasses.field(default_factory=BlockTable)
    order: int = 0
    scheduled: float | None = None   # when it first got a slot (``now()``): its queue time ends there

    @property
    def rid(self) -> str:
        return self.request.rid

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt)

    @property
    def prefill_len(self) -> int:
        return self.prompt_len + self.resumed_at

    def prefill_tokens(self) -> list:
        """What its prefill writes: the prompt, and after a preemption the tokens it had so far."""
        return self.request.prompt + self.output[:self.resumed_at] if self.resumed_at else self.request.prompt

    def tokens(self) -> list:
        """The prompt and every token delivered so far (speculative decoding's draft reads them)."""
        return self.request.prompt + self.output

    def cache_length(self) -> int:
        """Positions of its cache that hold its tokens (where its next token is written)."""
        if self.prefilled < self.prefill_len:
            return self.prefilled
        return self.prompt_len + self.produced - 1

    def finish_reason(self, token: int, index: int, max_len: int) -> str | None:
        """Why the request ends after its token number ``index`` (0 = the first), or None: a stop
        token (end-of-sequence or one of ``stop_token_ids``, once ``min_tokens`` are out), or its length."""
        if index + 1 >= self.request.min_tokens and token in self.request.stop_tokens():
            return "stop"
        return "length" if index >= self.last_token(max_len) else None

    def last_token(self, max_len: int) -> int:
        """The index of the last token it may have: ``max_tokens - 1``, or fewer where the slot
        ends first (a token is fed at position prompt + index, which must lie inside the slot)."""
        return min(self.request.max_tokens, max_len - self.prompt_len + 1) - 1


@dataclasses.dataclass
class Chunk:
    """``len(tokens)`` prompt tokens of ``seq`` (any number from 1), written from position
    ``start``; ``samples``: the prompt's last chunk, whose last token's logits give the first
    output token."""

    seq: Sequence
    start: int
    tokens: list
    samples: bool


@dataclasses.dataclass
class Step:
    """One forward: decode rows for the slots ``0 .. decode_width - 1`` (``decode``: the
    sequences decoding among them; the other rows ride along and their work is dropped) and
    ``chunks``, their tokens back to back in ``chunk_tokens`` token places (the compiled shape;
    the places past the last chunk pad it); ``positions``: where each decode row's token is
    written (its request's cache length before the step). ``sampled`` lists, in head-row order,
    ``(head row, sequence, token index)`` for every token this step samples (head rows:
    ``0 .. decode_width - 1`` are the decode rows by slot, ``decode_width + i`` is chunk ``i``'s
    last token). ``arrivals``: decode-only sequences placed in their slots before this step.
    ``block_table``: with a paged cache, every slot's blocks ``[n_slots, blocks per request]``;
    ``budget``: the token budget it was planned in."""

    decode_width: int
    decode: list
    positions: list
    chunks: list
    chunk_tokens: int
    sampled: list
    arrivals: list = dataclasses.field(default_factory=list)
    block_table: object = None
    budget: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        """What selects the compiled program: (decode rows, chunk tokens)."""
        return self.decode_width, self.chunk_tokens

    @property
    def prompt_tokens(self) -> int:   # the real prompt tokens it computes: the budget counts these
        return sum(len(c.tokens) for c in self.chunks)


def decode_widths(n_slots: int) -> list[int]:
    """The decode batch widths a step compiles for: powers of two below ``n_slots``, then it."""
    widths, w = [], 1
    while w < n_slots:
        widths.append(w)
        w *= 2
    return widths + [n_slots]


def piece_counts(most: int) -> list[int]:
    """1, 2, 3, 4, then each a half or a third more than the last (6, 8, 12, 16, 24, 32, ...), up
    to ``most``: with a few programs, a step computes at most half again what it holds."""
    counts, n = [], 1
    while n < most:
        counts.append(n)
        n = n + 1 if n < 4 else n + n // 2 if n % 3 else n + n // 3
    return counts + [most]


def pieces_of(n_tokens: int) -> int:
    return -(-int(n_tokens) // PIECE)    # whole PIECE units that hold n_tokens


def token_counts(most: int) -> list[int]:
    """The chunk tokens a step compiles for, up to ``most`` rounded up to a :data:`PIECE`: 16, 32,
    48, 64, 96, 128, 192, 256, ... (:func:`piece_counts` pieces). Chunks fill them back to back."""
    return [PIECE * c for c in piece_counts(pieces_of(most))]


def chunk_rows(chunk_tokens: int, n_slots: int) -> int:
    """How many chunks a step of ``chunk_tokens`` holds: one per :data:`PIECE` of them, one per slot."""
    return max(1, min(n_slots, chunk_tokens // PIECE))


class Scheduler:
    """The waiting requests, the running ones by slot, and the plan of each iteration.

    ``policy`` as the module says (or one of :data:`ROLES`), ``n_slots`` slots of ``max_len``
    positions, ``budget`` tokens per iteration (``max_num_batched_tokens``); ``kv``: a paged cache's
    blocks (None: each slot owns ``max_len`` contiguous positions). ``budget_for(decode_rows)``:
    chunked only, each iteration's budget, at most ``budget`` (:mod:`inference_lab.serving.slo`)."""

    def __init__(self, policy: str, *, n_slots: int, max_len: int, budget: int, kv: PagedKV | None = None,
                 budget_for=None):
        if policy not in ("prefill-first", "chunked") + ROLES:
            raise ValueError(f"policy={policy!r}: a scheduler runs 'prefill-first', 'chunked' or a pool's role")
        if kv is not None and policy in ROLES:
            raise ValueError("the two pools hand on contiguous caches: a paged cache serves 'prefill-first' or 'chunked'")
        self.policy, self.n_slots, self.max_len, self.budget, self.kv = policy, n_slots, max_len, budget, kv
        self.budget_for = budget_for
        self.max_chunk_tokens = token_counts(budget)[-1]
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: dict[int, Sequence] = {}          # slot -> sequence (prefilling or decoding)
        self._free = list(range(n_slots))               # lowest first: running requests stay packed
        self._started = itertools.count()
        self.preemptions = 0
        self.preempted_tokens = 0    # cache positions preemption threw away (computed again later, unless cached)

    # -- requests in and out
    def add(self, seq: Sequence, *, arrived: bool = False) -> None:
        """Queue ``seq``; ``arrived``: a decode-only arrival, its prompt already in a cache of its
        own and its first token already sent."""
        if arrived:
            seq.prefilled, seq.produced, seq.delivered = seq.prompt_len, 1, 1
        self.waiting.append(seq)

    def remove(self, rid: str) -> Sequence | None:
        """Take request ``rid`` out wherever it is (its slot is free for the next step)."""
        for seq in self.waiting:
            if seq.rid == rid:
                self.waiting.remove(seq)
                return seq
        for seq in list(self.running.values()):
            if seq.rid == rid:
                self.release(seq)
                return seq
        return None

    def release(self, seq: Sequence) -> None:
        """``seq`` no longer needs its slot and blocks (finished, cancelled, or its cache handed on);
        a preempted one waiting to start again leaves the queue."""
        if seq.slot >= 0 and self.running.get(seq.slot) is seq:
            del self.running[seq.slot]
            self._free.append(seq.slot)
            self._free.sort()
        elif seq.slot < 0 and seq in self.waiting:
            self.waiting.remove(seq)
        if self.kv is not None:
            self.kv.free(seq.table)

    def held(self) -> list[Sequence]:
        return list(self.waiting) + list(self.running.values())

    def idle(self) -> bool:
        """Nothing to schedule until a request arrives (a prefill-only slot waiting for its hand-off
        asks for no rows)."""
        if self.waiting:
            return False
        return not any(s.prefilled < s.prefill_len or (self.policy != "prefill-only"
                                                       and s.produced <= s.last_token(self.max_len))
                       for s in self.running.values())

    def _place(self, seq: Sequence) -> None:
        seq.slot = self._free.pop(0)
        seq.order = next(self._started)
        if seq.scheduled is None:
            seq.scheduled = now()
        self.running[seq.slot] = seq

    # -- the paged cache: starting, growing, preempting
    def _start(self, seq: Sequence, n_tokens: int) -> Chunk | None:
        """The first chunk, of up to ``n_tokens`` tokens, of the waiting request ``seq``, placed in a
        free slot. With a paged cache, after the prefix cache gave it the blocks it holds, and only if
        the pool could hold its whole prompt and keep :attr:`PagedKV.watermark` blocks free (vLLM v0's
        rule: the running requests' answers grow into those, so a newcomer is not preempted as soon
        as it starts); it takes the blocks of its first chunk now, the rest as its chunks come.
        Else None, nothing taken: it waits."""
        if self.kv is not None:
            if seq.delivered < seq.produced:   # preempted with tokens still on their way: its prefill needs them
                return None
            tokens = seq.prefill_tokens()
            seq.prefilled = self.kv.match(seq.table, tokens)
            room = self.kv.pool.num_free - (self.kv.blocks_for(len(tokens)) - len(seq.table.blocks))
            first = min(seq.prefilled + n_tokens, len(tokens))
            if room < max(self.kv.watermark, len(self.running)) or not self.kv.grow(seq.table, first):
                self.kv.free(seq.table)
                seq.prefilled = 0
                return None
            self.kv.count_lookup(len(tokens), seq.prefilled)
        self.waiting.remove(seq)
        self._place(seq)
        return self._cut(seq, n_tokens)

    def _preempt(self, seq: Sequence) -> None:
        """Recompute preemption: ``seq`` gives back its slot and blocks and waits at the front of the
        queue; it starts again by prefilling its prompt and the tokens it had (``resumed_at``)."""
        self.preempted_tokens += seq.cache_length()
        self.release(seq)
        seq.slot, seq.prefilled, seq.resumed_at = -1, 0, seq.produced
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def _make_room(self, rows: list[Sequence]) -> list[Sequence]:
        """A block for each decode row's next position, the oldest request first; where none is free
        the newest running request is preempted (the row's own request last of all). Returns the rows
        still running.

        With prefix caching, a block that decoding filled is cached too, once its tokens are known
        (delivered) and written (by an earlier step): a preempted request then finds most of its
        text in the cache when it starts again, and a conversation's next turn finds its history."""
        if self.kv is None:
            return rows
        for seq in sorted(rows, key=lambda s: s.order):
            while seq.slot >= 0 and not self.kv.grow(seq.table, seq.cache_length() + 1):
                self._preempt(max(self.running.values(), key=lambda s: s.order))
            if seq.slot >= 0 and self.kv.pool.prefix_caching:
                known = seq.tokens()
                self.kv.filled(seq.table, known, min(seq.cache_length(), len(known)))
        return [s for s in rows if s.slot >= 0]

    def _grow_newest_first(self, seq: Sequence, n_positions: int) -> int:
        """Blocks for ``seq``'s first ``n_positions``, preempting requests newer than it while the pool
        is short, then as many as it has. Returns the positions ``seq``'s blocks then hold."""
        while not self.kv.grow(seq.table, n_positions):
            newer = [s for s in self.running.values() if s.order > seq.order]
            if not newer:
                held = (len(seq.table.blocks) + self.kv.pool.num_free) * self.kv.block_size
                self.kv.grow(seq.table, held)    # every free block (held < n_positions: this cannot fail)
                return held
            self._preempt(max(newer, key=lambda s: s.order))
        return n_positions

    def _next_waiting(self) -> Sequence | None:
        """The first waiting request that may start now. With prefix caching, a request that shares
        its prompt with another (``after``: a choice of an ``n > 1`` request) waits while that one's
        prompt is not all scheduled: then it finds the prompt's blocks in the cache instead of
        computing them a second time. The requests behind it in the queue are not held up."""
        sharing = self.kv is not None and self.kv.pool.prefix_caching
        if not sharing:
            return self.waiting[0] if self.waiting else None
        prefilling = {s.rid for s in self.running.values() if s.prefilled < s.prefill_len}
        prefilling |= {s.rid for s in self.waiting}
        for seq in self.waiting:
            if seq.request.after is None or seq.request.after not in prefilling:
                return seq
        return None

    # -- the plan
    def schedule(self) -> Step | None:
        """The next iteration's :class:`Step` (None: nothing to do), the counts moved as if it ran."""
        if self.policy == "decode-only":
            arrivals = []
            while self.waiting and self._free:
                seq = self.waiting.popleft()
                self._place(seq)
                arrivals.append(seq)
            step = self._decode_step()
            if step is not None:
                step.arrivals = arrivals
            elif arrivals:   # every arrival was already finished (max_tokens=1): nothing to decode
                step = Step(0, [], [], [], 0, [], arrivals)
            return step
        if self.policy in ("prefill-first", "prefill-only"):
            whole = self._whole_prompts()
            if whole or self.policy == "prefill-only":
                return whole
            return self._decode_step()
        return self._budget_step()

    def _decoding(self) -> list[Sequence]:
        return sorted((s for s in self.running.values() if s.prefilled == s.prefill_len
                       and s.produced <= s.last_token(self.max_len)), key=lambda s: s.slot)

    def _decode_step(self) -> Step | None:
        rows = self._make_room(self._decoding())
        if not rows:
            return None
        width = next(w for w in decode_widths(self.n_slots) if w > rows[-1].slot)
        return self._step(width, rows, [])

    def _chunk_tokens(self, chunks: list[Chunk]) -> int:
        """The compiled chunk tokens that hold ``chunks``, each rounded up to a :data:`PIECE`."""
        need = PIECE * sum(pieces_of(len(c.tokens)) for c in chunks)
        return next(t for t in token_counts(self.max_chunk_tokens) if t >= need)

    def _room(self, chunks: list[Chunk], used: int, budget: int) -> int:
        """The tokens one more chunk may take beside ``chunks`` (``used`` tokens): what the prompts'
        ``budget`` has left and what the places hold, each chunk rounded up to a :data:`PIECE`; one a
        slot. The places are the budget rounded up to a PIECE (at most the largest shape), so the
        step compiled for a budget is the step that runs: a latency target priced that one."""
        if len(chunks) >= self.n_slots:
            return 0
        places = min(self.max_chunk_tokens, PIECE * pieces_of(budget)) \
            - PIECE * sum(pieces_of(len(c.tokens)) for c in chunks)
        return max(0, min(budget - used, places))

    def _step(self, width: int, rows: list[Sequence], chunks: list[Chunk], budget: int = 0) -> Step:
        """The step of these rows and chunks. Its block table is read before the requests whose last
        token it samples give their blocks back: this step reads them, only the next may reuse them."""
        positions = [s.cache_length() for s in rows]
        table = None
        if self.kv is not None:
            table = self.kv.tables({slot: s.table for slot, s in self.running.items()}, self.n_slots)
        sampled = self._advance(rows) + self._chunk_rows(chunks, width)
        return Step(width, rows, positions, chunks, self._chunk_tokens(chunks) if chunks else 0, sampled,
                    block_table=table, budget=budget or self.budget)

    def _advance(self, rows: list[Sequence]) -> list:
        """Each decode row samples its request's next token; the requests whose last token that
        is free their slots at once (the step's rows are already fixed)."""
        sampled = []
        for seq in rows:
            sampled.append((seq.slot, seq, seq.produced))
            seq.produced += 1
            if seq.produced > seq.last_token(self.max_len):
                self.release(seq)
        return sampled

    def _cut(self, seq: Sequence, n_tokens: int) -> Chunk | None:
        """The next chunk of ``seq``'s prefill: up to ``n_tokens`` tokens (fewer if it needs fewer).
        With a paged cache the chunk needs its blocks: where the pool has too few, requests newer
        than ``seq`` are preempted, and if none is left the chunk is what the pool holds (None:
        nothing; ``seq`` goes on in a later step)."""
        tokens = seq.prefill_tokens()
        start = seq.prefilled
        end = min(start + max(int(n_tokens), 0), len(tokens))
        if self.kv is not None and end > start:
            end = min(end, self._grow_newest_first(seq, end))
        if end <= start:
            return None
        seq.prefilled = end
        if self.kv is not None:
            self.kv.filled(seq.table, tokens, seq.prefilled)
        return Chunk(seq, start, tokens[start:end], samples=end == len(tokens))

    def _chunk_rows(self, chunks: list[Chunk], width: int) -> list:
        sampled = []
        for i, chunk in enumerate(chunks):
            if chunk.samples:
                seq = chunk.seq
                sampled.append((width + i, seq, seq.resumed_at))
                seq.produced = seq.resumed_at + 1
                if seq.produced > seq.last_token(self.max_len) and self.policy != "prefill-only":
                    self.release(seq)
        return sampled

    def _whole_prompts(self) -> Step | None:
        """Prefill-first: whole prompts of waiting requests, FIFO, within the budget and the free
        slots (and blocks: a paged cache gives a request every block of its prompt before it starts)."""
        chunks, used = [], 0
        while self._free and (seq := self._next_waiting()) is not None:
            need = seq.prefill_len - seq.prefilled
            if need > self._room(chunks, used, self.budget):
                break
            got = self._start(seq, need)
            if got is None:
                break
            chunks.append(got)
            used += len(got.tokens)
        if not chunks:
            return None
        return self._step(0, [], chunks)

    def _budget_step(self) -> Step | None:
        """Chunked: every decoding request's row, then chunks of prompts with the tokens left."""
        preempted = self.preemptions
        rows = self._make_room(self._decoding())
        budget = self.budget if self.budget_for is None else min(self.budget, self.budget_for(len(rows)))
        room = budget - len(rows)
        chunks, used = [], 0
        prefilling = sorted((s for s in self.running.values() if s.prefilled < s.prefill_len),
                            key=lambda s: s.order)   # started earlier: continue them first
        for seq in prefilling:
            if seq.slot >= 0 and self._room(chunks, used, room):   # (not preempted by an older one's chunk)
                got = self._cut(seq, self._room(chunks, used, room))
                if got is not None:
                    chunks.append(got)
                    used += len(got.tokens)
        # no newcomer in a step that had to preempt (vLLM v1's rule): memory is short, and the one
        # preempted would otherwise start again at once, in the blocks just taken from it
        while self._free and self._room(chunks, used, room) and self.preemptions == preempted:
            seq = self._next_waiting()
            got = None if seq is None else self._start(seq, self._room(chunks, used, room))
            if got is None:
                break
            chunks.append(got)
            used += len(got.tokens)
        rows = [s for s in rows if s.slot >= 0]     # a chunk may have preempted a newer decoding request
        chunks = [c for c in chunks if c.seq.slot >= 0]
        if not chunks:
            return self._decode_step()
        width = self.n_slots   # with chunks, every slot rides along: one program per chunk-token count
        return self._step(width, rows, chunks, budget)

    def shapes(self) -> list[tuple[int, int]]:
        """Every (decode rows, chunk tokens) shape this policy's steps can take: what warm-up compiles."""
        decode = [(w, 0) for w in decode_widths(self.n_slots)]
        chunks = token_counts(self.max_chunk_tokens)
        if self.policy == "chunked":
            return decode + [(self.n_slots, t) for t in chunks]
        if self.policy == "prefill-first":
            return decode + [(0, t) for t in chunks]
        if self.policy == "prefill-only":
            return [(0, t) for t in chunks]
        return decode
