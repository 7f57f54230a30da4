"""The step timeline (what every iteration held and cost) and the latency target that reads it.

The budget choice is checked on step costs measured on this kind of machine (a 2-core EPYC, the
serving lesson's model, 8 slots), with the counter-data that must move it and the noise that must
not; the engine's records are checked against what the requests themselves say they needed.
Nothing here times anything: the claims about latency are measured in docs/benchmarks.md and
notebook 09.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from inference_lab.serving import slo
from inference_lab.serving.engine import Engine
from inference_lab.serving.requests import Request
from inference_lab.serving.slo import ItlBudget
from inference_lab.serving.timeline import Timeline

# measured (ms) on a 2-core AMD EPYC: shakespeare_large, 8 slots, budget 256, context 128
MEASURED_MS = {(1, 0): 5.3, (2, 0): 6.1, (4, 0): 6.9, (8, 0): 8.8, (8, 16): 12.3, (8, 32): 16.0, (8, 48): 20.5,
               (8, 64): 22.0, (8, 96): 29.0, (8, 128): 33.7, (8, 192): 45.4, (8, 256): 55.7}
COSTS = {shape: ms / 1e3 for shape, ms in MEASURED_MS.items()}


def _budget(target_ms):
    return ItlBudget(target_ms / 1e3, COSTS, n_slots=8, most=256)


def test_the_budget_is_the_largest_step_that_fits_the_target():
    b = _budget(25)
    assert b.budget(3) == 3 + 64            # 22.0 ms fits 25; 96 tokens (29.0) would not
    assert _budget(30).budget(8) == 8 + 96
    assert b.budget(0) == 256               # nobody between two tokens: the largest step
    assert _budget(10).budget(1) == 1 + 16  # nothing fits 10 ms beside the rows: the smallest, so prompts move


def test_slow_steps_while_serving_shrink_the_budget_and_fast_ones_grow_it():
    slow, fast = _budget(25), _budget(25)
    for _ in range(slo.SETTLE):
        slow.observe(0.020, 0.020 * 1.2)      # the machine is busier than at warm-up
        fast.observe(0.020, 0.020 * 0.8)
    assert slow.budget(8) == 8 + 48 and fast.budget(8) == 8 + 96


def test_one_stall_in_a_hundred_steps_does_not_move_the_budget_but_a_slow_tail_does():
    b = _budget(25)
    for i in range(100):
        b.observe(0.020, 0.020 * (4.0 if i == 50 else 1.0))
    assert b.budget(8) == 8 + 64
    for i in range(100):                      # one step in ten is 30% slower: the quantile sees them
        b.observe(0.020, 0.020 * (1.3 if i % 10 == 0 else 1.0))
    assert b.ratio == pytest.approx(1.3) and b.budget(8) == 8 + 32   # 25 / 1.3 = 19.2 ms: 16.0 fits, 20.5 not


def test_too_few_steps_are_not_trusted():
    b = _budget(25)
    for _ in range(slo.SETTLE - 1):
        b.observe(0.020, 0.040)
    assert b.ratio == 1.0 and b.budget(8) == 8 + 64


@pytest.mark.parametrize("bad", [0, -5, float("nan"), float("inf"), "25", True])
def test_a_bad_target_is_one_line_naming_it(bad):
    with pytest.raises(ValueError, match="target_itl_ms"):
        slo.check_target(bad)


def test_a_step_measures_from_the_later_of_its_dispatch_and_the_last_step():
    t = Timeline(2)
    common = dict(kind="step", decode_rows=1, prompt_tokens=0, chunks=0, shape=(1, 0), budget=64, blocks_used=None,
                  waiting=0, predicted_s=None)
    a = t.add(0, start=10.0, end=10.5, **common)
    b = t.add(1, start=10.1, end=10.8, **common)   # dispatched while a ran (async): its time starts at a's end
    c = t.add(2, start=11.0, end=11.2, **common)   # dispatched after an idle gap: from its dispatch
    assert (a.seconds, b.seconds, c.seconds) == (0.5, pytest.approx(0.3), pytest.approx(0.2))
    assert [r.iteration for r in t.records()] == [1, 2]          # the last two kept
    with pytest.raises(ValueError, match="step_timeline"):
        Timeline(0)


def _serve(engine, prompts, max_tokens):
    done, left = threading.Event(), [len(prompts)]
    tokens = {}

    def emit_for(i):
        def emit(ev):
            if ev.token >= 0:
                tokens[i] = tokens.get(i, 0) + 1
            if ev.finish:
                left[0] -= 1
                if not left[0]:
                    done.set()
        return emit

    for i, p in enumerate(prompts):
        engine.submit(Request(str(i), p, max_tokens, stop_at_eos=False), emit_for(i))
    assert done.wait(120)
    return tokens


def test_the_engines_records_account_for_every_prompt_token_and_every_decode_row(tmp_path):
    from inference_lab.serving.models import load_model

    engine = Engine(load_model("shakespeare"), n_slots=4, max_num_batched_tokens=48, step_timeline=1000,
                    block_size=16)
    engine.warmup()
    assert set(engine.step_costs) == set(engine.scheduler.shapes()) and all(s > 0 for s in engine.step_costs.values())
    engine.start()
    rng = np.random.default_rng(0)
    prompts = [[1] + rng.integers(3, 250, n).tolist() for n in (5, 70, 130, 17, 40, 3)]
    tokens = _serve(engine, prompts, 9)
    engine.stop()
    records = engine.timeline.records()
    assert sum(r.prompt_tokens for r in records) == sum(len(p) for p in prompts)
    # each request's first token comes from its prompt's last chunk, the other 8 from decode rows
    assert sum(r.decode_rows for r in records) == sum(tokens.values()) - len(prompts) == 8 * len(prompts)
    assert all(r.kind == "step" and r.predicted_s == engine.step_costs[r.shape] and r.seconds > 0 for r in records)
    assert all(r.decode_rows + r.prompt_tokens <= r.budget == 48 for r in records)
    assert all(r.blocks_used is not None for r in records)
    assert [r.iteration for r in records] == sorted(r.iteration for r in records)
    path = tmp_path / "steps.jsonl"
    assert engine.timeline.save(path) == len(records)
    first = json.loads(path.read_text().splitlines()[0])
    assert first["shape"] == list(records[0].shape) and first["prompt_tokens"] == records[0].prompt_tokens


def test_a_latency_target_is_for_chunked_prefill_and_sets_each_steps_budget():
    from inference_lab.serving.models import load_model

    model = load_model("shakespeare")
    with pytest.raises(ValueError, match="target_itl_ms applies to the 'chunked' policy"):
        Engine(model, policy="prefill-first", target_itl_ms=20)
    with pytest.raises(ValueError, match="target_itl_ms"):
        Engine(model, target_itl_ms=-1)
    engine = Engine(model, n_slots=4, target_itl_ms=1e6, step_timeline=100)   # a target every step fits
    assert engine.budget == 256
    engine.start()                                   # measures its steps first: the budgets come from them
    assert engine.itl is not None and engine.scheduler.budget_for == engine.itl.budget
    rng = np.random.default_rng(1)
    _serve(engine, [[1] + rng.integers(3, 250, 200).tolist(), [1, 5, 6]], 20)
    engine.stop()
    records = engine.timeline.records()
    assert {r.budget for r in records if r.prompt_tokens} <= {256, 4 + 256}
    assert max(r.prompt_tokens for r in records) > 64   # the largest steps, where a fixed 64 would cut them


# ----------------------------------------------------------------------------- notebook 09's reading of it
def _record(i, end, seconds, rows, prompt, predicted):
    """A step record, dispatched ``seconds`` before its ``end`` (late, if the step before ended earlier)."""
    from inference_lab.serving.timeline import StepRecord
    return StepRecord(i, end - seconds, end, seconds, "step", rows, prompt, 1 if prompt else 0,
                      (8, 64 if prompt else 0), 64, None, 0, predicted)


def _trace(token_times):
    from inference_lab.analytic.serving_metrics import trace_from_token_times
    from inference_lab.analytic.workload import Requests
    n = len(token_times)
    return trace_from_token_times("t", Requests(np.zeros(n), np.full(n, 10), np.full(n, 5)), token_times)


def test_the_worst_gap_is_matched_to_the_step_that_made_it_and_its_cause_named():
    from inference_lab.lessons import step_timeline as lesson

    start = 100.0
    records = [_record(0, 100.010, 0.010, 2, 0, 0.010), _record(1, 100.040, 0.030, 2, 60, 0.028),
               _record(2, 100.050, 0.010, 2, 0, 0.010), _record(3, 100.090, 0.040, 2, 0, 0.010),
               _record(4, 100.115, 0.020, 2, 0, 0.019)]   # dispatched 5 ms after step 3 ended
    # two requests decoding side by side: each of steps 1, 3 and 4 delays both
    trace = _trace([[0.010, 0.040, 0.050, 0.090, 0.115], [0.010, 0.040, 0.050, 0.090]])   # relative to start
    lines = lesson.worst_gaps(trace, records, start, n=3)
    assert lines[0].startswith("40.0 ms gap at 0.09 s <- step 3: 2 decode rows; 40.0 ms")
    assert "(x4.00, slower than its shape: the machine was slow" in lines[0] and "host" not in lines[0]
    assert lines[1].startswith("30.0 ms gap at 0.04 s <- step 1: 2 decode rows + 60 prompt tokens in 1 chunk")
    assert "what its shape costs" in lines[1]
    assert lines[2].startswith("25.0 ms gap at 0.11 s <- step 4") and "what its shape costs" in lines[2]
    assert "dispatched 5.0 ms after the step before it ended (the host was late)" in lines[2]
    when, ms, steps = lesson.plot_inputs(trace, records, start)
    assert len(ms) == 7 and len(steps) == 5 and steps[1]["prompt_tokens"] == 60


def test_the_lesson_target_lies_between_the_fixed_budgets_and_its_queue_waits_at_once():
    from inference_lab.lessons import step_timeline as lesson

    runs = {"budget 32": (_flat_trace(10.0, 2), [], 0.0), "budget 192": (_flat_trace(40.0, 2), [], 0.0)}
    assert lesson.target_between(runs) == pytest.approx(1.5 * 20.0)     # p99s 15 and 60 ms
    queue = lesson.queue_trace()
    assert len(queue) == lesson.QUEUE and not queue.arrival.any()
    assert queue.prompt_len.min() >= 160 and queue.prompt_len.max() <= 220


def _flat_trace(itl_ms, n_requests, n_gaps=200):
    """``n_requests`` streams side by side, every gap ``itl_ms`` but one in twenty at 1.5x: ITL p99
    is 1.5 x ``itl_ms``, and the tokens a second ``n_requests / itl`` (a little less)."""
    gaps = np.full(n_gaps, itl_ms / 1e3)
    gaps[::20] *= 1.5
    t = np.concatenate([[0.0], np.cumsum(gaps)]).tolist()
    return _trace([t] * n_requests)


def test_the_target_verdicts_decide_both_ways():
    from inference_lab.lessons import step_timeline as lesson

    held = _flat_trace(20.0, 1)                      # ITL p99 30 ms
    assert lesson.target_holds(held, 28.0).holds is True
    assert lesson.target_holds(held, 20.0).holds is False
    assert lesson.target_holds(held, 27.0, u=1.2).holds is None
    target = (_flat_trace(18.0, 4), [], 0.0)           # p99 27 ms, ~210 tok/s
    runs = {"target": target, "budget 32": (_flat_trace(12.0, 2), [], 0.0),     # meets it, ~160 tok/s
            "budget 64": (_flat_trace(24.0, 6), [], 0.0)}                       # ~240 tok/s, misses it (36 ms)
    assert lesson.fixed_budgets_miss_or_waste(runs, "target", 26.0).holds is True
    runs["budget 32"] = (_flat_trace(12.0, 4), [], 0.0)                          # meets it and is faster
    assert lesson.fixed_budgets_miss_or_waste(runs, "target", 26.0).holds is False
    assert lesson.fixed_budgets_miss_or_waste(runs, "target", 26.0, u=2.0).holds is None


def test_the_worked_problems_rule_reads_the_engines_costs_and_correction_and_the_records_its_choices():
    from types import SimpleNamespace

    from inference_lab.lessons import step_timeline as lesson

    rule = _budget(30)
    engine = SimpleNamespace(itl=rule, n_slots=8)
    assert lesson.target_rule(engine)["chunk"] == 96            # 29.0 ms fits 30
    for _ in range(slo.SETTLE):
        rule.observe(0.020, 0.026)                               # the steps ran x1.3: 30 / 1.3 = 23 ms
    seen = lesson.target_rule(engine)
    assert seen["ratio"] == pytest.approx(1.3) and seen["chunk"] == 64 and seen["costs"][64] == pytest.approx(22.0)
    records = [_record(0, 1.0, 0.02, 3, 60, 0.02), _record(1, 1.1, 0.02, 0, 64, 0.02),   # no decode rows: not counted
               _record(2, 1.2, 0.02, 7, 64, 0.02), _record(3, 1.3, 0.01, 7, 0, 0.01)]    # no prompt: not counted
    assert lesson.chunks_taken(records) == {57: 1, 61: 1}       # budgets of 64 less 7 and 3 decode rows
