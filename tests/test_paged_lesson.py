"""Notebook 10's lesson without an engine: the block arithmetic, the simulator's memory rules and
prefix hits, and each verdict shown to fail on realistic counter-data (an engine whose paging did
nothing) and to hold on the effect the notebook measures."""

from __future__ import annotations

import numpy as np
import pytest

from inference_lab.analytic import costs
from inference_lab.analytic.phases import PhaseModel
from inference_lab.analytic.serving_metrics import trace_from_token_times
from inference_lab.analytic.simulator import KVMemory, simulate_requests
from inference_lab.analytic.workload import Requests
from inference_lab.base.config import ModelConfig
from inference_lab.lessons import paged_kv_cache as lesson

CFG = ModelConfig.preset("shakespeare_large")


def _run(name, at_once, tokens_per_s, ttft_ms=50.0, n=40, out=64, preemptions=0):
    """A run of ``n`` requests of ``out`` tokens whose decode spans overlap ``at_once`` deep, at
    about ``tokens_per_s`` overall, each first token ``ttft_ms`` after its arrival."""
    span = n * out / tokens_per_s
    width = span * at_once / n
    starts = np.linspace(0.0, span - width, n)
    times = [ttft_ms / 1e3 + s + np.linspace(0.0, width, out) for s in starts]
    reqs = Requests(starts, np.full(n, 30), np.full(n, out))
    trace = trace_from_token_times(name, reqs, times)
    return lesson.MemoryRun(name, trace, preemptions, 0, 0, 0)


def test_block_arithmetic_is_the_worked_problem():
    reqs = Requests(np.zeros(3), np.full(3, 28), np.full(3, 64))
    a = lesson.block_arithmetic(CFG, reqs, lesson.budget_bytes(CFG))
    assert costs.kv_bytes_per_token(CFG) == 8 * 1024 and a.budget == 4 * 2**20
    assert a.contiguous_slots == 2 and a.blocks == 32 and a.block_bytes == 128 * 1024
    assert a.mean_blocks == pytest.approx(np.mean(np.ceil((28 + np.arange(1, 65)) / 16)))
    assert 6.5 < a.predicted_paged < 8 and a.contiguous_waste == pytest.approx(1 - (28 + 32.5) / 256)


def test_the_simulator_holds_each_layout_to_its_memory():
    phases = PhaseModel(prefill_seconds=lambda lens: 1e-3 * sum(lens) / 16, decode_seconds=lambda b, c: 4e-3 + 2e-4 * b,
                        kv_bytes_per_token=8192.0, mixed_seconds=lambda b, c, chunks=(): 4e-3 + 2e-4 * b + 1e-3 * len(chunks))
    reqs = Requests(np.zeros(30), np.full(30, 28), np.full(30, 64))
    contiguous = simulate_requests(reqs, phases, mode="chunked", chunk_tokens=64, max_batch=8,
                                   kv=KVMemory(512, layout="contiguous", reserve=256))
    paged = simulate_requests(reqs, phases, mode="chunked", chunk_tokens=64, max_batch=8, kv=KVMemory(512))
    free = simulate_requests(reqs, phases, mode="chunked", chunk_tokens=64, max_batch=8)
    assert contiguous.decoding_at_once() <= 2.05 < 4 < paged.decoding_at_once() <= free.decoding_at_once()
    assert paged.output_tokens_per_s > 1.5 * contiguous.output_tokens_per_s
    colocated = simulate_requests(reqs, phases, mode="colocated", max_batch=8, kv=KVMemory(512, layout="contiguous",
                                                                                            reserve=256))
    assert colocated.decoding_at_once() <= 2.05
    with pytest.raises(ValueError, match="reserve"):
        KVMemory(512, layout="contiguous")
    with pytest.raises(ValueError, match="colocated and chunked"):
        simulate_requests(reqs, phases, mode="disaggregated", kv=KVMemory(512), interconnect_bandwidth=1e9)


def test_cached_prompt_tokens_are_not_prefilled():
    phases = PhaseModel(prefill_seconds=lambda lens: 1e-3 * sum(lens), decode_seconds=lambda b, c: 1e-3,
                        kv_bytes_per_token=1.0, mixed_seconds=lambda b, c, chunks=(): 1e-3 + 1e-3 * sum(n for n, _ in chunks))
    reqs = Requests(np.arange(8) * 1.0, np.full(8, 200), np.full(8, 4))
    for mode in ("colocated", "chunked"):
        cold = simulate_requests(reqs, phases, mode=mode, chunk_tokens=512)
        warm = simulate_requests(reqs, phases, mode=mode, chunk_tokens=512, cached_prompt=160)
        ratio = cold.percentiles()["ttft"][50] / warm.percentiles()["ttft"][50]
        assert 3.5 < ratio < 5.5, (mode, ratio)
    whole = simulate_requests(reqs, phases, mode="chunked", chunk_tokens=512, cached_prompt=10_000)
    assert whole.percentiles()["ttft"][50] > 0          # at least one token is always computed
    with pytest.raises(ValueError, match="cached_prompt"):
        simulate_requests(reqs, phases, mode="chunked", cached_prompt=-1)


def test_predicted_hits_are_the_shared_prompts_whole_blocks():
    reqs, prompts = lesson.shared_prompt_workload(n=5)
    assert list(lesson.predicted_hits(reqs)) == [0] + [160] * 4
    assert len({p[:lesson.SHARED - 1] for p in prompts}) == 1 and len(set(prompts)) == 5
    assert reqs.arrival[1] - reqs.arrival[0] >= lesson.FIRST_ALONE_S


def test_the_batch_verdict_fails_when_paging_changes_nothing():
    c = _run("contiguous", 1.9, 550)
    assert lesson.paged_runs_more_at_once(c, _run("paged", 5.8, 900), predicted=3.5).holds is True
    assert lesson.paged_runs_more_at_once(c, _run("paged", 2.0, 560), predicted=3.5).holds is False


def test_the_throughput_verdict_fails_without_the_gain_and_doubts_a_noisy_one():
    contiguous = [_run("contiguous", 1.9, 550), _run("contiguous", 1.9, 560)]
    gained = [_run("paged", 5.8, 900), _run("paged", 5.8, 880)]
    same = [_run("paged", 5.8, 560), _run("paged", 5.8, 555)]
    assert lesson.paged_raises_throughput(contiguous, gained, predicted=1.9).holds is True
    assert lesson.paged_raises_throughput(contiguous, same, predicted=1.9).holds is False
    noisy = [_run("contiguous", 1.9, 400), _run("contiguous", 1.9, 600)]
    assert lesson.paged_raises_throughput(noisy, [_run("paged", 5.8, 800), _run("paged", 5.8, 640)],
                                          predicted=1.9).holds is None


def test_the_prefix_verdict_fails_when_the_cache_saves_nothing():
    uncached = _run("no prefix cache", 3, 800, ttft_ms=60.0)
    assert lesson.prefix_cache_cuts_ttft(uncached, _run("prefix cache", 3, 800, ttft_ms=16.0), predicted=3.8).holds
    assert lesson.prefix_cache_cuts_ttft(uncached, _run("prefix cache", 3, 800, ttft_ms=55.0),
                                         predicted=3.8).holds is False


def test_the_gain_is_predicted_again_with_the_runs_recompute():
    timed = lesson.StepCosts(decode={1: 3e-3, 2: 3.4e-3, 4: 4e-3, 8: 5e-3}, prefill={1: 2e-3},
                             mixed={16: 7e-3, 48: 11e-3})
    sim = {"contiguous": _run("c", 1.9, 500).trace, "paged": _run("p", 5.8, 1000).trace}
    paged = _run("paged", 5.8, 900)
    ratio = sim["paged"].output_tokens_per_s / sim["contiguous"].output_tokens_per_s
    assert 1.9 < lesson.predicted_gain(sim, timed, paged) == pytest.approx(ratio, rel=1e-9)
    heavy = lesson.MemoryRun("paged", paged.trace, 30, 20_000, 0, 0)
    per_token = (11e-3 - 5e-3) / 48
    assert lesson.predicted_gain(sim, timed, heavy) == pytest.approx(
        40 * 64 / (sim["paged"].makespan + 20_000 * per_token) / sim["contiguous"].output_tokens_per_s, rel=1e-9)
