"""Notebooks 06, 07 and 09 word their comparisons from the numbers they print (issue 36).

Two kinds of test:

* the lesson functions that write those sentences, on hand-made data where the right wording is
  known (they run anywhere, in a moment);
* the STORED notebooks: every generated sentence is parsed beside the numbers printed with it,
  and the test fails where the sentence names the wrong policy, the wrong count or the wrong
  comparison. These read the outputs stored in ``notebooks/*.ipynb``, so they hold only once the
  notebooks have been executed with the current lesson code.
"""

from __future__ import annotations

import json
import math
import re
import types
from pathlib import Path

import numpy as np
import pytest

from inference_lab.analytic.serving_metrics import trace_from_token_times
from inference_lab.analytic.workload import Requests
from inference_lab.lessons import on_your_machine as classroom
from inference_lab.lessons import one_model_two_speeds as two_speeds
from inference_lab.lessons import serving_economics as economics
from inference_lab.lessons import serving_engine as engine
from inference_lab.measure import records

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


# ============================================================================= helpers
def _output(name: str, marker: str) -> str:
    """Everything the code cell of notebook ``name`` whose source holds ``marker`` printed or
    displayed (stream text, then markdown), as stored."""
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    cells = [c for c in nb["cells"] if c["cell_type"] == "code" and marker in "".join(c["source"])]
    assert len(cells) == 1, f"{name}: {len(cells)} code cells hold {marker!r}"
    out = []
    for o in cells[0].get("outputs", []):
        if o["output_type"] == "stream":
            out.append("".join(o["text"]))
        elif "text/markdown" in o.get("data", {}):
            out.append("".join(o["data"]["text/markdown"]))
    return "\n".join(out)


def _line(text: str, start: str) -> str:
    lines = [line for line in text.splitlines() if line.lstrip().startswith(start)]
    assert lines, f"no line starting {start!r} in the stored output (re-execute the notebook)"
    return lines[0]


def _wording(ratio: float) -> str:
    return engine.ratio_in_words(ratio)


# ============================================================================= 06: the functions
def _run(device="cpu", mid="a"):
    rec = types.SimpleNamespace(device=device, machine_id=mid, machine_name=None, processor="cpu", preset="small")
    return [rec]


def test_overlay_line_one_machine_twice_is_its_spread():
    runs = classroom.Runs({"a1": _run(), "a2": _run()})
    runs.folder = {"a1": "classroom", "a2": "classroom"}
    line = classroom.overlay_line(runs)
    assert line.startswith("one machine (from classroom), no GPU") and "measured 2 times" in line
    assert "run-to-run spread" in line


def test_overlay_line_several_machines_and_a_gpu():
    runs = classroom.Runs({"a": _run(mid="a"), "b": _run(mid="b"), "b2": _run(mid="b"), "g": _run("gpu", "g")})
    runs.folder = {"a": "measurements", "b": "classroom", "b2": "classroom", "g": "classroom"}
    line = classroom.overlay_line(runs)
    assert line.startswith("3 machines (from classroom and measurements), 1 of them GPUs, 4 runs")
    assert "one machine was measured more than once" in line


def test_overlay_line_one_run_and_none():
    assert "a single run" in classroom.overlay_line({"a": _run()})
    assert "no run" in classroom.overlay_line({})


def test_knee_line_names_the_first_batch_past_one_and_a_half():
    recs = records.load_records(classroom.MEASUREMENTS / "probe-2026-12-01-cpu-2core-small-reference.json")
    _, dec = classroom.split(recs)
    one = dec[1].step_seconds
    knee = min(b for b, r in dec.items() if r.step_seconds >= 1.5 * one)
    assert f"batch {knee} (" in classroom.knee_line(recs)


# ============================================================================= 07: the functions
def test_rag_against_reference_names_reading_a_and_who_writes():
    ref = two_speeds.reference_gap()
    lo, hi = two_speeds.RAG_MIX
    line = economics.rag_against_reference([216.0, 401.0])
    assert "reading A" in line and f"{ref.measured:.1f}x" in line
    assert f"{ref.decode_share(lo, 1):.0%} of its time writing at {lo}:1" in line
    assert line.endswith("216x to 401x, so writing takes most of every request's time")
    assert economics.rag_against_reference([10.0]).endswith("10x, so reading takes most of every request's time")
    assert "straddles" in economics.rag_against_reference([30.0])


def _sim(util, waits):
    """A stand-in for a SimResult: prefill_wait reads ttft and prompt lengths only."""
    n = len(waits)
    return types.SimpleNamespace(utilisation={"prefill": util}, ttft=np.asarray(waits, float) + 0.01,
                                 requests=Requests(np.zeros(n), np.full(n, 100), np.full(n, 10)))


@pytest.mark.parametrize("util, word", [(0.3, "idle more than half the time"), (0.57, "idle the other 43%"),
                                        (0.95, "busy nearly all the time")])
def test_prefill_pool_line_words_follow_the_utilisation(util, word):
    phases = types.SimpleNamespace(prefill_seconds=lambda lens: 0.01)
    line = economics.prefill_pool_line(_sim(0.9, [0.0, 0.05]), _sim(util, [0.0, 0.2]), phases)
    assert f"busy {util:.0%} of the time on average ({word})" in line
    assert "the TTFT tail is that wait" in line
    calm = economics.prefill_pool_line(_sim(0.9, [0.0, 0.3]), _sim(util, [0.0, 0.1]), phases)
    assert "not the tail" in calm


# ============================================================================= 09: the functions
def test_times_wording():
    assert [_wording(r) for r in (1.1, 1.7, 3.0, 8.0)] == [
        "about the same as", "more than, but under twice,", "a few times", "many times"]


def test_step_cost_line_words_the_measured_ratios():
    costs = engine.StepCosts(decode={1: 0.006, 2: 0.007, 4: 0.009, 8: 0.0103}, prefill={1: 0.01},
                             mixed={16: 0.015, 32: 0.02, 48: 0.02, 64: 0.023})
    line = engine.step_cost_line(costs)
    assert "costs more than, but under twice, a step of one (x1.72" in line
    assert "8 decode rows with 56 prompt tokens beside them cost a few times the 8 rows alone (x2.23" in line


def _fifo(arrival, alone, slowdown):
    """A one-server FIFO trace: each prompt starts when it arrives or the one before is done."""
    first, free = [], 0.0
    for a, s in zip(arrival, alone):
        free = max(a, free) + s * slowdown
        first.append(free)
    return first


def test_ttft_parts_recovers_the_queue_and_the_slowdown():
    costs = engine.StepCosts(decode={1: 0.005}, prefill={176: 0.040, 192: 0.045, 224: 0.050}, mixed={})
    plen = np.array([170, 190, 220, 175, 200])
    alone = np.array([costs.tokens(costs.prefill, int(n)) for n in plen])
    arrival = np.array([0.0, 0.01, 0.02, 0.2, 0.5])
    first = _fifo(arrival, alone, 1.5)
    reqs = Requests(arrival, plen, np.full(5, 3))
    trace = trace_from_token_times("two pools", reqs, [[f, f + 0.01, f + 0.02] for f in first])
    parts = engine.ttft_parts(trace, costs)
    assert np.allclose(parts.alone, alone) and np.allclose(parts.ttft, trace.ttft)
    assert math.isclose(parts.in_service, 1.5)
    assert parts.wait[0] == 0 and parts.wait[1] == pytest.approx(alone[0] * 1.5 - 0.01)
    assert np.allclose(parts.extra, 0.5 * alone)


def _trace(ttft, gap, n=5, label="x"):
    reqs = Requests(np.zeros(n), np.full(n, 64), np.full(n, 4))
    return trace_from_token_times(label, reqs, [[ttft, ttft + gap, ttft + 2 * gap, ttft + 3 * gap]] * n)


def test_reading_lines_name_the_longest_and_the_simulator_comparison():
    measured = {("prefill-first", "light"): _trace(0.03, 0.009), ("prefill-first", "heavy"): _trace(0.19, 0.022),
                ("chunked", "light"): _trace(0.05, 0.010), ("chunked", "heavy"): _trace(0.41, 0.027),
                ("two pools", "light"): _trace(0.045, 0.015), ("two pools", "heavy"): _trace(0.33, 0.013)}
    simulated = {("chunked", "heavy"): _trace(0.12, 0.030), ("two pools", "heavy"): _trace(0.33, 0.011)}
    text = engine.reading_lines(measured, simulated)
    assert "heavy trace, TTFT p50: longest under chunked (410 ms), then two pools (330 ms), then prefill-first" in text
    assert "heavy trace, ITL p99: longest under chunked" in text
    assert "nearest its light-load value: two pools" in text
    assert "chunked, measured against simulated: TTFT p50 410 vs 120 ms, worse than the simulator's" in text
    assert "TPOT p50 27.0 vs 30.0 ms, about the simulator's" in text
    assert "two pools, measured against simulated: TTFT p50 330 vs 330 ms, about the simulator's" in text
    assert "TPOT p50 13.0 vs 11.0 ms, worse than the simulator's" in text
    assert "ITL p99 27.0 vs 30.0 ms, about the simulator's" in text


def test_trace_label():
    reqs = Requests(np.array([0.1, 0.2, 0.4]), np.array([160, 200, 219]), np.array([24, 30, 40]))
    assert engine.trace_label(reqs) == "3 prompts of 160-219 tokens at 7.5 req/s, answers of 24-40 tokens"
    burst = Requests(np.array([0.0, 0.001]), np.array([16, 16]), np.array([40, 40]))
    assert engine.trace_label(burst) == "2 prompts of 16 tokens all at once, answers of 40 tokens"


# ============================================================================= the stored notebooks
# These hold once notebooks 06, 07 and 09 are executed with this code (the generated lines are
# then in their stored outputs).

def test_stored_06_overlay_line_matches_the_count():
    out = _output("06_on_your_machine", "lesson.classroom(")
    runs, machines = map(int, re.search(r"(\d+) run\(s\) from (\d+) machine\(s\)", out).groups())
    line = _line(out, "what the overlay shows:")
    if machines == 1:
        assert "one machine" in line
        assert ("a single run" in line) if runs == 1 else (f"measured {runs} times" in line)
    else:
        assert f"{machines} machines" in line and f"{runs} runs" in line
    gpu = any(r.device != "cpu" for recs in classroom.load_measured(classroom.MEASUREMENTS).values() for r in recs)
    assert gpu or "GPU" in line


def test_stored_06_knee_line_matches_the_probe_table():
    table = _output("06_on_your_machine", "lesson.run_probe(")
    steps = {int(b): float(ms) for b, ms in re.findall(r"^decode\s+(\d+)\s+\d+\s+([\d.]+) ms/step", table, re.M)}
    assert 1 in steps, "the probe's table is not in the stored output"
    knee = next((b for b in sorted(steps) if steps[b] >= 1.5 * steps[1]), None)
    line = _line(_output("06_on_your_machine", "lesson.knee_line("), "knee (")
    assert (f"batch {knee} (" in line) if knee else ("beyond this probe's batches" in line)


def test_stored_07_prefill_pool_line_matches_the_utilisation():
    out = _output("07_serving_economics", "lesson.serving_at(")
    busy = int(re.search(r"^disaggregated .*prefill (\d+)%", out, re.M).group(1))
    waits = {name: int(p99) for name, p99 in
             re.findall(r"^(colocated|disaggregated) \(.*waiting for prefill: p50\s+\d+ ms, p99\s+(\d+) ms", out, re.M)}
    line = _line(out, "disaggregated prefill GPU:")
    assert f"busy {busy}% of the time" in line
    word = ("idle more than half the time" if busy < 50 else f"idle the other {100 - busy}%" if busy < 90
            else "busy nearly all the time")
    assert word in line
    assert f"waited for it {waits['disaggregated']} ms at p99 against {waits['colocated']} ms" in line
    assert ("the TTFT tail is that wait" in line) == (waits["disaggregated"] > waits["colocated"])


def test_stored_07_reference_line_matches_notebook_01_and_the_runs():
    out = _output("07_serving_economics", "lesson.rag_against_reference(")
    gaps = [int(g) for g in re.findall(r"prefill reads (\d+)x faster", out)]
    line = _line(out, "the reference node under reading A")
    # notebook 01 prints the same reference-node shares (reading A) for the RAG mixes
    ref01 = _output("01_one_model_two_speeds", "lesson.RAG_MIX")
    for ratio, share in re.findall(r"^(\d+):1, served alone -> decode is (\d+)%", ref01, re.M):
        assert f"{share}% of its time writing at {ratio}:1" in line or f"and {share}% at {ratio}:1" in line
    lo, hi = two_speeds.RAG_MIX
    here = f"{min(gaps)}x" if min(gaps) == max(gaps) else f"{min(gaps)}x to {max(gaps)}x"
    assert f"the per-user ratio is {here}" in line
    tail = line.rsplit(", so ", 1)[1]
    if hi < min(gaps):
        assert tail.startswith("writing takes most of every request's time")
    elif lo > min(gaps):
        assert tail.startswith("reading takes most")
    else:
        assert "straddles" in tail


def _table_rows(out: str) -> dict:
    """{(policy, source, trace): {column: value}} from 09's stored markdown table."""
    rows = {}
    head = None
    for line in out.splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == "policy":
            head = cells
            continue
        policy, source = re.match(r"(.+) \((measured|simulated)\)", cells[0]).groups()
        rows[(policy, source, cells[1])] = {h: float(v) for h, v in zip(head[2:], cells[2:])}
    return rows


def test_stored_09_reading_lines_match_the_table():
    out = _output("09_serving_engine", "lesson.reading_lines(")
    rows = _table_rows(out)
    heavy = {p: r for (p, s, t), r in rows.items() if s == "measured" and t == "heavy"}
    for column, start in (("TTFT p50", "heavy trace, TTFT p50:"), ("ITL p99", "heavy trace, ITL p99:")):
        longest = max(heavy, key=lambda p: heavy[p][column])
        assert _line(out, start).startswith(f"{start} longest under {longest} ("), column
    for p, r in heavy.items():
        sim = rows[(p, "simulated", "heavy")]
        line = _line(out, f"{p}, measured against simulated:")
        for column, word in (("TTFT p50", "TTFT p50"), ("TPOT p50", "TPOT p50"), ("ITL p99", "ITL p99")):
            ratio = r[column] / sim[column]
            said = re.search(rf"{word} [\d.]+ vs [\d.]+ ms, (about|better|worse)", line).group(1)
            # the table rounds; a ratio within a rounding step of a boundary may go either way
            if abs(abs(ratio - 1) - 0.1) > 0.02:
                assert said == ("about" if abs(ratio - 1) < 0.1 else "better" if ratio < 1 else "worse"), (p, column)


def test_stored_09_step_cost_line_matches_the_decode_costs():
    out = _output("09_serving_engine", "lesson.step_cost_line(")
    steps = {int(w): float(ms) for w, ms in re.findall(r"(\d+) slots? ([\d.]+) ms", _line(out, "decode step:"))}
    line = _line(out, "here a decode step of")
    ratio = steps[engine.N_SLOTS] / steps[1]
    said = float(re.search(r"a step of one \(x([\d.]+)", line).group(1))
    assert said == pytest.approx(ratio, rel=0.05)
    assert f"costs {_wording(said)} a step of one" in line


def test_stored_09_ttft_breakdown_adds_up_and_matches_the_table():
    out = _output("09_serving_engine", "lesson.ttft_breakdown(")
    measured = re.search(r"measured:\s+TTFT mean (\d+) ms = waiting for the prefill worker (-?\d+) \+ the prompt's "
                         r"prefill as timed alone (-?\d+) \+ more while serving (-?\d+) ms", out)
    assert measured, "the breakdown is not in the stored output"
    total, *parts = map(int, measured.groups())
    assert abs(total - sum(parts)) <= 2   # each part is rounded on its own
    table = _table_rows(_output("09_serving_engine", "lesson.reading_lines("))
    p50 = int(re.search(r"TTFT p50 \d+ ms, against (\d+) measured and (\d+) simulated", out).group(1))
    assert abs(p50 - table[("disaggregated", "measured", "heavy")]["TTFT p50"]) <= 1
