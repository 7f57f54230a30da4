"""Notebook 09, section 5: which step made that gap, and a budget that holds a latency target.

Every inter-token gap a client sees is the time of the step that produced the token. The engine's
step timeline (:mod:`inference_lab.serving.timeline`) records what each step held and what it
took, so the worst gap of a trace can be matched to its step (:func:`worst_gaps`), and the reason
read off the record: a big prompt chunk beside the decode rows, or a step slower than its
prediction (the machine, not the plan).

Then a queue of prompts (:func:`queue_trace`) under a small and a large fixed token budget, and
under a latency target (``target_itl_ms``, :mod:`inference_lab.serving.slo`) set between what
the two fixed budgets gave (:func:`target_between`): :func:`target_holds` checks the target run's
ITL p99 against it, and :func:`fixed_budgets_miss_or_waste` that each fixed budget either misses
the target or delivers fewer tokens a second than the target run. Both can say CANNOT DECIDE
HERE on a noisy machine.
"""

from __future__ import annotations

import collections

import numpy as np

from inference_lab.analytic.serving_metrics import ServingTrace
from inference_lab.analytic.workload import Requests, sample_requests
from inference_lab.lessons.claims import Verdict, all_hold, decide
from inference_lab.lessons.serving_engine import HEAVY_PROMPTS
from inference_lab.serving.engine import Engine
from inference_lab.serving.load import drive_engine
from inference_lab.serving.requests import now
from inference_lab.serving.timeline import StepRecord

FIXED_BUDGETS = (32, 192)  # a small fixed budget and a large one (the lesson's chunked engine had 64)
QUEUE = 48                 # the section's trace: this many of the heavy trace's prompts, all at once
HOLD = 1.1                 # the target is held when ITL p99 is within 10% of it
SLOWER = 1.25              # a step this much slower than its shape's prediction: the machine, not the plan
HOST_LATE = 1e-3           # a step dispatched this long (s) after the step before it ended: the host was late


def queue_trace(seed: int = 0) -> Requests:
    """:data:`QUEUE` prompts of the heavy trace's lengths arriving together: a queue of prompts
    behind the decoding requests for the whole run, so every step chooses how much of it to take."""
    shaped = sample_requests(QUEUE, 1.0, prompt_len=HEAVY_PROMPTS, output_len=(24, 40), seed=seed + 7)
    return Requests(np.zeros(QUEUE), shaped.prompt_len, shaped.output_len)


def engines(model, *, budgets=FIXED_BUDGETS, target_ms: float | None = None, n_slots: int = 8,
            steps: int = 5000) -> dict:
    """Started chunked engines over the model's contiguous slots, each keeping its step timeline:
    one per fixed budget in ``budgets`` and, with ``target_ms``, one holding that latency target
    ({name: engine}). Their programs are compiled once per process: engines after the first
    only time their steps."""
    made = {f"budget {b}": Engine(model, n_slots=n_slots, max_num_batched_tokens=b, step_timeline=steps)
            for b in budgets}
    if target_ms is not None:
        made[target_name(target_ms)] = Engine(model, n_slots=n_slots, target_itl_ms=target_ms, step_timeline=steps)
    for e in made.values():
        e.warmup()
        e.start()
    return made


def target_name(target_ms: float) -> str:
    return f"target {target_ms:.1f} ms"


def target_between(runs: dict) -> float:
    """The lesson's target (ms): between the ITL p99 of the smallest and the largest fixed budget's
    runs (their geometric mean). The small budget meets it and the large one misses it, on any
    machine; the question is what the target run delivers."""
    p99 = [1e3 * _itl_p99(runs[f"budget {b}"][0]) for b in (min(FIXED_BUDGETS), max(FIXED_BUDGETS))]
    return float(np.sqrt(p99[0] * p99[1]))


def run(engines_: dict, requests) -> dict:
    """{name: (ServingTrace, the step records of that run, the run's start on the engine's clock)}
    for each engine on ``requests`` (the trace's times count from that start)."""
    out = {}
    for name, e in engines_.items():
        start = now()
        trace = drive_engine(e, requests, label=name, start=start)
        out[name] = (trace, [r for r in e.timeline.records() if r.end >= start], start)
    return out


def gaps(trace: ServingTrace) -> tuple[np.ndarray, np.ndarray]:
    """(when, seconds) of every gap between two tokens of one request: when the later token came,
    on the trace's clock, and how long after the one before."""
    when, size = [], []
    for i in np.flatnonzero(trace.ok):
        g = trace.gaps(int(i))
        if len(g):
            when.append(trace.first_token[i] + np.cumsum(g))
            size.append(g)
    return (np.concatenate(when), np.concatenate(size)) if when else (np.zeros(0), np.zeros(0))


def _step_index(records: list[StepRecord], when: float) -> int:
    """Which of ``records`` made the token that reached the host at ``when``: the last to end at or
    before it (-1: none did)."""
    ends = np.array([r.end for r in records])
    return int(np.searchsorted(ends, when + 1e-6, side="right")) - 1


def why(record: StepRecord, before: StepRecord | None = None) -> str:
    """A step's record in words: what it held, whether it took what its shape predicts, and (given
    the step ``before`` it) whether the host dispatched it late."""
    held = f"{record.decode_rows} decode row{'s' if record.decode_rows != 1 else ''}"
    if record.prompt_tokens:
        held += f" + {record.prompt_tokens} prompt tokens in {record.chunks} chunk{'s' if record.chunks != 1 else ''}"
    took = f"{1e3 * record.seconds:.1f} ms"
    if record.predicted_s:
        ratio = record.seconds / record.predicted_s
        cause = ("what its shape costs" if ratio < SLOWER else
                 "slower than its shape: the machine was slow, the plan was not big")
        took += f", predicted {1e3 * record.predicted_s:.1f} ms for shape {record.shape} (x{ratio:.2f}, {cause})"
    late = record.start - before.end if before is not None else 0.0
    if late > HOST_LATE:
        took += f"; dispatched {1e3 * late:.1f} ms after the step before it ended (the host was late)"
    return f"step {record.iteration}: {held}; {took}"


def worst_gaps(trace: ServingTrace, records: list[StepRecord], start: float, n: int = 3) -> list[str]:
    """The ``n`` longest inter-token gaps of ``trace`` (its times counted from ``start`` on the
    engine's clock) made by ``n`` different steps, each with its step in words (a step delays every
    request it decodes: their gaps are one gap here)."""
    when, size = gaps(trace)
    lines, seen = [], set()
    for i in np.argsort(size)[::-1]:
        k = _step_index(records, start + when[i])
        if k in seen:
            continue
        seen.add(k)
        made = (why(records[k], records[k - 1] if k > 0 else None) if k >= 0
                else "a step before the timeline began")
        lines.append(f"{1e3 * size[i]:.1f} ms gap at {when[i]:.2f} s <- {made}")
        if len(lines) == n:
            break
    return lines


def _itl_p99(trace: ServingTrace) -> float:
    return trace.percentiles()["itl"][99]


def target_holds(trace: ServingTrace, target_ms: float, *, u: float = 1.0) -> Verdict:
    """With a latency target, the run's ITL p99 is within :data:`HOLD` of the target."""
    p99 = 1e3 * _itl_p99(trace)
    return Verdict(f"a {target_ms:.1f} ms latency target holds ITL p99 within {100 * (HOLD - 1):.0f}% of it",
                   decide(p99, HOLD * target_ms, u, at_least=False),
                   f"ITL p99 {p99:.1f} ms against {target_ms:.1f} ms (x{p99 / target_ms:.2f}; noise x{u:.2f})")


def fixed_budgets_miss_or_waste(runs: dict, target_name: str, target_ms: float, *, u: float = 1.0) -> Verdict:
    """Each fixed budget either misses the target (ITL p99 past :data:`HOLD` times it) or delivers
    fewer output tokens a second than the target run; the target run's tokens a second is what it
    is compared with. An engine whose fixed budget met the target at the target run's throughput
    makes this fail."""
    target_tps = runs[target_name][0].output_tokens_per_s
    parts, words = [], []
    for name, (trace, *_) in runs.items():
        if name == target_name:
            continue
        p99, tps = 1e3 * _itl_p99(trace), trace.output_tokens_per_s
        misses = decide(p99, HOLD * target_ms, u)
        wastes = decide(target_tps / tps, 1.0, u)
        parts.append(True if misses or wastes else None if misses is None or wastes is None else False)
        words.append(f"{name}: ITL p99 {p99:.1f} ms, {tps:.0f} tok/s")
    return Verdict("every fixed budget misses the target or delivers fewer tokens a second than the target run",
                   all_hold(*parts), "; ".join(words) + f"; the target run: {target_tps:.0f} tok/s (noise x{u:.2f})")


def plot_inputs(trace: ServingTrace, records: list[StepRecord], start: float) -> tuple:
    """(gap times s, gaps ms, steps) for :func:`inference_lab.plots.step_timeline_plot`: the run's
    gaps and the steps that ended during it, on the trace's clock."""
    when, size = gaps(trace)
    steps = [dict(at=r.end - start, ms=1e3 * r.seconds, prompt_tokens=r.prompt_tokens,
                  predicted_ms=None if r.predicted_s is None else 1e3 * r.predicted_s)
             for r in records if r.end >= start]
    return when, 1e3 * size, steps


def table(runs: dict, target_ms: float) -> str:
    """One markdown row per run: throughput, ITL p50/p99 against the target, TTFT p50 (what the
    queue pays), and the steps that carried prompt tokens beside decode rows: how many, and the
    median prompt tokens they carried."""
    lines = ["| run | output tok/s | ITL p50 ms | ITL p99 ms | p99 / target | TTFT p50 s | "
             "steps with prompt tokens beside decode rows | their median prompt tokens |",
             "|---|---|---|---|---|---|---|---|"]
    for name, (trace, records, _) in runs.items():
        p = trace.percentiles()
        mixed = [r.prompt_tokens for r in records if r.prompt_tokens and r.decode_rows]
        carried = f"{np.median(mixed):.0f}" if mixed else "-"
        lines.append(f"| {name} | {trace.output_tokens_per_s:.0f} | {1e3 * p['itl'][50]:.1f} | "
                     f"{1e3 * p['itl'][99]:.1f} | x{1e3 * p['itl'][99] / target_ms:.2f} | {p['ttft'][50]:.2f} | "
                     f"{len(mixed)} of {len(records)} | {carried} |")
    return "\n".join(lines)


def target_rule(engine) -> dict:
    """What a target engine chooses from, for the worked problem: ``costs`` ({chunk tokens: ms} of
    its full-width steps as timed at warm-up), ``target_ms``, ``ratio`` (its correction when the
    run ended) and ``chunk`` (the chunk tokens a step beside decode rows may carry under that
    correction: the largest whose cost fits the target divided by the ratio)."""
    rule = engine.itl
    return dict(costs={t: 1e3 * s for t, s in rule.mixed.items()}, target_ms=1e3 * rule.target_s,
                ratio=rule.ratio, chunk=rule.budget(1) - 1)


def chunks_taken(records: list[StepRecord]) -> dict:
    """{chunk tokens the scheduler allowed (the step's budget less its decode rows): steps} over
    the records that carried prompt tokens beside decode rows: the rule's choices, read off the
    timeline."""
    allowed = collections.Counter(r.budget - r.decode_rows for r in records if r.decode_rows and r.prompt_tokens)
    return dict(sorted(allowed.items()))
