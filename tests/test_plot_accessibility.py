"""Every lesson figure reads without colour vision and without sight.

- No two series of a figure differ by colour alone: two lines, two scatters or two bar series in
  one panel that share marker, line style, fill and hatching but not colour fail (a reader who
  cannot tell vermillion from green, or a greyscale print, sees one series). A figure built to
  break the rule proves the check can fail.
- Every figure carries a one-line description with its numbers (``fig.alt_text``), which a
  notebook stores as the image's ``alt`` and a dashboard shows as its caption.
- Every log axis shows at least two tick labels in view (one, or none, does not give the scale).
- No legend sits on a line of its panel, and no two labels of a panel print over each other.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402
from matplotlib.colors import to_hex, to_rgba  # noqa: E402
from matplotlib.container import BarContainer  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from inference_lab import plots
from inference_lab.analytic import costs, roofline, simulator
from inference_lab.analytic.phases import roofline_phases
from inference_lab.base import hardware  # noqa: E402
from inference_lab.base.config import ModelConfig  # noqa: E402
from inference_lab.measure.matmuls import KernelPoint  # noqa: E402
from inference_lab.lessons.arithmetic_intensity import Op  # noqa: E402
from inference_lab.measure.records import DecodeRecord, PrefillRecord  # noqa: E402

SPEC = hardware.PRESETS["H200"]
H100 = hardware.PRESETS["H100_SXM"]
CFG = ModelConfig.preset("base")
CFG8B = ModelConfig.preset("llama3_8b")


# ------------------------------------------------------------------------ the colour-only check
@dataclass(frozen=True)
class Series:
    panel: int
    label: str
    kind: str        # line, scatter, bar
    marker: object   # marker name, or the marker path's vertices for a scatter
    linestyle: str
    fill: str        # filled / hollow
    hatch: str
    colour: str


def _no(value) -> bool:
    return value is None or str(value).lower() in ("", " ", "none")


def _whiteish(colour) -> bool:
    r, g, b, a = to_rgba(colour)
    return a == 0 or min(r, g, b) > 0.95


def series(fig) -> list[Series]:
    """The legend-labelled series of every panel, with what tells them apart."""
    out = []
    for i, ax in enumerate(fig.axes):
        for line in ax.get_lines():
            if line.get_label().startswith("_") or not line.get_visible():
                continue
            marker = "none" if _no(line.get_marker()) else str(line.get_marker())
            ls = "none" if _no(line.get_linestyle()) else str(line.get_linestyle())
            hollow = marker != "none" and _whiteish(line.get_markerfacecolor())
            out.append(Series(i, line.get_label(), "line", marker, ls, "hollow" if hollow else "filled", "",
                              to_hex(line.get_color())))
        for coll in ax.collections:
            if not isinstance(coll, PathCollection) or coll.get_label().startswith("_"):
                continue
            shape = tuple(np.round(coll.get_paths()[0].vertices, 3).ravel())
            faces, edges = coll.get_facecolors(), coll.get_edgecolors()
            hollow = len(faces) == 0 or _whiteish(faces[0])
            colour = edges[0] if hollow and len(edges) else faces[0]
            out.append(Series(i, coll.get_label(), "scatter", shape, "none", "hollow" if hollow else "filled",
                              coll.get_hatch() or "", to_hex(colour)))
        for cont in ax.containers:
            if not isinstance(cont, BarContainer) or cont.get_label().startswith("_") or not cont.patches:
                continue
            patch = cont.patches[0]
            out.append(Series(i, cont.get_label(), "bar", "", "", "", patch.get_hatch() or "",
                              to_hex(patch.get_facecolor())))
    return out


def colour_only_pairs(fig) -> list[tuple[str, str]]:
    """Pairs of series in one panel that differ by colour and by nothing else a reader sees."""
    pairs = []
    for a, b in itertools.combinations(series(fig), 2):
        same_look = (a.panel, a.kind, a.marker, a.linestyle, a.fill, a.hatch) == \
                    (b.panel, b.kind, b.marker, b.linestyle, b.fill, b.hatch)
        if same_look and a.colour != b.colour:
            pairs.append((a.label, b.label))
    return pairs


def test_the_check_fails_on_series_told_apart_by_colour_only():
    fig = Figure()
    left, middle, right = fig.subplots(1, 3)
    left.plot([1, 2], [1, 2], "-o", color="#c62d42", label="colocated")
    left.plot([1, 2], [2, 3], "-o", color="#2a9d4b", label="disaggregated")
    middle.scatter([1], [1], color="red", label="a")
    middle.scatter([2], [2], color="green", label="b")
    right.bar([0], [1], color="blue", label="prefill")
    right.bar([1], [2], color="orange", label="decode")
    assert colour_only_pairs(fig) == [("colocated", "disaggregated"), ("a", "b"), ("prefill", "decode")]

    fixed = Figure()
    left, middle, right = fixed.subplots(1, 3)
    left.plot([1, 2], [1, 2], "-o", color="#c62d42", label="colocated")
    left.plot([1, 2], [2, 3], ":^", color="#2a9d4b", label="disaggregated")
    middle.scatter([1], [1], color="red", marker="o", label="a")
    middle.scatter([2], [2], color="green", marker="s", label="b")
    right.bar([0], [1], color="blue", label="prefill")
    right.bar([1], [2], color="orange", hatch="//", label="decode")
    assert colour_only_pairs(fixed) == []


# ------------------------------------------------------------------------ every lesson figure
def _records(device="NVIDIA H200", efficiency=0.4, overhead=2e-4, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for batch in (1, 4):
        for T in (128, 512, 2048):
            c = costs.prefill_cost(CFG, batch, T)
            t = (roofline.predict_time(c, SPEC, "bf16") / efficiency + overhead) * rng.uniform(0.97, 1.03)
            out.append(PrefillRecord(device, "gpu", "pallas", "base", "bfloat16", batch, T, t, batch * T / t,
                                     c.flops, c.bytes, None))
    for context in (512, 4096):
        for B in (1, 2, 4, 8, 16, 32, 64):
            c = costs.decode_cost(CFG, B, context)
            t = (roofline.predict_time(c, SPEC, "bf16") / efficiency + overhead) * rng.uniform(0.97, 1.03)
            out.append(DecodeRecord(device, "gpu", "pallas", "base", "bfloat16", B, context, t, B / t,
                                    c.bytes, c.flops, c.bytes / t / SPEC.bandwidth, None))
    return out


def _decode_batch1(recs):
    return [r for r in recs if r.phase == "decode" and r.batch == 1]


def _simulated():
    phases = roofline_phases(CFG8B, H100)
    rows = simulator.load_sweep(phases, [2.0, 6.0], n_requests=80, prompt_len=(256, 2048), output_len=(8, 32),
                                interconnect_bandwidth=450e9)
    runs = {mode: simulator.simulate(phases, rate=4.0, n_requests=80, prompt_len=(256, 2048), output_len=(8, 32),
                                     mode=mode, **({"interconnect_bandwidth": 450e9} if mode != "colocated" else {}))
            for mode in ("colocated", "disaggregated")}
    return rows, runs


def _goodput_rows():
    from inference_lab.analytic.serving_metrics import SLO

    phases = roofline_phases(CFG8B, H100)
    slo = SLO(ttft_ms=200, tpot_ms=20)
    return [dict(simulator.simulate(phases, rate=rate, n_requests=60, mode=m, interconnect_bandwidth=450e9)
                 .with_slo(slo).summary(), rate=rate, config=m)
            for m in simulator.MODES for rate in (2.0, 6.0)]


FIGURES = {
    "roofline_plot": lambda: plots.roofline_plot(SPEC, "bf16", _records(), cfg=CFG),
    "ridge_comparison": lambda: plots.ridge_comparison([H100, SPEC], ["bf16", "bf16"]),
    "intensity_vs_context": lambda: plots.intensity_vs_context(CFG8B, batches=(1, 8, 64)),
    "time_split_bars": lambda: plots.time_split_bars(1e-3, 5e-3),
    "kitchen": lambda: plots.kitchen(CFG8B, H100),
    "request_timeline": lambda: plots.request_timeline(0.1, 0.9, 256, 16),
    "two_speeds_bars": lambda: plots.two_speeds_bars(
        SimpleNamespace(prefill_tokens_per_s=3000.0, decode_tokens_per_s=120.0),
        reference={"name": "27B on 4xH100", "prefill_tokens_per_s": 3288, "decode_tokens_per_s": 108}),
    "ttft_plot": lambda: plots.ttft_plot(_records(), cfg=CFG, spec=SPEC),
    "prefill_flops_vs_length": lambda: plots.prefill_flops_vs_length(
        [r for r in _records() if r.phase == "prefill" and r.batch == 1], SPEC, "bf16", highlight=512),
    "decode_bytes_bars": lambda: plots.decode_bytes_bars(_decode_batch1(_records()), CFG, highlight=512),
    "decode_time_vs_bytes": lambda: plots.decode_time_vs_bytes(_decode_batch1(_records()), SPEC, "bf16"),
    "decode_throughput_plot": lambda: plots.decode_throughput_plot(
        [r for r in _records() if r.phase == "decode" and r.context == 512], cfg=CFG, spec=SPEC),
    "classroom_plot": lambda: plots.classroom_plot(
        [r for i in range(13) for r in _records(f"device {i:02d}", 0.4 / (i + 1), seed=i)]),
    "price_ratio_plot": lambda: plots.price_ratio_plot(CFG8B, H100, contexts=(512, 2048, 8192)),
    "serving_plot": lambda: plots.serving_plot(_simulated()[0]),
    "latency_distributions": lambda: plots.latency_distributions(_simulated()[1]),
    "goodput_plot": lambda: plots.goodput_plot(_goodput_rows()),
    "kv_memory_plot": lambda: plots.kv_memory_plot(
        [{"budget": b, "layout": lay, "at_once": b * (3 if lay == "paged" else 1), "tokens_per_s": 300 * b * (
            1.5 if lay == "paged" else 1), "ttft_p50_ms": 2000 / b} for b in (2, 3, 4, 6) for lay in ("contiguous", "paged")],
        [{"budget": 2, "layout": "contiguous", "at_once": 1.9, "tokens_per_s": 640, "ttft_p50_ms": 1800},
         {"budget": 2, "layout": "paged", "at_once": 5.8, "tokens_per_s": 990, "ttft_p50_ms": 900}]),
    "quantization_plot": lambda: plots.quantization_plot(
        [{"format": f, "batch": b, "decode_tokens_per_s": b * 100 / (1 + b / (4 * (i + 1)))}
         for i, f in enumerate(("float32", "int8", "int4 g32", "int4 g128")) for b in (1, 2, 4, 8, 16, 32, 64)],
        [{"format": "float32", "batch": 1, "decode_tokens_per_s": 90}, {"format": "int8 x int8", "batch": 8,
          "decode_tokens_per_s": 700}, {"format": "int8, weight-only", "batch": 1, "decode_tokens_per_s": 50}],
        mark_batch=8),
    "step_timeline_plot": lambda: plots.step_timeline_plot(
        [0.02 * i for i in range(1, 150)], [8 + 14 * (i % 7 == 0) + (9 if i == 77 else 0) for i in range(1, 150)],
        [{"at": 0.02 * i, "ms": 8 + 14 * (i % 7 == 0) + (9 if i == 77 else 0), "prompt_tokens": 48 * (i % 7 == 0),
          "predicted_ms": 7.5 + 13 * (i % 7 == 0)} for i in range(1, 150)], target_ms=20.0),
    "pool_balance_plot": lambda: plots.pool_balance_plot(["1P3D", "2P2D", "3P1D"], [10, 20, 30], [60, 40, 20]),
    "token_timeline": lambda: plots.token_timeline([0.05 + 0.004 * i for i in range(20)]),
    "flops_or_bytes": lambda: plots.flops_or_bytes(
        [r for r in _records() if r.phase == "decode" and r.context == 512],
        [r for r in _records() if r.phase == "decode" and r.batch == 1]),
    "kernel_vs_model": lambda: plots.kernel_vs_model(
        [r for r in _records() if r.phase == "decode" and r.context == 512],
        [KernelPoint(m, 4096, 4096, "bfloat16", 2e-3 * (1 + 0.3 * m)) for m in (1, 2, 4, 8)]
        + [KernelPoint(m, 8192, 1, "bfloat16", 1e-3 * (1 + 0.1 * m)) for m in (1, 2, 4, 8)], cfg=CFG, spec=SPEC),
    "three_regimes": lambda: plots.three_regimes(
        [Op("stream", "1 KiB", 256, 1024, 8e-6), Op("stream", "256 MiB", 6.7e7, 2**28, 6e-3),
         Op("matmul", "1024", 2.1e9, 1.2e7, 0.012), Op("decode", "base", 1e9, 1e9, 3e-3)],
        hardware.HardwareSpec("cpu", {"fp32": 190e9}, 50e9, overhead_s=6e-6), "fp32"),
    "users_vs_total": lambda: plots.users_vs_total(
        [r for r in _records() if r.phase == "decode" and r.context == 512], highlight=8),
    "ratio_vs_ridge": lambda: plots.ratio_vs_ridge(
        [{"label": f"machine {i}", "ideal": 5.0 * (i + 1), "measured": 7.0 * (i + 1)} for i in range(12)]
        + [{"label": "27B on 4xH100 (quoted)", "ideal": 295.0, "measured": 30.4, "quoted": True}]),
    "cache_vs_recompute": lambda: plots.cache_vs_recompute(range(10, 30), [1e-3 * (1 + i / 10) for i in range(20)],
                                                           [8e-4] * 20),
    "speedup_over_k": lambda: plots.speedup_over_k([1, 2, 3, 4, 6], [0.9, 1.2, 1.4, 1.5, 1.6], [1.0, 1.3, 1.5, 1.7, 1.9],
                                                   draft="n-gram", highlight=4),
    "verify_cost_over_batch": lambda: plots.verify_cost_over_batch([1, 2, 4, 8, 16], [1.3, 1.4, 1.9, 2.8, 4.1],
                                                                   [1.1, 1.2, 1.6, 2.5, 4.5], k=4, highlight=8),
}


@functools.cache
def lesson_figure(name: str):
    """FIGURES[name], built once for all the checks of this module (they only read it)."""
    return FIGURES[name]()


def _renderer(fig):
    """The figure drawn once by Agg, as it will be shown; its renderer."""
    if getattr(fig, "_checked_renderer", None) is None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        fig._checked_renderer = canvas.get_renderer()
    return fig._checked_renderer


def test_every_public_figure_is_checked():
    public = {name for name in plots.__all__ if name[0].islower() and name != "alt_text"}
    assert public == set(FIGURES), f"add these figures to FIGURES: {sorted(public - set(FIGURES))}"


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_no_series_told_apart_by_colour_alone(name):
    fig = lesson_figure(name)
    assert colour_only_pairs(fig) == [], f"{name}: series that differ by colour only"


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_every_figure_says_what_it_shows(name):
    fig = lesson_figure(name)
    text = fig.alt_text
    assert isinstance(fig, plots.LabFigure) and plots.alt_text(fig) == text
    assert "\n" not in text and 40 <= len(text) <= 700, f"{name}: {text!r}"
    assert any(ch.isdigit() for ch in text), f"{name}: the description should carry the figure's numbers"
    titles = {ax.get_title() for ax in fig.axes}
    assert text not in titles


def log_axes_with_few_labels(fig) -> list[tuple[int, str, list[str]]]:
    """(panel, "x"/"y", the labels in view) of each log axis drawn with fewer than two labels."""
    _renderer(fig)
    few = []
    for panel, ax in enumerate(fig.axes):
        for name, axis, limits in (("x", ax.xaxis, ax.get_xlim()), ("y", ax.yaxis, ax.get_ylim())):
            if axis.get_scale() != "log":
                continue
            lo, hi = sorted(limits)
            at = 0 if name == "x" else 1
            shown = [t.get_text() for t in axis.get_majorticklabels() + axis.get_minorticklabels()
                     if t.get_visible() and t.get_text().strip() and lo * 0.999 <= t.get_position()[at] <= hi * 1.001]
            if len(shown) < 2:
                few.append((panel, name, shown))
    return few


def test_the_tick_check_fails_on_a_short_log_axis():
    bare = Figure()
    ax = bare.subplots()
    ax.plot([1, 2], [3.0, 8.0])
    ax.set_yscale("log")
    plots.style.plain_ticks(ax, "y")   # plain decade labels, minor ticks unlabelled: none in 3..8
    assert log_axes_with_few_labels(bare) == [(0, "y", [])]
    fixed = plots.style.describe(bare, "a short log axis, 3 to 8")
    assert log_axes_with_few_labels(fixed) == []


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_every_log_axis_shows_its_scale(name):
    assert log_axes_with_few_labels(lesson_figure(name)) == [], f"{name}: a log axis with fewer than two labels"


def legends_on_lines(fig) -> list[tuple[int, str]]:
    """(panel, line label) for each line that passes under its panel's legend, drawn as shown."""
    renderer = _renderer(fig)
    found = []
    for panel, ax in enumerate(fig.axes):
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(renderer).shrunk(0.98, 0.9)
        for line in ax.get_lines():
            xy = np.column_stack([np.asarray(line.get_xdata(orig=False), float),
                                  np.asarray(line.get_ydata(orig=False), float)])
            pts = ax.transData.transform(xy[np.isfinite(xy).all(axis=1)])
            along = [a + (b - a) * t for a, b in zip(pts[:-1], pts[1:]) for t in np.linspace(0, 1, 40)]
            if any(box.contains(x, y) for x, y in [*pts, *along]):
                found.append((panel, line.get_label()))
    return found


def test_the_legend_check_fails_on_a_legend_over_a_line():
    fig = Figure()
    ax = fig.subplots()
    ax.plot([0, 1], [1, 0], label="falls from the top left")
    ax.plot([0, 1], [0.5, 0.6], "--", label="flat")
    ax.legend(loc="upper left")
    assert (0, "falls from the top left") in legends_on_lines(fig)
    fig = Figure()
    ax = fig.subplots()
    ax.plot([0, 1], [1, 0], label="falls from the top left")
    ax.plot([0, 1], [0.5, 0.6], "--", label="flat")
    plots.style.legend_clear_of_data(ax, "upper left")
    assert legends_on_lines(fig) == []


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_no_legend_on_a_line(name):
    assert legends_on_lines(lesson_figure(name)) == [], f"{name}: its legend covers a line"


def overlapping_labels(fig) -> list[tuple[int, str, str]]:
    """(panel, text, text) for each two texts of a panel whose drawn boxes overlap (an
    annotation's own text, not its leader line)."""
    from matplotlib.text import Text

    renderer = _renderer(fig)
    found = []
    for panel, ax in enumerate(fig.axes):
        boxes = [(t.get_text(), Text.get_window_extent(t, renderer)) for t in ax.texts
                 if t.get_visible() and t.get_text().strip()]
        found += [(panel, a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2) if box_a.overlaps(box_b)]
    return found


def test_the_label_check_fails_on_two_close_points():
    def two_machines(apart):
        fig = Figure()
        ax = fig.subplots()
        ax.scatter([9.07, 7.81], [10.0, 9.46])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(2, 900)   # as in notebook 06, beside a quoted 4xH100 point
        ax.set_ylim(2, 900)
        items = [(9.07, 10.0, "10x of 9.07x"), (7.81, 9.46, "9.46x of 7.81x")]
        if apart:
            plots.style.annotate_apart(ax, items)
        else:
            for x, y, text in items:
                ax.annotate(text, (x, y), xytext=(6, -12), textcoords="offset points", fontsize=8)
        return fig

    assert overlapping_labels(two_machines(apart=False)) == [(0, "10x of 9.07x", "9.46x of 7.81x")]
    assert overlapping_labels(two_machines(apart=True)) == []


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_no_labels_over_each_other(name):
    assert overlapping_labels(lesson_figure(name)) == [], f"{name}: labels print over each other"


def test_displayed_figures_store_their_description_as_alt():
    """In IPython (the notebooks' inline backend) the PNG output carries the description."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.core.pylabtools import select_figure_formats

    shell = InteractiveShell.instance()
    try:
        select_figure_formats(shell, {"png"})
        fig = FIGURES["time_split_bars"]()
        data, metadata = shell.display_formatter.format(fig)
        assert "image/png" in data and metadata["image/png"]["alt"] == fig.alt_text
    finally:
        InteractiveShell.clear_instance()


def test_alt_text_of_a_plain_figure_falls_back_to_its_titles():
    fig = Figure()
    fig.subplots().set_title("Hand-made figure")
    assert plots.alt_text(fig) == "Hand-made figure"
