"""Figures build from synthetic records, use log axes where they should, carry units, save PNG."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from inference_lab import plots  # noqa: E402
from inference_lab.analytic import costs, roofline, simulator  # noqa: E402
from inference_lab.analytic.phases import roofline_phases  # noqa: E402
from inference_lab.base import hardware  # noqa: E402
from inference_lab.base.config import ModelConfig  # noqa: E402

SPEC = hardware.PRESETS["H200"]
CFG = ModelConfig.preset("base")


# The real record classes: the plots read them by attribute only.
from inference_lab.measure.records import DecodeRecord, PrefillRecord  # noqa: E402


def _sweep(device="NVIDIA H200", efficiency=0.4, overhead=2e-4, context=512, seed=0):
    """Records as a real sweep would make them: roofline time / efficiency + overhead + noise."""
    rng = np.random.default_rng(seed)
    out = []
    for T in (128, 512, 2048):
        c = costs.prefill_cost(CFG, 1, T)
        t = roofline.predict_time(c, SPEC, "bf16") / efficiency + overhead
        t *= rng.uniform(0.97, 1.03)
        out.append(PrefillRecord(device, "gpu", "pallas", "base", "bfloat16", 1, T, t, T / t,
                                 c.flops, c.bytes, None))
    for B in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        c = costs.decode_cost(CFG, B, context)
        t = roofline.predict_time(c, SPEC, "bf16") / efficiency + overhead
        t *= rng.uniform(0.97, 1.03)
        out.append(DecodeRecord(device, "gpu", "pallas", "base", "bfloat16", B, context, t, B / t,
                                c.bytes, c.flops, None, None))
    return out


def _has_vline(ax, x):
    return any(len(line.get_xdata()) == 2 and np.allclose(line.get_xdata(), [x, x]) for line in ax.get_lines())


def _check(fig, tmp_path, name, *, log_x, log_y, units):
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert (ax.get_xscale() == "log") == log_x and (ax.get_yscale() == "log") == log_y
    for label, unit in zip((ax.get_xlabel(), ax.get_ylabel()), units):
        assert f"({unit}" in label, (label, unit)
    path = tmp_path / f"{name}.png"
    fig.savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_roofline_plot_with_records(tmp_path):
    recs = _sweep()
    fig = plots.roofline_plot(SPEC, "bf16", recs, cfg=CFG)
    _check(fig, tmp_path, "roofline", log_x=True, log_y=True, units=("FLOP/byte", "TFLOP/s"))
    ax = fig.axes[0]
    # The ridge is drawn where peak / bandwidth says, and the roof reaches the peak.
    ridge = roofline.ridge_point(SPEC, "bf16")
    assert _has_vline(ax, ridge)
    roof = ax.get_lines()[0]
    assert roof.get_ydata().max() == pytest.approx(SPEC.peak_flops("bf16") / 1e12)
    # One measured marker per record plus one predicted marker each.
    assert len(ax.collections) >= 2 * len(recs)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"prefill, measured", "decode, measured", "prefill, predicted", "decode, predicted"} <= set(labels)


def test_roofline_plot_predicted_only_and_cpu_units(tmp_path):
    fig = plots.roofline_plot(SPEC, "bf16", cfg=CFG)
    _check(fig, tmp_path, "roofline_pred", log_x=True, log_y=True, units=("FLOP/byte", "TFLOP/s"))
    cpu = hardware.HardwareSpec(name="this CPU", flops={"fp32": 190e9}, bandwidth=28e9)
    fig = plots.roofline_plot(cpu, "float32", cfg=ModelConfig.preset("small"))
    assert "GFLOP/s" in fig.axes[0].get_ylabel()
    with pytest.raises(ValueError, match="bf16"):
        plots.roofline_plot(cpu, "bf16")


def test_decode_throughput_plot_marks_the_knee(tmp_path):
    recs = _sweep()
    fig = plots.decode_throughput_plot(recs, cfg=CFG, spec=SPEC)
    _check(fig, tmp_path, "decode", log_x=True, log_y=True, units=("sequences", "tokens/s"))
    ax = fig.axes[0]
    knee = roofline.measured_knee([r for r in recs if r.phase == "decode"])
    assert knee is not None
    assert _has_vline(ax, knee)
    assert any(f"B={knee}" in t.get_text() for t in ax.texts)
    # x is base 2 with plain batch ticks.
    assert ax.xaxis.get_scale() == "log" and 256 in list(ax.get_xticks())
    # A prediction alone works too (no records).
    plots.decode_throughput_plot([], cfg=CFG, spec=SPEC, context=128)
    with pytest.raises(ValueError, match="together"):
        plots.decode_throughput_plot(recs, cfg=CFG)


def test_ttft_plot(tmp_path):
    fig = plots.ttft_plot(_sweep(), cfg=CFG, spec=SPEC)
    _check(fig, tmp_path, "ttft", log_x=True, log_y=True, units=("tokens", "ms"))
    with pytest.raises(ValueError, match="prefill records"):
        plots.ttft_plot([])


def test_classroom_overlay_groups_by_device(tmp_path):
    recs = _sweep("NVIDIA H200", 0.4) + _sweep("NVIDIA L4", 0.1, 1e-3, seed=1) + _sweep("cpu", 0.02, 5e-3, seed=2)
    fig = plots.classroom_plot(recs)
    _check(fig, tmp_path, "classroom", log_x=True, log_y=True, units=("tokens", "tokens/s"))
    left, right = fig.axes[:2]
    assert right.get_xscale() == "log" and right.get_yscale() == "log"
    assert "(sequences" in right.get_xlabel() and "(tokens/s" in right.get_ylabel()
    assert len(left.get_lines()) == 3 and len(right.get_lines()) == 3
    assert sorted(t.get_text() for t in fig.legends[0].get_texts()) == ["NVIDIA H200", "NVIDIA L4", "cpu"]
    with pytest.raises(ValueError, match="records"):
        plots.classroom_plot([])
    with pytest.raises(ValueError, match="PrefillRecord"):
        plots.classroom_plot([object()])


def test_economics_figures(tmp_path):
    fig = plots.price_ratio_plot(ModelConfig.preset("llama3_8b"), hardware.PRESETS["H100_SXM"],
                                 batches=[1, 8, 64, 512], contexts=[512, 8192])
    _check(fig, tmp_path, "price", log_x=True, log_y=True, units=("sequences", "x"))
    phases = roofline_phases(ModelConfig.preset("llama3_8b"), hardware.PRESETS["H100_SXM"])
    rows = simulator.load_sweep(phases, [2.0, 6.0], n_requests=100, prompt_len=(256, 2048),
                                output_len=(8, 32), interconnect_bandwidth=450e9)
    fig = plots.serving_plot(rows)
    _check(fig, tmp_path, "serving", log_x=False, log_y=True, units=("requests/s", "ms"))
    assert [ax.get_title() for ax in fig.axes] == ["Time to first token", "TPOT: each request's mean gap",
                                                   "ITL: every gap"]
    assert all("(ms)" in ax.get_ylabel() for ax in fig.axes)


def test_serving_figures_tell_modes_apart_without_colour(tmp_path):
    """Every mode differs in marker and line style too, and a real vLLM run sits beside them."""
    from inference_lab.analytic import simulator
    from inference_lab.measure import vllm_bench
    from inference_lab.analytic.serving_metrics import SLO
    from pathlib import Path

    phases = roofline_phases(ModelConfig.preset("llama3_8b"), hardware.PRESETS["H100_SXM"])
    rows = simulator.load_sweep(phases, [2.0, 4.0], modes=simulator.MODES, n_requests=80,
                                prompt_len=(256, 2048), output_len=(8, 32), interconnect_bandwidth=450e9)
    (run,) = vllm_bench.load_vllm_bench(Path(__file__).parent / "fixtures" / "vllm_bench_serve.json")
    fig = plots.serving_plot(rows + [run.summary()])
    lines = fig.axes[1].get_lines()
    styles = {(ln.get_marker(), ln.get_linestyle()) for ln in lines}
    assert len(styles) == 4  # three modes and the measured run, each its own marker and line style
    res = {m: simulator.simulate(phases, rate=2.0, n_requests=80, mode=m, interconnect_bandwidth=450e9)
           for m in simulator.MODES}
    fig = plots.latency_distributions({**res, "vllm (measured)": run})
    assert len(fig.axes) == 3 and "gap" in fig.axes[2].get_xlabel()
    _check(fig, tmp_path, "cdf", log_x=True, log_y=False, units=("ms",))
    slo = SLO(ttft_ms=200, tpot_ms=20)
    grows = [dict(r.with_slo(slo).summary(), rate=2.0, config=m) for m, r in res.items()]
    fig = plots.goodput_plot(grows, slo=str(slo))
    assert "(requests/s" in fig.axes[0].get_ylabel() and "TTFT <= 200 ms" in fig.axes[0].get_title()
    with pytest.raises(ValueError, match="slo"):
        plots.goodput_plot([dict(r.summary(), rate=2.0, config=m) for m, r in res.items()])
    fig = plots.pool_balance_plot(["1P3D", "2P2D", "3P1D"], [10, 20, 30], [60, 40, 20])
    assert any("best: 2P2D" in t.get_text() for t in fig.axes[0].texts)
    _check(fig, tmp_path, "pools", log_x=False, log_y=False, units=("x prefill", "requests/s"))


def test_experiment_figures(tmp_path):
    from inference_lab.measure.matmuls import KernelPoint
    from inference_lab.lessons.arithmetic_intensity import Op

    recs = [r for r in _sweep() if isinstance(r, DecodeRecord)]
    ctx = []
    for c in (512, 2048, 8192):
        cost = costs.decode_cost(CFG, 1, c)
        t = roofline.predict_time(cost, SPEC, "bf16") / 0.5
        ctx.append(DecodeRecord("NVIDIA H200", "gpu", "pallas", "base", "bfloat16", 1, c, t, 1 / t, cost.bytes,
                                cost.flops, None, None))
    fig = plots.flops_or_bytes(recs[:5], ctx)
    assert len(fig.axes) == 2 and all(len(ax.get_lines()) == 3 for ax in fig.axes)
    styles = {line.get_linestyle() for line in fig.axes[0].get_lines()}
    assert len(styles) == 3                       # paired series differ by line style, not colour alone
    _check(fig, tmp_path, "fob", log_x=True, log_y=True, units=("FLOPs", "x"))
    ks = [KernelPoint(m, 4096, 4096, "float32", 0.002 * (1 + 0.3 * m)) for m in (1, 2, 4, 8)]
    fig = plots.kernel_vs_model(recs[:4], ks, cfg=CFG, spec=SPEC)
    assert len(fig.axes[0].get_lines()) >= 3
    _check(fig, tmp_path, "knee", log_x=True, log_y=True, units=("model", "x"))
    with pytest.raises(ValueError, match="batch 1"):
        plots.kernel_vs_model(recs[1:4], ks)
    ops = [Op("stream", "1 KiB", 256, 1024, 8e-6), Op("stream", "256 MiB", 6.7e7, 2**28, 6e-3),
           Op("matmul", "1024", 2.1e9, 1.2e7, 0.012)]
    spec = hardware.HardwareSpec("cpu", {"fp32": 190e9}, 50e9, overhead_s=6e-6)
    fig = plots.three_regimes(ops, spec, "fp32")
    _check(fig, tmp_path, "regimes", log_x=True, log_y=True, units=("s", "s"))
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("overhead-bound" in t for t in legend) and any("compute-bound" in t for t in legend)
    fig = plots.users_vs_total(recs, highlight=8)
    _check(fig, tmp_path, "users", log_x=True, log_y=True, units=("sequences", "tokens/s"))
    fig = plots.ratio_vs_ridge([{"label": "cpu", "ideal": 7.8, "measured": 12.0},
                                {"label": "node", "ideal": 295.0, "measured": 30.4, "quoted": True}])
    _check(fig, tmp_path, "ratio", log_x=True, log_y=True, units=("ridge", "batch 1"))
    with pytest.raises(ValueError):
        plots.ratio_vs_ridge([])


def test_classroom_overlay_keeps_runs_apart(tmp_path):
    fig = plots.classroom_plot({"cpu (run a)": _sweep("cpu", 0.02), "cpu (run b)": _sweep("cpu", 0.03, seed=1)})
    assert sorted(t.get_text() for t in fig.legends[0].get_texts()) == ["cpu (run a)", "cpu (run b)"]
    assert len({line.get_linestyle() for line in fig.axes[1].get_lines()}) == 2


def test_the_request_timeline_writes_plain_numbers():
    """Issue 26: 01's timeline said "1.48e+03 ms"."""
    fig = plots.request_timeline(1.48, 0.3, 512, 16)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts] + [fig.alt_text]
    assert any("1,480 ms" in t for t in texts) and any("300 ms" in t for t in texts), texts
    assert not any("e+" in t for t in texts), texts
    assert [plots.style.amount(v) for v in (0.0123, 4.56, 789.4, 1480.0)] == ["0.0123", "4.56", "789", "1,480"]
