"""Economics: prices from throughput, and the serving simulation's conservation and physics."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from inference_lab.analytic import costs, economics, roofline, simulator, workload
from inference_lab.analytic.phases import measured_phases, roofline_phases
from inference_lab.base import hardware
from inference_lab.base.config import ModelConfig

H100 = hardware.PRESETS["H100_SXM"]
CFG = ModelConfig.preset("llama3_8b")


@pytest.fixture(scope="module")
def phases():
    return roofline_phases(CFG, H100, step_overhead_s=2e-4)


# ----------------------------------------------------------------------------- prices
def test_cost_per_million_tokens_arithmetic():
    # $3.60/h = $0.001/s; 1,000 tok/s -> $1e-6 per token -> $1 per million.
    assert economics.cost_per_million_tokens(3.6, 1000.0) == pytest.approx(1.0)
    assert economics.cost_per_million_tokens(3.6, 1000.0, gpus=4) == pytest.approx(4.0)
    p = economics.token_prices(2.0, prefill_tokens_per_s=50_000, decode_tokens_per_s=10_000)
    assert p["ratio"] == pytest.approx(5.0)
    assert p["output_per_million"] == pytest.approx(5 * p["input_per_million"])


def test_default_prices_carry_source_and_date():
    for key, price in economics.GPU_PRICES.items():
        assert key in hardware.PRESETS
        assert price.dollars_per_hour > 0 and price.source and price.date[:2] == "20"
    got = economics.predicted_token_prices(CFG, H100, batch=64, context=2048)
    assert got["dollars_per_gpu_hour"] == economics.GPU_PRICES["H100_SXM"].dollars_per_hour
    mine = economics.predicted_token_prices(CFG, H100, batch=64, context=2048, dollars_per_gpu_hour=6.0)
    assert mine["output_per_million"] == pytest.approx(2 * got["output_per_million"])
    assert mine["ratio"] == pytest.approx(got["ratio"])  # the ratio does not depend on the price


def test_price_ratio_falls_with_batch_to_a_kv_floor():
    batches = [1, 4, 16, 64, 256]
    short = economics.price_ratio_vs_batch(CFG, H100, batches, context=512)
    long = economics.price_ratio_vs_batch(CFG, H100, batches, context=8192)
    assert all(np.diff(short) < 0)
    # Batch 1: the ratio is roughly the ridge point (prefill compute-bound, decode reads all weights).
    assert short[0] == pytest.approx(roofline.ridge_point(H100, "bf16"), rel=0.15)
    # Well-batched short-context decode lands in the providers' 3-5x neighbourhood ...
    assert 2 < short[-1] < 6
    # ... while long contexts keep output expensive (each sequence reads its own KV cache).
    assert long[-1] > 3 * short[-1]


@dataclasses.dataclass
class _P:
    batch: int
    prompt_len: int
    seconds: float
    prefill_tokens_per_s: float
    device: str = "cpu"
    phase: str = "prefill"


@dataclasses.dataclass
class _D:
    batch: int
    context: int
    step_seconds: float
    decode_tokens_per_s: float
    device: str = "cpu"
    phase: str = "decode"


def _records():
    pre = [_P(1, t, t / 800.0, 800.0) for t in (128, 512)]
    dec = [_D(b, 128, 0.02 * (1 + b / 16), b / (0.02 * (1 + b / 16))) for b in (1, 4, 16)]
    return pre + dec


def test_measured_token_prices_from_records():
    rows = economics.measured_token_prices(_records(), dollars_per_gpu_hour=1.0)
    assert [r["batch"] for r in rows] == [1, 4, 16]
    assert rows[0]["ratio"] == pytest.approx(800.0 / (1 / 0.02125))
    assert rows[-1]["ratio"] < rows[0]["ratio"]
    with pytest.raises(ValueError, match="prefill"):
        economics.measured_token_prices([r for r in _records() if r.phase == "decode"], 1.0)


# ----------------------------------------------------------------------------- phase models
def test_roofline_phases_agree_with_roofline():
    ph = roofline_phases(CFG, H100)
    for T in (1, 100, 3000):
        assert ph.prefill_seconds([T]) == pytest.approx(
            roofline.predict_time(costs.prefill_cost(CFG, 1, T), H100, "bf16"), rel=1e-9)
    for B, C in ((1, 10), (7, 1000), (64, 4096)):
        assert ph.decode_seconds(B, B * C) == pytest.approx(
            roofline.predict_time(costs.decode_cost(CFG, B, C), H100, "bf16"), rel=1e-9)
    assert ph.kv_bytes_per_token == costs.kv_bytes_per_token(CFG)


def test_measured_phases_interpolate_and_extrapolate():
    ph = measured_phases(_records(), cfg=CFG)
    assert ph.prefill_seconds([128]) == pytest.approx(0.16)
    assert ph.prefill_seconds([200, 56]) == pytest.approx(0.32)  # tokens in the pass
    assert ph.decode_seconds(4, 999) == pytest.approx(0.025)
    assert ph.decode_seconds(32, 0) > ph.decode_seconds(16, 0)
    with pytest.raises(ValueError, match="step_seconds"):
        measured_phases([r for r in _records() if r.phase == "prefill"])
    no_kv = measured_phases(_records())
    reqs = workload.sample_requests(5, 1.0)
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        simulator.simulate_requests(reqs, no_kv, mode="disaggregated", interconnect_bandwidth=1e9)


# ----------------------------------------------------------------------------- workload
def test_requests_are_seeded_and_rag_ratios_hold():
    a = workload.sample_requests(500, 4.0, ratio=workload.RAG_RATIO, output_len=(16, 64), seed=3)
    b = workload.sample_requests(500, 4.0, ratio=workload.RAG_RATIO, output_len=(16, 64), seed=3)
    c = workload.sample_requests(500, 4.0, ratio=workload.RAG_RATIO, output_len=(16, 64), seed=4)
    assert np.array_equal(a.arrival, b.arrival) and np.array_equal(a.prompt_len, b.prompt_len)
    assert not np.array_equal(a.arrival, c.arrival)
    r = a.prompt_len / a.output_len
    assert r.min() >= 19 - 0.5 / 16 and r.max() <= 47 + 0.5 / 16
    assert np.all(np.diff(a.arrival) > 0)
    # Poisson at 4/s: mean gap 0.25 s (500 samples: within 15%).
    assert np.mean(np.diff(a.arrival)) == pytest.approx(0.25, rel=0.15)


# ----------------------------------------------------------------------------- simulation
@pytest.mark.parametrize("mode", ["colocated", "disaggregated"])
def test_simulation_conserves_work(phases, mode):
    reqs = workload.sample_requests(800, 8.0, prompt_len=(64, 2048), output_len=(1, 96), seed=1)
    res = simulator.simulate_requests(reqs, phases, mode=mode, gpus=2, max_batch=16,
                                      max_prefill_tokens=4096,
                                      interconnect_bandwidth=H100.interconnect_bandwidth)
    assert np.isfinite(res.finish).all() and np.isfinite(res.first_token).all()
    assert np.array_equal(res.tokens, reqs.output_len)  # every token produced, once
    assert res.decode_tokens_total == int((reqs.output_len - 1).sum())  # counted step by step
    assert (res.first_token >= reqs.arrival).all() and (res.finish >= res.first_token).all()
    # A request needs at least its own prefill, and one decode step per later token.
    assert (res.ttft >= np.array([phases.prefill_seconds([int(t)]) for t in reqs.prompt_len]) * 0.999).all()
    one = reqs.output_len == 1
    assert np.isnan(res.tpot[one]).all() and (res.tpot[~one] > 0).all()
    for u in res.utilisation.values():
        assert 0 < u <= 1 + 1e-9


def test_simulation_is_deterministic_per_seed(phases):
    kw = dict(rate=10.0, n_requests=400, prompt_len=(128, 1024), output_len=(8, 64),
              mode="disaggregated", interconnect_bandwidth=450e9)
    a, b = simulator.simulate(phases, seed=7, **kw), simulator.simulate(phases, seed=7, **kw)
    c = simulator.simulate(phases, seed=8, **kw)
    assert np.array_equal(a.finish, b.finish) and a.summary() == b.summary()
    assert not np.array_equal(a.finish, c.finish)


def test_disaggregation_decouples_ttft_from_tpot(phases):
    """More prompt work (longer prompts, same rate and outputs) raises TTFT in both modes,
    but TPOT only where prefills share the GPU with decodes."""
    def run(mode, prompt):
        return simulator.simulate(phases, rate=10.0, n_requests=600, prompt_len=prompt,
                                  output_len=(32, 128), seed=0, mode=mode, gpus=1,
                                  interconnect_bandwidth=H100.interconnect_bandwidth).percentiles()
    for mode in ("colocated", "disaggregated"):
        light, heavy = run(mode, 256), run(mode, 4096)
        assert heavy["ttft"][50] > 5 * light["ttft"][50], mode
        tpot_growth = heavy["tpot"][50] / light["tpot"][50]
        if mode == "disaggregated":
            assert tpot_growth < 1.3  # only the longer KV reads of each step
        else:
            assert tpot_growth > 2.0  # prefills stall everyone's decode


def test_simulation_is_fast(phases):
    reqs = workload.sample_requests(3000, 20.0, prompt_len=(64, 1024), output_len=(8, 64), seed=0)
    t0 = time.perf_counter()
    simulator.simulate_requests(reqs, phases, mode="colocated", max_batch=64)
    simulator.simulate_requests(reqs, phases, mode="disaggregated", interconnect_bandwidth=450e9)
    assert time.perf_counter() - t0 < 4.0  # ~0.2 s each on a 2-core machine; generous for noise


def test_load_sweep_rows(phases):
    rows = simulator.load_sweep(phases, [2.0, 8.0], n_requests=200, prompt_len=(256, 2048),
                                output_len=(8, 32), interconnect_bandwidth=450e9)
    assert [(r["rate"], r["mode"]) for r in rows] == [
        (2.0, "colocated"), (2.0, "disaggregated"), (8.0, "colocated"), (8.0, "disaggregated")]
    assert all(r["ttft_p50_ms"] > 0 and r["tpot_p50_ms"] > 0 for r in rows)
    assert "util_prefill" in rows[1] and "util_colocated" in rows[0]


# ----------------------------------------------------------------------------- errors
def test_invalid_arguments_raise(phases):
    reqs = workload.sample_requests(3, 1.0)
    with pytest.raises(ValueError, match="mode"):
        simulator.simulate_requests(reqs, phases, mode="mixed")
    with pytest.raises(ValueError, match="interconnect_bandwidth"):
        simulator.simulate_requests(reqs, phases, mode="disaggregated")
    with pytest.raises(ValueError, match="max_batch"):
        simulator.simulate_requests(reqs, phases, max_batch=0)
    with pytest.raises(ValueError, match="gpus"):
        simulator.simulate_requests(reqs, phases, gpus=0)
    with pytest.raises(ValueError, match="PhaseModel"):
        simulator.simulate_requests(reqs, "roofline")
    with pytest.raises(ValueError, match="rate"):
        workload.sample_requests(10, 0.0)
    with pytest.raises(ValueError, match="n_requests"):
        workload.sample_requests(0, 1.0)
    with pytest.raises(ValueError, match="prompt_len"):
        workload.sample_requests(10, 1.0, prompt_len=(100, 10))
    with pytest.raises(ValueError, match="output_len"):
        workload.sample_requests(10, 1.0, output_len=0)
    with pytest.raises(ValueError, match="ratio"):
        workload.sample_requests(10, 1.0, ratio=(47, 19))
    with pytest.raises(ValueError, match="tokens_per_s"):
        economics.cost_per_million_tokens(3.0, 0)
    with pytest.raises(ValueError, match="dollars_per_gpu_hour"):
        economics.cost_per_million_tokens(-1.0, 10)
    with pytest.raises(ValueError, match="dollars_per_gpu_hour"):
        economics.predicted_token_prices(CFG, hardware.PRESETS["L4"], batch=1, context=128)
    with pytest.raises(ValueError, match="batch"):
        economics.predicted_token_prices(CFG, H100, batch=0, context=128)


def test_the_price_ratio_scales_with_the_prefill_mfu_assumed():
    """At the roofline (prefill at 100% MFU) the floor stays above the 3-5x band; at half the
    peak FLOP/s, input tokens cost twice as much and the floor drops into the band."""
    full = economics.price_ratio_vs_batch(CFG, H100, [512], context=2048)[0]
    half = economics.price_ratio_vs_batch(CFG, H100, [512], context=2048, prefill_mfu=0.5)[0]
    assert full > 5 and 3 <= half <= 5
    assert half == pytest.approx(0.5 * full, rel=1e-9)  # prefill stays compute-bound
    slow_decode = economics.predicted_token_prices(CFG, H100, batch=8, context=2048, decode_mbu=0.5)
    assert slow_decode["ratio"] == pytest.approx(
        2 * economics.predicted_token_prices(CFG, H100, batch=8, context=2048)["ratio"], rel=1e-9)
    with pytest.raises(ValueError, match="prefill_mfu"):
        economics.predicted_token_prices(CFG, H100, batch=8, context=2048, prefill_mfu=0)
    with pytest.raises(ValueError, match="decode_mbu"):
        economics.predicted_token_prices(CFG, H100, batch=8, context=2048, decode_mbu=2)
