"""The scheduler: which requests the next forward serves, and how many tokens each. Host logic
only (no jax), so it is read, and tested, without a model.

Every iteration of the engine is **one forward** over a token budget (vLLM v1's scheduler,
``max_num_batched_tokens``): a row for each request that is decoding (one token each) and
**pieces** of prompts (:data:`PIECE` tokens each, the last one of a prompt padded), packed into
one compiled program of a few bucketed shapes (:func:`piece_counts`, :func:`decode_widths`).
A piece writes its K/V into its request's slot and attends to what the slot holds, so a prompt
can be prefilled a piece at a time over several iterations, or whole in one.

Policies:

* ``"chunked"`` (Sarathi-Serve, vLLM's default): each iteration every decoding request takes one
  token of the budget; the rest, in whole pieces, goes to prompts, oldest first: those already
  being prefilled, then waiting requests that get a free slot, each as many pieces as its
  remaining prompt needs. No iteration grows past the budget, so no inter-token gap grows past
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
"""

from __future__ import annotations

import collections
import dataclasses
import time

from inference_lab.base import checks, tokenizer

POLICIES = ("prefill-first", "chunked", "disaggregated")
ROLES = ("prefill-only", "decode-only")   # the two pools' schedulers (serving.disaggregated)
PIECE = 16                # prompt tokens per piece: Triton's smallest dot, and the unit of the budget
DEFAULT_BUDGET = 64       # chunked: tokens per iteration, sized for the shipped models' 256-token context


class QueueFull(Exception):
    """The engine holds as many requests as it may: the server answers 429 rather than queue without bound."""


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


@dataclasses.dataclass(frozen=True)
class TokenEvent:
    """Token ``index`` of request ``rid`` reached the host at ``time`` (``time.perf_counter``,
    a system-wide monotonic clock on Linux, so worker processes' stamps compare). ``finish``:
    ``"length"``/``"stop"`` on the last token; ``"abort"`` (a cancel, or the engine stopping) and
    ``"error"`` (the engine failed) end a request without one: ``token`` is then -1 and ``error``
    says why (empty for a cancel the client asked for)."""

    rid: str
    token: int
    index: int
    time: float
    finish: str | None = None
    error: str = ""


def now() -> float:
    return time.perf_counter()


def check_request(request: Request, *, vocab_size: int, max_len: int) -> None:
    """One-line errors for a request no engine of this model can serve (the API answers them 400
    first); every engine runs it at ``submit``, before the request could reach a worker loop."""
    if not isinstance(request, Request):
        raise ValueError(f"request must be a serving.scheduler.Request, got {type(request).__name__}")
    rid = request.rid
    try:
        prompt = checks.token_ids("prompt", request.prompt, vocab_size)
    except ValueError as err:
        raise ValueError(f"request {rid}: {err}") from None
    if len(prompt) >= max_len:
        raise ValueError(f"request {rid}: a prompt of {len(prompt)} tokens leaves no room in max_len={max_len}; "
                         "shorten it")
    if isinstance(request.max_tokens, bool) or not isinstance(request.max_tokens, int) or request.max_tokens < 1:
        raise ValueError(f"request {rid}: max_tokens={request.max_tokens!r} must be a positive integer")
    try:
        checks.sampling(request.temperature, request.top_k, vocab_size)
        checks.seed("seed", request.seed)
        checks.flag("stop_at_eos", request.stop_at_eos)
    except ValueError as err:
        raise ValueError(f"request {rid}: {err}") from None


@dataclasses.dataclass(eq=False)
class Sequence:
    """A request inside the engine. ``prefilled``: prompt tokens scheduled into its slot;
    ``produced``: tokens scheduled to be sampled (the next one sampled is token ``produced``);
    ``delivered``: tokens whose event went out. ``finished``: nothing more will be sent."""

    request: Request
    emit: object
    slot: int = -1
    prefilled: int = 0
    produced: int = 0
    delivered: int = 0
    finished: bool = False
    arrival: tuple | None = None   # decode-only: (its cache rows, first token, called once inserted)
    cache_out: object = None       # prefill-only: the copy of its cache off the device, under way
    history: list | None = None    # speculative decoding: prompt and tokens so far, for the draft

    @property
    def rid(self) -> str:
        return self.request.rid

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt)

    def cache_length(self) -> int:
        """Positions of the slot that hold this request's tokens (where its next token is written)."""
        if self.prefilled < self.prompt_len:
            return self.prefilled
        return self.prompt_len + self.produced - 1

    def finish_reason(self, token: int, index: int, max_len: int) -> str | None:
        """Why the request ends after its token number ``index`` (0 = the first), or None."""
        if self.request.stop_at_eos and token == tokenizer.EOS:
            return "stop"
        return "length" if index >= self.last_token(max_len) else None

    def last_token(self, max_len: int) -> int:
        """The index of the last token it may have: ``max_tokens - 1``, or fewer where the slot
        ends first (a token is fed at position prompt + index, which must lie inside the slot)."""
        return min(self.request.max_tokens, max_len - self.prompt_len + 1) - 1


@dataclasses.dataclass
class Piece:
    """``len(tokens)`` (<= PIECE) prompt tokens of ``seq``, written from position ``start``;
    ``samples``: the prompt's last piece, whose last token's logits give the first output token."""

    seq: Sequence
    start: int
    tokens: list
    samples: bool


@dataclasses.dataclass
class Step:
    """One forward: decode rows for the slots ``0 .. decode_width - 1`` (``decode``: the
    sequences decoding among them; the other rows ride along and their work is dropped) and
    ``pieces``, padded to ``piece_count`` for the compiled shape; ``positions``: where each decode
    row's token is written (its request's cache length before the step). ``sampled`` lists, in head-row
    order, ``(head row, sequence, token index)`` for every token this step samples (head rows:
    ``0 .. decode_width - 1`` are the decode rows by slot, ``decode_width + i`` is piece ``i``'s
    last token). ``arrivals``: decode-only sequences placed in their slots before this step."""

    decode_width: int
    decode: list
    positions: list
    pieces: list
    piece_count: int
    sampled: list
    arrivals: list = dataclasses.field(default_factory=list)

    @property
    def shape(self) -> tuple[int, int]:
        """What selects the compiled program: (decode rows, pieces)."""
        return self.decode_width, self.piece_count


def decode_widths(n_slots: int) -> list[int]:
    """The decode batch widths a step compiles for: powers of two below ``n_slots``, then it."""
    widths, w = [], 1
    while w < n_slots:
        widths.append(w)
        w *= 2
    return widths + [n_slots]


def piece_counts(most: int) -> list[int]:
    """The piece counts a step compiles for, up to ``most``: 1, 2, 3, 4, then each a half or a
    third more than the last (6, 8, 12, 16, 24, 32, ...): a step computes at most half again the
    pieces it holds, with a few programs."""
    counts, n = [], 1
    while n < most:
        counts.append(n)
        n = n + 1 if n < 4 else n + n // 2 if n % 3 else n + n // 3
    return counts + [most]


def pieces_of(n_tokens: int) -> int:
    return -(-int(n_tokens) // PIECE)


class Scheduler:
    """The waiting requests, the running ones by slot, and the plan of each iteration.

    ``policy`` as the module says (or one of :data:`ROLES`), ``n_slots`` slots of ``max_len``
    positions, ``budget`` tokens per iteration (``max_num_batched_tokens``)."""

    def __init__(self, policy: str, *, n_slots: int, max_len: int, budget: int):
        if policy not in ("prefill-first", "chunked") + ROLES:
            raise ValueError(f"policy={policy!r}: a scheduler runs 'prefill-first', 'chunked' or a pool's role")
        self.policy, self.n_slots, self.max_len, self.budget = policy, n_slots, max_len, budget
        self.max_pieces = budget // PIECE
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: dict[int, Sequence] = {}          # slot -> sequence (prefilling or decoding)
        self._free = list(range(n_slots))               # lowest first: running requests stay packed

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
        """``seq`` no longer needs its slot (finished, cancelled, or its cache handed on)."""
        if seq.slot >= 0 and self.running.get(seq.slot) is seq:
            del self.running[seq.slot]
            self._free.append(seq.slot)
            self._free.sort()

    def held(self) -> list[Sequence]:
        return list(self.waiting) + list(self.running.values())

    def idle(self) -> bool:
        """Nothing to schedule until a request arrives (a prefill-only slot waiting for its hand-off
        asks for no rows)."""
        if self.waiting:
            return False
        return not any(s.prefilled < s.prompt_len or (self.policy != "prefill-only"
                                                      and s.produced <= s.last_token(self.max_len))
                       for s in self.running.values())

    def _place(self, seq: Sequence) -> None:
        seq.slot = self._free.pop(0)
        self.running[seq.slot] = seq

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
        return sorted((s for s in self.running.values() if s.prefilled == s.prompt_len
                       and s.produced <= s.last_token(self.max_len)), key=lambda s: s.slot)

    def _decode_step(self) -> Step | None:
        rows = self._decoding()
        if not rows:
            return None
        width = next(w for w in decode_widths(self.n_slots) if w > rows[-1].slot)
        positions = [s.cache_length() for s in rows]
        return Step(width, rows, positions, [], 0, self._advance(rows))

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

    def _cut(self, seq: Sequence, n_pieces: int) -> list[Piece]:
        """The next ``n_pieces`` pieces of ``seq``'s prompt (fewer if it needs fewer)."""
        out = []
        prompt = seq.request.prompt
        for _ in range(n_pieces):
            if seq.prefilled >= seq.prompt_len:
                break
            start = seq.prefilled
            tokens = prompt[start:start + PIECE]
            seq.prefilled += len(tokens)
            out.append(Piece(seq, start, tokens, samples=seq.prefilled == seq.prompt_len))
        return out

    def _piece_rows(self, pieces: list[Piece], width: int) -> list:
        sampled = []
        for i, piece in enumerate(pieces):
            if piece.samples:
                seq = piece.seq
                sampled.append((width + i, seq, 0))
                seq.produced = 1
                if seq.last_token(self.max_len) == 0 and self.policy != "prefill-only":
                    self.release(seq)
        return sampled

    def _whole_prompts(self) -> Step | None:
        """Prefill-first: whole prompts of waiting requests, FIFO, within the budget and free slots."""
        pieces = []
        while self.waiting and self._free:
            need = pieces_of(self.waiting[0].prompt_len)
            if len(pieces) + need > self.max_pieces:
                break
            seq = self.waiting.popleft()
            self._place(seq)
            pieces += self._cut(seq, need)
        if not pieces:
            return None
        count = next(c for c in piece_counts(self.max_pieces) if c >= len(pieces))
        return Step(0, [], [], pieces, count, self._piece_rows(pieces, 0))

    def _budget_step(self) -> Step | None:
        """Chunked: every decoding request's row, then pieces of prompts with what is left."""
        rows = self._decoding()
        positions = [s.cache_length() for s in rows]
        room = (self.budget - len(rows)) // PIECE
        pieces = []
        prefilling = sorted((s for s in self.running.values() if s.prefilled < s.prompt_len),
                            key=lambda s: s.slot)   # started earlier: continue them first
        for seq in prefilling:
            pieces += self._cut(seq, room - len(pieces))
        while self.waiting and self._free and len(pieces) < room:
            seq = self.waiting.popleft()
            self._place(seq)
            pieces += self._cut(seq, room - len(pieces))
        if not pieces:
            return self._decode_step()
        count = next(c for c in piece_counts(self.max_pieces) if c >= len(pieces))
        width = self.n_slots   # with pieces, every slot rides along: one program per piece count
        return Step(width, rows, positions, pieces, count, self._advance(rows) + self._piece_rows(pieces, width))

    def shapes(self) -> list[tuple[int, int]]:
        """Every (decode rows, pieces) shape this policy's steps can take: what warm-up compiles."""
        decode = [(w, 0) for w in decode_widths(self.n_slots)]
        pieces = piece_counts(self.max_pieces)
        if self.policy == "chunked":
            return decode + [(self.n_slots, c) for c in pieces]
        if self.policy == "prefill-first":
            return decode + [(0, c) for c in pieces]
        if self.policy == "prefill-only":
            return [(0, c) for c in pieces]
        return decode
