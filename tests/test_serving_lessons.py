"""Notebook 07's claims: each claim function holds on the lesson's data and fails on counter-data."""

from __future__ import annotations

import re
import types
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from inference_lab.analytic import economics, roofline, simulator, workload
from inference_lab.base import hardware
from inference_lab.measure import vllm_bench
from inference_lab.base.config import ModelConfig
from inference_lab.lessons import serving_economics as lesson
from inference_lab.lessons import serving_pools as pools
from inference_lab.analytic.serving_metrics import SLO

H100 = hardware.PRESETS["H100_SXM"]
CFG8B = ModelConfig.preset("llama3_8b")


@pytest.fixture(scope="module")
def phases():
    return lesson.lab_phases()


def _row(mode, x, key="rate", **ms):
    base = {"mode": mode, key: x, "ttft_p50_ms": 100.0, "ttft_p99_ms": 200.0, "tpot_p99_ms": 10.0, "itl_p99_ms": 10.0}
    base.update(ms)
    return base


# ----------------------------------------------------------------------------- prices
def test_prices_are_for_batches_that_fit():
    full = roofline.max_batch(CFG8B, H100, 2048)
    table = lesson.price_table(CFG8B, H100, economics.GPU_PRICES["H100_SXM"], batches=(1, full, full + 1),
                               prompt_len=2048, context=2048)
    rows = table.splitlines()[2:]
    assert len(rows) == 3 and "does not fit" not in rows[1] and rows[2].endswith("does not fit: not priced")
    # At the reference node's reading-A MFU, a batched server's output would cost less than its input.
    assert "cheaper than input" in lesson.reference_mfu_price(CFG8B, H100, batch=full, context=2048, prompt_len=2048)


def test_price_band_claims():
    band = lesson.price_band(CFG8B, H100, batch=roofline.max_batch(CFG8B, H100, 2048), context=2048)
    assert lesson.roofline_misses_the_band(band) and band.at_roofline > 5
    lo, hi = band.mfu_range
    assert 0.4 < lo < hi < 0.9 and "needs prefill MFU" in band.line()
    assert lesson.band_reached_below(band, 0.79)
    assert not lesson.band_reached_below(band, 0.3)  # counter: hardware that only reaches 30%
    inside = lesson.PriceBand(512, 2048, (3, 5), np.array([0.5, 1.0]), np.array([2.5, 4.5]))
    assert not lesson.roofline_misses_the_band(inside)  # counter: a roofline already in the band
    never = lesson.PriceBand(512, 2048, (3, 5), np.array([0.5, 1.0]), np.array([8.0, 16.0]))
    assert never.mfu_range is None and not lesson.band_reached_below(never, 1.0)


def test_reference_node_figures():
    node = lesson.reference_node()
    assert node["gap"] == pytest.approx(3288 / 108)
    assert 0 < node["prefill_mfu"] < node["decode_mbu"] < 1


# ----------------------------------------------------------------------------- the metric box
def test_stall_is_seen_by_itl_not_tpot():
    assert lesson.tpot_hides_the_stall(lesson.stall_example().summary())
    assert not lesson.tpot_hides_the_stall(lesson.stall_example(stall_ms=5.0).summary())  # counter: no stall
    assert "ITL" in lesson.metrics_table(lesson.stall_example().summary())


# ----------------------------------------------------------------------------- modes under load
def test_chunking_claims_on_simulated_and_counter_data(phases):
    sweep = lesson.rate_sweep(phases, rates=(2, 8, 12), spec=H100, n_requests=300)
    assert lesson.chunking_holds_tpot(sweep)
    assert "chunked" in sweep.table() and len(sweep.chunked) == 3
    assert lesson.chunking_ttft_line(sweep).startswith("TTFT, chunked over prefill first: p50 x")
    for r in lesson.tpot_above_itl(sweep):
        assert r["tpot_p99_ms"] > r["itl_p99_ms"]
    # Counter-data: chunked TPOT p99 growing faster than prefill first's; chunked TTFT lower.
    bad = lesson.Sweep([_row("colocated", 1, tpot_p99_ms=10), _row("colocated", 2, tpot_p99_ms=12),
                        _row("chunked", 1, tpot_p99_ms=8, ttft_p50_ms=90), _row("chunked", 2, tpot_p99_ms=20, ttft_p50_ms=90)],
                       "rate")
    assert not lesson.chunking_holds_tpot(bad)
    assert [(r["mode"], r["rate"]) for r in lesson.tpot_above_itl(bad)] == [("colocated", 2), ("chunked", 2)]
    assert "p99 higher at every load" in lesson.chunking_ttft_line(bad)


def test_budget_claim(phases):
    sweep = lesson.budget_sweep(phases, (128, 512, 4096), rate=8, n_requests=300)
    assert lesson.budget_trades_ttft_for_itl(sweep)
    flat = lesson.Sweep([_row("chunked", b, "chunk_tokens", itl_p99_ms=i)
                         for b, i in ((128, 10), (512, 10), (4096, 10))], "chunk_tokens")
    assert not lesson.budget_trades_ttft_for_itl(flat)  # counter: the budget changes nothing


def test_views_read_their_controls(phases, tmp_path):
    cfg8b = ModelConfig.preset("llama3_8b")
    price = economics.GPU_PRICES["H100_SXM"]
    for fig, text, start in ((*pools.pool_view(phases, workload.sample_requests(200, 5.0, **lesson.RAG_TRAFFIC), 8, 64),
                              "batch size 64:"),
                             (*lesson.price_view(cfg8b, H100, price, 64, 0.5, prompt_len=2048, context=2048),
                              "batch size 64, prefill at 50% MFU"),
                             (*lesson.price_view(cfg8b, H100, price, 512, 0.5, prompt_len=2048, context=2048),
                              "batch size 512 at context 2,048: needs")):
        assert isinstance(fig, Figure) and text.startswith(start), text
    assert "ridge" not in lesson.lab_assumptions() and "50%" in lesson.lab_assumptions()


# ----------------------------------------------------------------------------- the 1P1D run
def test_disaggregated_oddities_are_explained(phases):
    runs = lesson.serving_at(phases, 2048, spec=H100)
    col, dis = runs["colocated"], runs["disaggregated"]
    assert lesson.busy_is_not_full(dis, 64)
    assert lesson.one_prefill_server_queues(col, dis, phases)
    assert not lesson.one_prefill_server_queues(dis, col, phases)  # counter: the roles swapped
    full = types.SimpleNamespace(utilisation={"decode": 0.99}, mean_batch={"decode": 60.0})
    assert not lesson.busy_is_not_full(full, 64)  # counter: busy and full
    assert "busy" in lesson.sim_summary(runs)


# ----------------------------------------------------------------------------- pool sizing
def test_pool_estimate_is_the_ratio_over_the_gap(phases):
    rag = workload.sample_requests(1000, 10.0, **lesson.RAG_TRAFFIC)
    est = pools.pool_estimate(phases, rag, 8, tpot_ms=15)
    assert est.prefill_gpus_per_decode_gpu == pytest.approx((est.prompt / est.output) / est.throughput_ratio)
    assert phases.decode_seconds(est.batch, est.batch * int(est.prompt + est.output / 2)) <= 0.015
    assert est.best_prefill_gpus >= 5  # RAG: most GPUs prefill
    # Short prompts are packed into full passes, as a busy prefill worker runs them.
    assert pools._full_passes_seconds(phases, [100] * 80, 8192) < 0.6 * 80 * phases.prefill_seconds([100])
    chat = workload.sample_requests(1000, 10.0, prompt_len=(32, 128), output_len=(32, 128))
    chat_est = pools.pool_estimate(phases, chat, 8, tpot_ms=15)
    assert chat_est.prefill_gpus_per_decode_gpu < 1 < est.prefill_gpus_per_decode_gpu  # chat: mostly decode
    assert chat_est.best_prefill_gpus <= 4 < est.best_prefill_gpus and chat_est.batch == 256
    tighter = pools.pool_estimate(phases, rag, 8, tpot_ms=9)
    assert tighter.batch < est.batch and tighter.prefill_gpus_per_decode_gpu < est.prefill_gpus_per_decode_gpu
    with pytest.raises(ValueError, match="decode step"):
        pools.decode_batch_for_tpot(phases, 0.1, 2000)
    with pytest.raises(ValueError, match="tpot_ms"):
        pools.pool_estimate(phases, rag, 8)


def test_split_claim_and_sweep_bookkeeping():
    assert pools.split_follows_from_the_gap("6P2D", "6P2D") and pools.split_follows_from_the_gap("6P2D", "5P3D")
    assert not pools.split_follows_from_the_gap("6P2D", "2P6D")  # counter: far from the balance
    rows = [{"rate": r, "config": c, "goodput_rps": g} for r, c, g in
            ((10, "chunked", 9.0), (10, "1P1D", 8.0), (20, "chunked", 12.0), (20, "1P1D", 15.0))]
    sw = pools.PoolSweep(rows, SLO(ttft_ms=1000), 2)
    assert sw.best() == ("1P1D", 15.0) and sw.best("all") == ("1P1D", 15.0) and sw.peak("chunked") == 12.0
    assert "1P1D" in sw.table()


def test_pool_sweep_runs_every_split(phases):
    sw = pools.pool_sweep(phases, (20,), gpus=4, slo=SLO(ttft_ms=1000, tpot_ms=15), link=450e9, n_requests=100)
    assert {r["config"] for r in sw.rows} == {"colocated", "chunked", "1P3D", "2P2D", "3P1D"}
    assert all(r["goodput_rps"] is not None for r in sw.rows)


# ----------------------------------------------------------------------------- a real run beside it
def test_replay_a_vllm_run(phases):
    (run,) = vllm_bench.load_vllm_bench(pools.EXAMPLE_VLLM_RESULT)
    sim = pools.replay(run, phases)
    assert len(sim.requests) == run.completed and sim.mode == "chunked"
    assert np.array_equal(np.sort(sim.requests.prompt_len), np.sort(run.trace.requests.prompt_len[run.trace.ok]))
    table = pools.side_by_side({"vllm": run.summary(), "sim": sim.summary()})
    assert "E2E (vLLM: E2EL) p99 (ms)" in table and "output tokens/s" in table
    assert Path(pools.EXAMPLE_VLLM_RESULT).is_file()


def test_rag_clock_keeps_the_wait_apart_from_the_gpu_time(phases):
    light, heavy = (simulator.simulate_requests(workload.sample_requests(300, rate, seed=0, **lesson.RAG_TRAFFIC),
                                                phases, mode="colocated", gpus=2) for rate in (4, 12))
    def shares(res):
        line = lesson.rag_clock(res, phases, 0)
        wait, gpu = (int(x) for x in re.findall(r"decode is (\d+)% of a request's end-to-end latency \(median\) "
                                                r"and (\d+)% of the GPUs' busy time", line)[0])
        return wait, gpu
    (w_light, g_light), (w_heavy, g_heavy) = shares(light), shares(heavy)
    assert w_light > 70 and w_heavy > 70              # decode is most of every user's wait at both loads
    assert g_heavy < g_light - 10                     # its GPU time shrinks as the batch grows
    assert g_heavy < w_heavy - 20                     # the two clocks part
