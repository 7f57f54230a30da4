"""The serving scheduler alone (no model, no jax): the token budget, whole prompts, the pools'
roles, and the bookkeeping an engine relies on, checked on random traffic.

A tiny stand-in for the device replays each plan: it keeps each slot's contents as token
positions, writes what every chunk and decode row writes, and checks what a step reads is what
the request wrote there, in order, exactly once. Every plan's shape must be one the warm-up
compiles (``Scheduler.shapes``).
"""

from __future__ import annotations

import random

import pytest

from inference_lab.base import tokenizer
from inference_lab.serving.requests import Request, TokenEvent, check_request
from inference_lab.serving.scheduler import (PIECE, Scheduler, Sequence, chunk_rows, decode_widths, piece_counts,
                                             token_counts)

MAX_LEN = 256


def _seq(rid, prompt_len, max_tokens, **kw):
    return Sequence(Request(str(rid), [tokenizer.BOS] + [65] * (prompt_len - 1), max_tokens, **kw), emit=None)


class Device:
    """What the slots would hold: per slot, the (request, position) written at each position."""

    def __init__(self, n_slots):
        self.rows = [dict() for _ in range(n_slots)]

    def run(self, step, sched):
        assert step.shape in sched.shapes(), f"{step.shape} is not compiled at warm-up"
        wd, n_tokens = step.shape
        assert step.prompt_tokens <= n_tokens and all(s.slot < wd for s in step.decode)
        assert len(step.chunks) <= (chunk_rows(n_tokens, sched.n_slots) if n_tokens else 0)
        assert PIECE * sum(-(-len(c.tokens) // PIECE) for c in step.chunks) <= n_tokens, "the attention's packing promise"
        assert all(c.tokens for c in step.chunks), "an empty chunk"
        assert len(step.decode) + step.prompt_tokens <= sched.budget, "the budget counts real tokens"
        slots = [s.slot for s in step.decode] + [c.seq.slot for c in step.chunks]
        assert len({s.slot for s in step.decode}) == len(step.decode)
        assert len({c.seq.slot for c in step.chunks}) == len(step.chunks), "two chunks of one request"
        for seq, at in zip(step.decode, step.positions):      # a decode row reads all before it
            row = self.rows[seq.slot]
            assert all(row.get(j) == (seq.rid, j) for j in range(at)), f"{seq.rid} reads a hole or a stranger"
            row[at] = (seq.rid, at)
        for chunk in step.chunks:
            row = self.rows[chunk.seq.slot]
            assert all(row.get(j) == (chunk.seq.rid, j) for j in range(chunk.start)), "a chunk before its prompt"
            for j in range(len(chunk.tokens)):
                row[chunk.start + j] = (chunk.seq.rid, chunk.start + j)
        return slots


def _serve(policy, n_slots, budget, seqs, rng, finish_early=0.0):
    """Run the scheduler to the end over ``seqs`` arriving at random steps; returns (steps,
    tokens sampled per request, the order requests got their first token)."""
    sched = Scheduler(policy, n_slots=n_slots, max_len=MAX_LEN, budget=budget)
    device = Device(n_slots)
    todo = list(seqs)
    sampled = {s.rid: [] for s in seqs}
    firsts, steps = [], 0
    while todo or not sched.idle():
        for _ in range(rng.randint(0, 2)):
            if todo:
                sched.add(todo.pop(0))
        step = sched.schedule()
        if step is None:
            assert todo or sched.idle()
            continue
        steps += 1
        # a slot given to a new request holds nothing it can read: forget what was there
        for chunk in step.chunks:
            if chunk.start == 0:
                device.rows[chunk.seq.slot] = {}
        device.run(step, sched)
        for row, seq, index in step.sampled:
            assert index == len(sampled[seq.rid]), "tokens sampled out of order"
            sampled[seq.rid].append(row)
            if index == 0:
                firsts.append(seq.rid)
            if not seq.finished and index < seq.last_token(MAX_LEN) and rng.random() < finish_early:
                seq.finished = True     # an end-of-sequence token: the engine releases it
                sched.release(seq)
        assert steps < 10_000
    return steps, sampled, firsts, sched


@pytest.mark.parametrize("policy,budget", [("chunked", 64), ("chunked", 24), ("prefill-first", 256)])
def test_random_traffic_every_token_once_in_order(policy, budget):
    rng = random.Random(budget)
    seqs = [_seq(i, rng.randint(1, 200), rng.randint(1, 40)) for i in range(120)]
    _, sampled, firsts, sched = _serve(policy, 8, budget, seqs, rng)
    for s in seqs:
        assert len(sampled[s.rid]) == min(s.request.max_tokens, MAX_LEN - s.prompt_len + 1), s.rid
        assert s.prefilled == s.prompt_len
    assert firsts == [s.rid for s in seqs], "first tokens out of arrival order (FCFS)"
    assert not sched.running and not sched.waiting and sorted(sched._free) == list(range(8))


def test_an_end_of_sequence_token_frees_the_slot_and_the_rest_goes_on():
    rng = random.Random(3)
    seqs = [_seq(i, rng.randint(1, 120), 60) for i in range(60)]
    _, sampled, _, sched = _serve("chunked", 4, 48, seqs, rng, finish_early=0.05)
    assert all(sampled[s.rid] for s in seqs) and not sched.running


def test_chunked_budget_counts_real_tokens():
    sched = Scheduler("chunked", n_slots=8, max_len=MAX_LEN, budget=64)
    long = _seq("long", 150, 5)
    sched.add(long)
    step = sched.schedule()
    assert step.shape == (8, 64) and [(c.start, len(c.tokens)) for c in step.chunks] == [(0, 64)] and not step.sampled
    for i in range(7):
        sched.add(_seq(i, 3, 50))
    step = sched.schedule()   # the long prompt goes on first and takes the whole budget: newcomers wait
    assert [(c.seq.rid, c.start, len(c.tokens)) for c in step.chunks] == [("long", 64, 64)]
    step = sched.schedule()   # its last 22 tokens sample its first; newcomers get chunks beside it while
    # the shape holds them, each rounded up to 16 places (22 -> 32, 3 -> 16: 64 places in all)
    assert [(c.seq.rid, len(c.tokens), c.samples) for c in step.chunks] == [("long", 22, True), ("0", 3, True),
                                                                            ("1", 3, True)]
    assert step.shape == (8, 64) and step.prompt_tokens == 28
    step = sched.schedule()   # 3 rows decode, 4 newcomers prefill (3 + 4 x 16 places = the budget)
    assert [s.rid for s in step.decode] == ["long", "0", "1"]
    assert [c.seq.rid for c in step.chunks] == ["2", "3", "4", "5"]


def test_a_chunk_takes_what_the_budget_has_left_beside_the_decode_rows():
    sched = Scheduler("chunked", n_slots=4, max_len=MAX_LEN, budget=40)
    a = _seq("a", 2, 20)
    sched.add(a)
    sched.schedule()                                   # a's prompt, 2 tokens
    b = _seq("b", 100, 5)
    sched.add(b)
    step = sched.schedule()                            # a decodes; b gets 40 - 1 tokens, real ones
    assert step.decode == [a] and [(c.seq.rid, len(c.tokens)) for c in step.chunks] == [("b", 39)]
    assert step.shape == (4, 48)                       # the smallest compiled count that holds 39
    step = sched.schedule()
    assert [(c.start, len(c.tokens)) for c in step.chunks] == [(39, 39)]


def test_a_per_iteration_budget_runs_the_step_it_was_priced_at():
    """A latency target prices the step of its budget's chunk tokens; chunks rounded up to a PIECE
    each must not spill into a larger compiled step (40 + 24 tokens would take 48 + 32 places)."""
    sched = Scheduler("chunked", n_slots=4, max_len=MAX_LEN, budget=256, budget_for=lambda rows: rows + 64)
    for rid, n in (("a", 40), ("b", 100)):
        sched.add(_seq(rid, n, 5))
    step = sched.schedule()
    assert [(c.seq.rid, len(c.tokens)) for c in step.chunks] == [("a", 40), ("b", 16)]
    assert step.shape == (4, 64)


def test_prefill_first_batches_whole_prompts_and_decodes_apart():
    sched = Scheduler("prefill-first", n_slots=8, max_len=MAX_LEN, budget=256)
    seqs = [_seq(i, n, 10) for i, n in enumerate([30, 20, 100, 90, 5])]
    for s in seqs:
        sched.add(s)
    step = sched.schedule()   # 30 + 20 + 100 = 150 tokens in 2 + 2 + 7 pieces of places; 90 (6 more) is past 16
    assert step.decode == [] and [c.seq.rid for c in step.chunks if c.samples] == ["0", "1", "2"]
    assert step.shape == (0, 192) and step.prompt_tokens == 150
    step = sched.schedule()
    assert step.decode == [] and [c.seq.rid for c in step.chunks] == ["3", "4"] and step.shape == (0, 128)
    step = sched.schedule()
    assert not step.chunks and [s.rid for s in step.decode] == ["0", "1", "2", "3", "4"] and step.decode_width == 8


def test_decode_width_follows_the_highest_busy_slot():
    sched = Scheduler("chunked", n_slots=8, max_len=MAX_LEN, budget=64)
    seqs = [_seq(i, 3, 100) for i in range(3)]
    for s in seqs:
        sched.add(s)
    sched.schedule()
    assert sched.schedule().decode_width == 4           # slots 0, 1, 2
    sched.release(seqs[2])
    assert sched.schedule().decode_width == 2
    sched.release(seqs[0])
    assert sched.schedule().decode_width == 2           # slot 1 still busy: a hole at 0 rides along


def test_the_pools_roles():
    pre = Scheduler("prefill-only", n_slots=2, max_len=MAX_LEN, budget=256)
    a, b, c = _seq("a", 40, 9), _seq("b", 40, 9), _seq("c", 40, 9)
    for s in (a, b, c):
        pre.add(s)
    step = pre.schedule()
    assert step.decode == [] and {c.seq.rid for c in step.chunks if c.samples} == {"a", "b"}
    assert pre.schedule() is None and set(pre.running) == {0, 1}   # held until handed on; c waits
    pre.release(a)
    assert [(ch.seq.rid, len(ch.tokens)) for ch in pre.schedule().chunks] == [("c", 40)] and c.slot == 0

    dec = Scheduler("decode-only", n_slots=2, max_len=MAX_LEN, budget=256)
    x = _seq("x", 40, 3)
    dec.add(x, arrived=True)
    step = dec.schedule()
    assert step.arrivals == [x] and step.decode == [x] and step.positions == [40] and step.sampled == [(0, x, 1)]
    assert dec.schedule().sampled == [(0, x, 2)] and dec.schedule() is None


def test_shapes_are_few():
    assert decode_widths(8) == [1, 2, 4, 8] and decode_widths(6) == [1, 2, 4, 6] and decode_widths(1) == [1]
    assert piece_counts(4) == [1, 2, 3, 4] and piece_counts(16) == [1, 2, 3, 4, 6, 8, 12, 16]
    assert piece_counts(1) == [1] and piece_counts(20) == [1, 2, 3, 4, 6, 8, 12, 16, 20]
    counts = piece_counts(64)
    assert all(b <= a * 1.5 for a, b in zip(counts[1:], counts[2:]))   # a step pads at most half again
    assert token_counts(64) == [16, 32, 48, 64] and token_counts(40) == [16, 32, 48]
    assert [chunk_rows(t, 8) for t in (16, 48, 64, 128, 256)] == [1, 3, 4, 8, 8]
    assert len(Scheduler("chunked", n_slots=8, max_len=256, budget=64).shapes()) == 8


def test_check_request_names_what_is_wrong():
    ok = dict(vocab_size=259, max_len=256)
    for request, word in ((Request("a", [], 4), "empty"), (Request("b", [1] * 256, 4), "max_len"),
                          (Request("c", [9999], 4), "vocabulary"), (Request("d", [1, 2], 0), "max_tokens"),
                          (Request("e", [1, 2], 4, temperature=-1.0), "temperature"),
                          (Request("f", [1, 2], 4, top_k=0), "top_k"), (Request("g", [1, 2], 4, seed=-1), "seed"),
                          (Request("h", "hello", 4), "list of token ids"), (Request("i", [True], 4), "integer"),
                          ("not a request", "Request")):
        with pytest.raises(ValueError, match=word):
            check_request(request, **ok)
    check_request(Request("fine", [1, 2, 3], 250, temperature=0.7, top_k=5, seed=2**63 - 1), **ok)
    assert TokenEvent("r", 5, 0, 1.0).finish is None
