"""Figures for the lessons: the roofline, decode sweeps, TTFT, the classroom overlay, economics.

Every function returns a :class:`matplotlib.figure.Figure` built without pyplot (so nothing
is shown twice in a notebook and nothing needs a display: works under Agg), sized for a
notebook cell; ``fig.savefig("x.png")`` writes the PNG. Records are read by attribute
(``PrefillRecord``/``DecodeRecord`` of INTERFACES.md, or anything with the same fields), so
plots never depend on where records came from.

Colours carry meaning throughout: blue = prefill, orange = decode, grey = the roofline;
filled markers are measured, hollow ones predicted.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from inference_lab import roofline

__all__ = ["roofline_plot", "decode_throughput_plot", "ttft_plot", "classroom_plot",
           "price_ratio_plot", "serving_plot", "PREFILL_COLOR", "DECODE_COLOR"]

PREFILL_COLOR = "#1f6fb4"
DECODE_COLOR = "#e07b00"
ROOF_COLOR = "#4a4a4a"
GRID = dict(which="major", color="#dddddd", linewidth=0.8)
GRID_MINOR = dict(which="minor", color="#f0f0f0", linewidth=0.5)
DEVICE_MARKERS = "osD^vP*Xh<>"


# ----------------------------------------------------------------------------- helpers
def _figure(ncols: int = 1, width: float = 7.0, height: float = 4.6):
    fig = Figure(figsize=(width, height), layout="constrained", dpi=110)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    for ax in axes:
        ax.set_axisbelow(True)
        ax.spines[["top", "right"]].set_visible(False)
    return fig, axes


def _style_log(ax, x=True, y=True):
    if x:
        ax.set_xscale("log")
    if y:
        ax.set_yscale("log")
    ax.grid(True, **GRID)
    ax.grid(True, **GRID_MINOR)


def _plain_ticks(ax, axis="x"):
    """Log axis ticks written as plain numbers (1, 8, 64 rather than 10^0 ...)."""
    fmt = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}")
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_formatter(fmt)
    target.set_minor_formatter(NullFormatter())


def _length_ticks(ax, lengths):
    """Ticks at the measured prompt lengths when there are few of them, plain numbers."""
    lengths = sorted(set(lengths))
    if 1 < len(lengths) <= 10:
        ax.set_xticks(lengths)
    _plain_ticks(ax, "x")


def _base2_batches(ax, batches):
    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(b) for b in batches))
    if len(ticks) <= 12:
        ax.set_xticks(ticks)
    _plain_ticks(ax, "x")


def _si(v: float) -> str:
    """1.2e12 -> '1.2 T' (value and SI prefix, for labels and ticks)."""
    for scale, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:,.3g} {p}"
    return f"{v:,.3g} "


def _si_ticks(ax, axis="y"):
    """Log-axis ticks as 500, 2k, 40k, 1.5M. Minor ticks get labels only on short axes."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    lim = ax.get_ylim if axis == "y" else ax.get_xlim

    def major(v, _):
        return _si(v).replace(" ", "")

    def minor(v, _):
        lo, hi = lim()
        if hi / max(lo, 1e-300) > 30:
            return ""
        mant = v / 10 ** math.floor(math.log10(v) + 1e-9)
        return major(v, _) if round(mant) in (2, 5) else ""

    target.set_major_formatter(FuncFormatter(major))
    target.set_minor_formatter(FuncFormatter(minor))


def _flops_unit(peak: float):
    for scale, name in ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s")):
        if peak >= 3 * scale:
            return scale, name
    return 1e6, "MFLOP/s"


def _is_decode(rec) -> bool:
    return getattr(rec, "step_seconds", None) is not None or getattr(rec, "phase", None) == "decode"


def _is_prefill(rec) -> bool:
    return not _is_decode(rec) and getattr(rec, "prompt_len", None) is not None \
        and getattr(rec, "seconds", None) is not None


def _median_by(pairs):
    groups = defaultdict(list)
    for k, v in pairs:
        if v is not None:
            groups[k].append(float(v))
    keys = sorted(groups)
    return np.array(keys, dtype=float), np.array([np.median(groups[k]) for k in keys])


def _records(records) -> list:
    records = list(records or [])
    for r in records:
        if not (_is_decode(r) or _is_prefill(r)):
            raise ValueError(
                f"record {r!r} is neither a PrefillRecord (prompt_len, seconds) nor a "
                "DecodeRecord (batch, step_seconds): pass measure.load_records(...) output"
            )
    return records


def _prediction_args(recs, cfg, spec, name: str, kind: str):
    """A figure needs ``kind`` records, or ``cfg`` and ``spec`` (both) to draw a prediction."""
    if not recs and cfg is None:
        raise ValueError(f"{name} needs {kind} records or cfg= and spec= for a prediction")
    if (cfg is None) != (spec is None):
        raise ValueError("pass cfg= and spec= together (the prediction needs both)")


def _check_spec(spec, dtype):
    roofline._check_spec(spec)
    return spec.peak_flops(dtype)  # raises a clear ValueError for an unknown dtype


# ----------------------------------------------------------------------------- roofline
def roofline_plot(spec, dtype="bf16", records: Iterable = (), *, cfg=None,
                  prefill_lengths: Sequence[int] = (128, 512, 4096),
                  decode_batches: Sequence[int] = (1, 8, 64, 256), context: int = 1024,
                  title: str | None = None) -> Figure:
    """Log-log roofline of ``spec``: attainable FLOP/s against arithmetic intensity.

    The roof is ``min(peak, intensity x bandwidth)``; the dotted line marks the ridge point.
    Measured records (filled) sit at their own intensity and achieved FLOP/s, each joined to
    the roof above it (hollow: what the roofline predicts at that intensity) by a thin line:
    the gap a better kernel or engine could close. With ``cfg`` and no records the figure
    shows predicted points for prefills of ``prefill_lengths`` (batch 1) and decode steps of
    ``decode_batches`` at ``context``: where each phase sits before anything is measured.
    """
    peak = _check_spec(spec, dtype)
    records = _records(records)
    bw = spec.bandwidth
    ridge = peak / bw
    scale, unit = _flops_unit(peak)
    fig, (ax,) = _figure(width=9.0)

    # points: (intensity, achieved FLOP/s or None, phase, label)
    points = []
    for r in records:
        if _is_decode(r):
            f, b, t = r.flops_per_step, r.bytes_per_step, r.step_seconds
            points.append((f / b, f / t, "decode", f"B={r.batch}"))
        else:
            f, b, t = r.flops, r.bytes, r.seconds
            points.append((f / b, f / t, "prefill", f"T={r.prompt_len}"))
    if cfg is not None and not records:
        for T in prefill_lengths:
            c = roofline.prefill_cost(cfg, 1, T)
            points.append((c.intensity, None, "prefill", f"T={T}"))
        for B in decode_batches:
            c = roofline.decode_cost(cfg, B, context)
            points.append((c.intensity, None, "decode", f"B={B}"))

    xs = [p[0] for p in points] + [ridge]
    lo = 10 ** math.floor(math.log10(max(min(xs) / 3, 1e-3)))
    hi = 10 ** math.ceil(math.log10(max(xs) * 3))
    x = np.logspace(math.log10(lo), math.log10(hi), 400)
    roof = np.minimum(peak, x * bw)
    ax.plot(x, roof / scale, color=ROOF_COLOR, lw=2.4, zorder=2,
            label=f"roofline: {spec.name}, {dtype}\n{_si(peak)}FLOP/s, {_si(bw)}B/s")
    ax.fill_between(x, roof / scale, (lo * bw) / scale / 10, color="#f2f2f2", zorder=0)
    ax.axvline(ridge, color=ROOF_COLOR, ls=":", lw=1.2)
    ax.text(lo * 1.3, peak / scale * 1.12, f"peak {peak / scale:,.0f} {unit}", fontsize=9, color=ROOF_COLOR)

    seen = set()
    for inten, achieved, phase, label in points:
        color = PREFILL_COLOR if phase == "prefill" else DECODE_COLOR
        marker = "o" if phase == "prefill" else "^"
        on_roof = min(peak, inten * bw) / scale
        pred_label = f"{phase}, predicted" if (phase, "p") not in seen else None
        seen.add((phase, "p"))
        ax.scatter([inten], [on_roof], s=60, facecolors="white", edgecolors=color, marker=marker,
                   linewidths=1.6, zorder=4, label=pred_label)
        if achieved is not None:
            meas_label = f"{phase}, measured" if (phase, "m") not in seen else None
            seen.add((phase, "m"))
            ax.plot([inten, inten], [achieved / scale, on_roof], color=color, lw=0.8, alpha=0.6, zorder=3)
            ax.scatter([inten], [achieved / scale], s=55, color=color, marker=marker, zorder=5,
                       edgecolors="white", linewidths=0.6, label=meas_label)
        ax.annotate(label, xy=(inten, on_roof if achieved is None else achieved / scale),
                    xytext=(6, 4) if achieved is not None else (7, -12),
                    textcoords="offset points", fontsize=8, color=color)

    _style_log(ax)
    ax.set_xlim(lo, hi)
    ymin = min([(lo * bw)] + [p[1] for p in points if p[1]]) / scale / 2
    ax.set_ylim(ymin, peak / scale * 2.5)
    # Region names and the ridge, along the bottom where no point lives.
    ax.text(ridge * 1.12, ymin * 1.3, f"ridge {ridge:,.0f} FLOP/byte", rotation=90, fontsize=9,
            color=ROOF_COLOR, va="bottom", ha="left")
    ax.text(ridge / 1.6, ymin * 1.3, "\u2190 memory-bound", fontsize=9, color="#777777",
            ha="right", va="bottom")
    ax.text(ridge * 2.2, ymin * 1.3, "compute-bound \u2192", fontsize=9, color="#777777",
            ha="left", va="bottom")
    _si_ticks(ax, "x")
    _plain_ticks(ax, "y")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel(f"attainable performance ({unit})")
    ax.set_title(title or f"Roofline of {spec.name}: where prefill and decode sit")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside right upper", fontsize=8, frameon=False)
    return fig


# ----------------------------------------------------------------------------- decode sweep
def decode_throughput_plot(records: Iterable, *, cfg=None, spec=None, dtype=None,
                           context: int | None = None, knee_factor: float = 1.5,
                           title: str | None = None) -> Figure:
    """Decode tokens/s against batch size: measured points, the roofline curve, both knees.

    ``records``: the decode records of one sweep (prefill records are ignored). With ``cfg``
    and ``spec`` the predicted tokens/s is drawn (solid: with the KV-cache term; dashed:
    weights only) at ``context`` (default: the records' context), with the predicted flip.
    The measured knee (first batch whose step takes >= 1.5x the batch-1 step) is marked.
    """
    recs = [r for r in _records(records) if _is_decode(r)]
    _prediction_args(recs, cfg, spec, "decode_throughput_plot", "decode")
    fig, (ax,) = _figure()
    batches_all = [int(r.batch) for r in recs]
    if context is None:
        contexts = sorted({int(r.context) for r in recs})
        context = contexts[len(contexts) // 2] if contexts else 1024
    if recs:
        b, tps = _median_by((int(r.batch), r.decode_tokens_per_s) for r in recs)
        ax.plot(b, tps, "-", color=DECODE_COLOR, lw=1.0, alpha=0.5)
        ax.scatter(b, tps, s=60, color=DECODE_COLOR, zorder=5, edgecolors="white",
                   label=f"measured ({recs[0].device})")
    top = max(batches_all + [256 if not recs else 1])
    if cfg is not None:
        dt = dtype if dtype is not None else cfg.dtype
        grid = np.unique(np.round(np.logspace(0, math.log2(max(top, 2)) * math.log10(2), 200)).astype(int))
        pred = [roofline.predicted_decode_tokens_per_s(cfg, spec, int(g), context, dt) for g in grid]
        pred0 = [roofline.predicted_decode_tokens_per_s(cfg, spec, int(g), context, dt, include_kv=False)
                 for g in grid]
        flip = roofline.predicted_flip(cfg, spec, dt, context=context)
        verdict = f"compute-bound from B={flip}" if flip else "memory-bound at every batch"
        ax.plot(grid, pred, color=ROOF_COLOR, lw=2,
                label=f"roofline, {spec.name}, context {context:,}: {verdict}")
        ax.plot(grid, pred0, color=ROOF_COLOR, lw=1.2, ls="--", label="roofline, weights only (no KV term)")
        if flip is not None and flip <= top:
            ax.axvline(flip, color=ROOF_COLOR, ls=":", lw=1.2)
            ax.annotate(f"predicted flip B={flip}", xy=(flip, ax.get_ylim()[0]), xytext=(4, 8),
                        textcoords="offset points", fontsize=9, color=ROOF_COLOR, rotation=90)
    if recs and 1 in batches_all and len(set((r.device, r.preset, r.context) for r in recs)) == 1:
        knee = roofline.measured_knee(recs, knee_factor)
        if knee is not None:
            kb, kt = _median_by((int(r.batch), r.decode_tokens_per_s) for r in recs if int(r.batch) == knee)
            ax.axvline(knee, color=DECODE_COLOR, ls="--", lw=1.2, alpha=0.8)
            ax.annotate(f"measured knee B={knee}\n(step >= {knee_factor:g}x batch 1)", xy=(knee, kt[0]),
                        xytext=(-10, 18), textcoords="offset points", ha="right", fontsize=9,
                        color=DECODE_COLOR, arrowprops=dict(arrowstyle="->", color=DECODE_COLOR))
    _style_log(ax, x=False)
    _base2_batches(ax, batches_all or [1, 2, 4, 8, 16, 32, 64, 128, 256])
    _si_ticks(ax, "y")
    ax.set_xlabel("batch size (sequences decoded together)")
    ax.set_ylabel("decode throughput (tokens/s, whole batch)")
    ax.set_title(title or "Batching shares each weight read: tokens/s climbs until the knee")
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    return fig


# ----------------------------------------------------------------------------- TTFT
def ttft_plot(records: Iterable = (), *, cfg=None, spec=None, dtype=None,
              prompt_lengths: Sequence[int] | None = None, title: str | None = None) -> Figure:
    """Time to first token (the prefill) against prompt length, measured and predicted.

    Measured prefill records are grouped by batch size; the roofline line (``cfg`` + ``spec``)
    is for batch 1. Its slope is ~1 while matmuls dominate and steepens at long prompts, where
    attention's ``T^2`` term takes over.
    """
    recs = [r for r in _records(records) if _is_prefill(r)]
    _prediction_args(recs, cfg, spec, "ttft_plot", "prefill")
    fig, (ax,) = _figure()
    by_batch = defaultdict(list)
    for r in recs:
        by_batch[int(r.batch)].append(r)
    shades = np.linspace(1.0, 0.45, max(len(by_batch), 1))
    for shade, (b, rs) in zip(shades, sorted(by_batch.items())):
        T, sec = _median_by((int(r.prompt_len), r.seconds) for r in rs)
        color = tuple(shade * np.array([0x1f, 0x6f, 0xb4]) / 255)
        ax.plot(T, sec * 1e3, "-o", color=color, ms=6, mec="white", label=f"measured, batch {b}")
    if cfg is not None:
        lengths = prompt_lengths or sorted({int(r.prompt_len) for r in recs}) or [64, 8192]
        lo, hi = min(lengths), max(lengths)
        grid = np.unique(np.round(np.logspace(math.log10(lo), math.log10(max(hi, lo + 1)), 120)).astype(int))
        dt = dtype if dtype is not None else cfg.dtype
        pred = [roofline.predicted_prefill_seconds(cfg, spec, 1, int(t), dt) for t in grid]
        ax.plot(grid, np.array(pred) * 1e3, color=ROOF_COLOR, lw=2, label=f"roofline, {spec.name}, batch 1")
    _style_log(ax)
    _length_ticks(ax, sorted({int(r.prompt_len) for r in recs}) or list(prompt_lengths or []))
    _si_ticks(ax, "y")
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("time to first token (ms)")
    ax.set_title(title or "Time to first token grows with the prompt")
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    return fig


# ----------------------------------------------------------------------------- classroom
def classroom_plot(records: Iterable, *, title: str | None = None) -> Figure:
    """Several machines' records overlaid, one colour and marker per ``device``.

    Left: prefill tokens/s against prompt length. Right: decode tokens/s against batch size.
    The gap between the panels is each machine's prefill/decode asymmetry.
    """
    recs = _records(records)
    if not recs:
        raise ValueError("classroom_plot needs records: measure.load_records(folder) of the class's probe files")
    devices = sorted({str(getattr(r, "device", "?")) for r in recs})
    fig, (left, right) = _figure(2, width=11.0, height=4.6)
    cmap = _palette(len(devices))
    for i, dev in enumerate(devices):
        color, marker = cmap[i], DEVICE_MARKERS[i % len(DEVICE_MARKERS)]
        mine = [r for r in recs if str(getattr(r, "device", "?")) == dev]
        pre = [r for r in mine if _is_prefill(r)]
        dec = [r for r in mine if _is_decode(r)]
        if pre:
            T, tps = _median_by((int(r.prompt_len), r.prefill_tokens_per_s) for r in pre)
            left.plot(T, tps, "-", color=color, marker=marker, ms=7, mec="white", label=dev)
        if dec:
            b, tps = _median_by((int(r.batch), r.decode_tokens_per_s) for r in dec)
            right.plot(b, tps, "-", color=color, marker=marker, ms=7, mec="white", label=dev)
    for ax in (left, right):
        _style_log(ax)
        _si_ticks(ax, "y")
    _length_ticks(left, [int(r.prompt_len) for r in recs if _is_prefill(r)])
    _base2_batches(right, [int(r.batch) for r in recs if _is_decode(r)] or [1])
    left.set_xlabel("prompt length (tokens)")
    left.set_ylabel("prefill throughput (tokens/s)")
    left.set_title("Prefill (reading)")
    right.set_xlabel("batch size (sequences)")
    right.set_ylabel("decode throughput (tokens/s, whole batch)")
    right.set_title("Decode (writing)")
    handles, labels = left.get_legend_handles_labels()
    if not handles:
        handles, labels = right.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False, title="device")
    fig.suptitle(title or f"The class's machines ({len(devices)} devices)")
    return fig


def _palette(n):
    base = ["#1f6fb4", "#e07b00", "#2a9d4b", "#c62d42", "#7b4fb0", "#8c564b", "#d6569f",
            "#5f5f5f", "#9fa81c", "#17a9b8"]
    return [base[i % len(base)] for i in range(n)]


# ----------------------------------------------------------------------------- economics
def price_ratio_plot(cfg, spec, *, batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
                     contexts: Sequence[int] = (512, 2048, 8192), dtype=None,
                     band: tuple[float, float] = (3, 5), title: str | None = None) -> Figure:
    """Predicted output/input price ratio against decode batch, one line per context length,
    with the 3-5x band providers charge shaded."""
    from inference_lab import economics

    fig, (ax,) = _figure()
    ax.axhspan(*band, color="#fde8c8", zorder=0, label=f"what providers charge ({band[0]:g}-{band[1]:g}x)")
    shades = np.linspace(0.45, 1.0, len(contexts))
    for shade, ctx in zip(shades, contexts):
        ratios = economics.price_ratio_vs_batch(cfg, spec, batches, context=ctx, dtype=dtype)
        color = tuple(shade * np.array([0xe0, 0x7b, 0x00]) / 255)
        ax.plot(batches, ratios, "-o", color=color, ms=5, mec="white", label=f"context {ctx:,} tokens")
    _style_log(ax, x=False)
    _base2_batches(ax, batches)
    _si_ticks(ax, "y")
    ax.set_xlabel("decode batch size (sequences sharing each step)")
    ax.set_ylabel("output / input price (x, per token)")
    ax.set_title(title or f"Why output costs more: {cfg.name} on {spec.name} (roofline)")
    ax.legend(fontsize=8, frameon=False)
    return fig


def serving_plot(rows: Sequence[dict], *, x: str = "rate", title: str | None = None) -> Figure:
    """TTFT and per-user tokens/s for each serving mode against load: rows of
    :func:`economics.load_sweep` (``x="rate"``, arrival rate) or any rows carrying ``x``
    (e.g. ``"prompt_len"``), each with ``mode``, ``ttft_p50_ms``, ``ttft_p99_ms``, ``tpot_p50_ms``."""
    if not rows:
        raise ValueError("serving_plot needs rows from economics.load_sweep(...)")
    if any(x not in r for r in rows):
        raise ValueError(f"serving_plot(x={x!r}): every row needs a {x!r} entry")
    xlabel = {"rate": "arrival rate (requests/s)", "prompt_len": "mean prompt length (tokens)"}.get(x, x)
    fig, (left, right) = _figure(2, width=11.0, height=4.4)
    colors = {"colocated": "#c62d42", "disaggregated": "#2a9d4b"}
    for mode in sorted({r["mode"] for r in rows}):
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r[x])
        xs = [r[x] for r in mine]
        c = colors.get(mode, ROOF_COLOR)
        left.plot(xs, [r["ttft_p50_ms"] for r in mine], "-o", color=c, label=f"{mode}, p50")
        left.plot(xs, [r["ttft_p99_ms"] for r in mine], "--", color=c, alpha=0.7, label=f"{mode}, p99")
        right.plot(xs, [1e3 / r["tpot_p50_ms"] for r in mine], "-o", color=c, label=mode)
    _style_log(left, x=False)
    _si_ticks(left, "y")
    right.grid(True, **GRID)
    right.set_ylim(bottom=0)
    left.set_xlabel(xlabel)
    left.set_ylabel("time to first token (ms)")
    left.set_title("Time to first token")
    right.set_xlabel(xlabel)
    right.set_ylabel("per-user decode speed (tokens/s, p50)")
    right.set_title("Tokens per second each user sees")
    left.legend(fontsize=8, frameon=False)
    right.legend(fontsize=8, frameon=False)
    fig.suptitle(title or "Under load: disaggregation lets TTFT and tokens/s move independently")
    return fig


# ----------------------------------------------------------------------------- lesson figures
def time_split_bars(compute_s: float, memory_s: float, *, title: str | None = None) -> Figure:
    """Two horizontal bars: the predicted compute time and memory time of one step.
    The longer one is the step time (the roofline's max)."""
    for name, v in (("compute_s", compute_s), ("memory_s", memory_s)):
        if not v > 0:
            raise ValueError(f"{name}={v!r} must be a positive number of seconds")
    fig, (ax,) = _figure(width=7.5, height=2.6)
    scale, unit = (1e-3, "ms") if max(compute_s, memory_s) >= 1e-3 else (1e-6, "\u00b5s")
    bars = [("compute: FLOPs / peak FLOP/s (the stoves)", compute_s, PREFILL_COLOR),
            ("memory: bytes / bandwidth (the van)", memory_s, DECODE_COLOR)]
    longest = max(compute_s, memory_s)
    for i, (label, value, color) in enumerate(bars):
        ax.barh(i, value / scale, color=color, alpha=1.0 if value == longest else 0.45, height=0.6)
        ax.text(value / scale, i, f"  {value / scale:,.3g} {unit}", va="center", fontsize=9)
    ax.set_yticks([0, 1], [b[0] for b in bars], fontsize=9)
    ax.set_xlim(0, longest / scale * 1.35)
    ax.set_xlabel(f"predicted time per decode step ({unit})")
    ax.grid(True, axis="x", **GRID)
    ax.set_title(title or "Which ceiling sets the step time?", fontsize=10)
    return fig


def request_timeline(ttft_s: float, decode_s: float, prompt_len: int, new_tokens: int) -> Figure:
    """One request as a timeline: prefill (time to first token), then the decode steps."""
    fig, (ax,) = _figure(width=8.5, height=2.4)
    scale, unit = (1.0, "s") if ttft_s + decode_s >= 2 else (1e-3, "ms")
    ax.barh(0, ttft_s / scale, color=PREFILL_COLOR, height=0.5)
    ax.barh(0, decode_s / scale, left=ttft_s / scale, color=DECODE_COLOR, height=0.5)
    step = decode_s / max(new_tokens, 1) / scale
    for i in range(1, new_tokens):  # one tick per decode step: the tokens come one by one
        ax.plot([(ttft_s / scale) + i * step] * 2, [-0.25, 0.25], color="white", lw=0.6)
    ax.text(ttft_s / scale / 2, 0.42, f"prefill: {prompt_len} tokens read\n{ttft_s / scale:,.3g} {unit}",
            ha="center", va="bottom", fontsize=9, color=PREFILL_COLOR)
    ax.text((ttft_s + decode_s / 2) / scale, 0.42, f"decode: {new_tokens} tokens written\n{decode_s / scale:,.3g} {unit}",
            ha="center", va="bottom", fontsize=9, color=DECODE_COLOR)
    ax.set_ylim(-0.5, 1.3)
    ax.set_yticks([])
    ax.spines["left"].set_visible(False)
    ax.set_xlabel(f"time since the request arrived ({unit})")
    ax.set_title(f"Reading {prompt_len} tokens vs writing {new_tokens}: "
                 f"{prompt_len / ttft_s:,.0f} vs {new_tokens / decode_s:,.0f} tokens/s", fontsize=10)
    return fig


def two_speeds_bars(result, *, reference: dict | None = None) -> Figure:
    """Prefill vs decode tokens/s here (``result``: a lessons.TwoSpeeds or anything with
    ``prefill_tokens_per_s``/``decode_tokens_per_s``), beside a reference node's."""
    groups = [("this machine", result.prefill_tokens_per_s, result.decode_tokens_per_s)]
    if reference:
        groups.append((reference["name"], reference["prefill_tokens_per_s"], reference["decode_tokens_per_s"]))
    fig, (ax,) = _figure(width=7.5, height=4.0)
    for i, (name, pre, dec) in enumerate(groups):
        ax.bar(i - 0.18, pre, width=0.34, color=PREFILL_COLOR, label="prefill (reading)" if i == 0 else None)
        ax.bar(i + 0.18, dec, width=0.34, color=DECODE_COLOR, label="decode (writing)" if i == 0 else None)
        ax.text(i - 0.18, pre, f"{pre:,.0f}", ha="center", va="bottom", fontsize=9)
        ax.text(i + 0.18, dec, f"{dec:,.0f}", ha="center", va="bottom", fontsize=9)
        ax.annotate(f"{pre / dec:.0f}x", xy=(i, math.sqrt(pre * dec)), ha="center", fontsize=12, weight="bold")
    ax.set_yscale("log")
    ax.grid(True, axis="y", **GRID)
    _si_ticks(ax, "y")
    ax.set_xticks(range(len(groups)), [g[0] for g in groups])
    ax.set_ylabel("tokens/s (batch 1)")
    ax.set_title("Same model, same chip: reading vs writing")
    ax.legend(fontsize=8, frameon=False)
    return fig


def ridge_comparison(specs: Sequence, dtypes: Sequence[str]) -> Figure:
    """Ridge points (peak FLOP/s / bandwidth) of several chips, on a log axis."""
    if len(specs) != len(dtypes):
        raise ValueError("ridge_comparison needs one dtype per spec")
    ridges = [s.ridge_point(d) for s, d in zip(specs, dtypes)]
    fig, (ax,) = _figure(width=7.5, height=0.7 + 0.6 * len(specs))
    colors = _palette(len(specs))
    for i, (spec, dt, r) in enumerate(zip(specs, dtypes, ridges)):
        ax.barh(i, r, color=colors[i], height=0.6)
        ax.text(r, i, f"  {r:,.0f} FLOP/byte ({dt})", va="center", fontsize=9)
    ax.set_xscale("log")
    ax.set_yticks(range(len(specs)), [s.name for s in specs])
    ax.invert_yaxis()
    ax.set_xlim(min(ridges) / 2, max(ridges) * 8)
    ax.grid(True, axis="x", **GRID)
    ax.set_xlabel("ridge point (FLOP per byte; below it: memory-bound)")
    ax.set_title("How much math a chip does per byte it fetches")
    return fig


def prefill_flops_vs_length(records: Iterable, spec, dtype, *, highlight: int | None = None) -> Figure:
    """Achieved FLOP/s of prefill against prompt length, under the measured matmul ceiling,
    with the roofline's prediction (min(peak, intensity x bandwidth))."""
    recs = sorted((r for r in _records(records) if _is_prefill(r)), key=lambda r: r.prompt_len)
    if not recs:
        raise ValueError("prefill_flops_vs_length needs prefill records")
    peak = _check_spec(spec, dtype)
    scale, unit = _flops_unit(peak)
    T = np.array([r.prompt_len for r in recs], float)
    achieved = np.array([r.flops / r.seconds for r in recs])
    predicted = np.array([min(peak, r.flops / r.bytes * spec.bandwidth) for r in recs])
    fig, (ax,) = _figure()
    ax.axhline(peak / scale, color=ROOF_COLOR, lw=2, label=f"measured matmul peak ({peak / scale:,.3g} {unit})")
    ax.plot(T, predicted / scale, "--", color=ROOF_COLOR, lw=1.2, label="roofline prediction")
    ax.plot(T, achieved / scale, "-o", color=PREFILL_COLOR, ms=7, mec="white", label=f"measured ({recs[0].device})")
    if highlight is not None:
        sel = [i for i, r in enumerate(recs) if r.prompt_len == highlight]
        if sel:
            ax.scatter(T[sel], achieved[sel] / scale, s=220, facecolors="none", edgecolors="black", lw=2, zorder=6)
    _style_log(ax)
    _length_ticks(ax, T.astype(int).tolist())
    _si_ticks(ax, "y")
    ax.set_xlabel("prompt length (tokens, batch 1)")
    ax.set_ylabel(f"achieved ({unit})")
    ax.set_title("Prefill climbs toward the compute ceiling as the prompt grows")
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    return fig


def decode_bytes_bars(records: Iterable, cfg, *, highlight: int | None = None) -> Figure:
    """Per context: the bytes one decode step moves (weights vs KV cache) and its measured time."""
    recs = sorted((r for r in _records(records) if _is_decode(r)), key=lambda r: r.context)
    if not recs:
        raise ValueError("decode_bytes_bars needs decode records")
    fig, (left, right) = _figure(2, width=11.0, height=4.0)
    x = np.arange(len(recs))
    costs = [roofline.decode_cost(cfg, r.batch, r.context) for r in recs]
    weights = np.array([c.parts.get("weights", 0) + c.parts.get("embedding_rows", 0) for c in costs]) / 1e6
    kv = np.array([c.parts.get("kv_read", 0) + c.parts.get("kv_write", 0) for c in costs]) / 1e6
    left.bar(x, weights, color="#8c8c8c", label="weights")
    left.bar(x, kv, bottom=weights, color=DECODE_COLOR, label="KV cache")
    right.bar(x, [r.step_seconds * 1e3 for r in recs], color=DECODE_COLOR)
    for ax in (left, right):
        ax.set_xticks(x, [f"{r.context:,}" for r in recs])
        ax.set_xlabel("context (tokens already in the cache)")
        ax.grid(True, axis="y", **GRID)
        if highlight is not None:
            for i, r in enumerate(recs):
                if r.context == highlight:
                    ax.get_xticklabels()[i].set_fontweight("bold")
                    ax.axvspan(i - 0.45, i + 0.45, color="#fff2cc", zorder=0)
    left.set_ylabel("bytes moved per step (MB)")
    left.set_title("What one decode step must move")
    left.legend(fontsize=8, frameon=False)
    right.set_ylabel("measured step time (ms)")
    right.set_title("How long it takes (batch 1)")
    return fig


def decode_time_vs_bytes(records: Iterable, spec, dtype=None, *, label=None) -> Figure:
    """Measured decode step time against the bytes the step moves, beside the two roofline
    times: bytes / bandwidth (memory) and, with ``dtype``, FLOPs / peak (compute). Decode
    points sit near the memory line and far above the compute one: bandwidth-bound.
    ``label(record) -> str`` names each point (default: its context)."""
    label = label or (lambda r: f"context {r.context:,}")
    recs = sorted((r for r in _records(records) if _is_decode(r)), key=lambda r: r.bytes_per_step)
    if not recs:
        raise ValueError("decode_time_vs_bytes needs decode records")
    roofline._check_spec(spec)
    b = np.array([r.bytes_per_step for r in recs])
    t = np.array([r.step_seconds for r in recs])
    fig, (ax,) = _figure()
    grid = np.linspace(0, b.max() * 1.15, 50)
    ax.plot(grid / 1e6, grid / spec.bandwidth * 1e3, color=DECODE_COLOR, lw=2,
            label=f"memory time: bytes / measured bandwidth ({spec.bandwidth / 1e9:,.3g} GB/s)")
    if dtype is not None:
        peak = _check_spec(spec, dtype)
        ax.plot(b / 1e6, np.array([r.flops_per_step for r in recs]) / peak * 1e3, "s--", color=PREFILL_COLOR,
                lw=1.2, ms=6, label=f"compute time: FLOPs / measured matmul peak ({peak / 1e9:,.3g} GFLOP/s)")
    ax.plot(b / 1e6, t * 1e3, "o", color="black", ms=8, mec="white", label="measured decode steps")
    for i, r in enumerate(recs):  # labels fanned out vertically: the points sit close together
        ax.annotate(f"{label(r)}: MBU {100 * (r.mbu or 0):.0f}%",
                    (r.bytes_per_step / 1e6, r.step_seconds * 1e3), xytext=(-150, 14 - 14 * i),
                    textcoords="offset points", fontsize=8, color="black",
                    arrowprops=dict(arrowstyle="-", color="#999999", lw=0.6))
    ax.set_xlim(0, b.max() / 1e6 * 1.25)
    ax.set_ylim(0, max(t.max(), b.max() / spec.bandwidth) * 1e3 * 1.2)
    ax.grid(True, **GRID)
    ax.set_xlabel("bytes one decode step moves (MB: weights + KV cache)")
    ax.set_ylabel("step time (ms)")
    ax.set_title("Decode step time follows the bytes, not the FLOPs")
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    return fig


def kitchen(cfg, spec, *, dtype=None, batch: int = 1, context: int = 512) -> Figure:
    """The pantry (memory), the van (bandwidth) and the stoves (compute), drawn with this
    model's bytes and this machine's ceilings."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    dtype = dtype or cfg.dtype
    cost = roofline.decode_cost(cfg, batch, context)
    compute_s, memory_s = roofline.predict_terms(cost, spec, dtype)
    fig = Figure(figsize=(10, 3.8), dpi=110)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 4)
    ax.axis("off")

    def box(x, y, w, h, color, title, lines):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.08", fc=color, ec="#333333", lw=1.2))
        ax.text(x + w / 2, y + h - 0.3, title, ha="center", va="top", fontsize=12, weight="bold")
        ax.text(x + w / 2, y + h - 0.75, lines, ha="center", va="top", fontsize=9, linespacing=1.5)

    weights = cost.parts.get("weights", 0) + cost.parts.get("embedding_rows", 0)
    kvb = cost.parts.get("kv_read", 0)
    box(0.2, 0.6, 2.9, 2.9, "#f3e3c3", "PANTRY = memory",
        f"HBM on a GPU, DRAM on a CPU\n{spec.memory_bytes / 1e9:,.0f} GB here\n\nweights {weights / 1e6:,.0f} MB\n"
        f"KV cache {kvb / 1e6:,.1f} MB" if spec.memory_bytes else
        f"HBM on a GPU, DRAM on a CPU\n\nweights {weights / 1e6:,.0f} MB\nKV cache {kvb / 1e6:,.1f} MB")
    box(6.9, 0.6, 2.9, 2.9, "#d6e6f5", "STOVES = compute",
        f"tensor cores / vector units\n{spec.peak_flops(dtype) / 1e9:,.0f} GFLOP/s ({dtype})\n\n"
        f"one decode step's cooking:\n{cost.flops / 1e6:,.0f} MFLOP = {compute_s * 1e3:,.3g} ms")
    ax.add_patch(FancyArrowPatch((3.3, 2.05), (6.7, 2.05), arrowstyle="-|>", mutation_scale=30, lw=3,
                                 color=DECODE_COLOR))
    ax.text(5.0, 2.45, "ROAD + VAN = bandwidth", ha="center", fontsize=12, weight="bold", color=DECODE_COLOR)
    ax.text(5.0, 1.7, f"{spec.bandwidth / 1e9:,.1f} GB/s\nhauling {cost.bytes / 1e6:,.0f} MB per step\n"
            f"= {memory_s * 1e3:,.3g} ms per token", ha="center", va="top", fontsize=9)
    verdict = (f"Decode, batch {batch}: the van takes {memory_s / compute_s:,.0f}x longer than the cooking."
               if memory_s > compute_s else f"Decode, batch {batch}: the stoves are the bottleneck.")
    ax.text(5.0, 0.25, verdict, ha="center", fontsize=10, style="italic")
    return fig


def intensity_vs_context(cfg, *, batches: Sequence[int] = (1, 64),
                         contexts: Sequence[int] = (256, 1024, 4096, 16384, 65536)) -> Figure:
    """Decode arithmetic intensity against context, with and without the KV-cache term."""
    fig, (ax,) = _figure()
    shades = np.linspace(0.5, 1.0, len(batches))
    for shade, b in zip(shades, batches):
        color = tuple(shade * np.array([0xe0, 0x7b, 0x00]) / 255)
        full = [roofline.decode_cost(cfg, b, c).intensity for c in contexts]
        bare = roofline.forward_cost_no_attention(cfg, b).intensity
        ax.plot(contexts, full, "-o", color=color, ms=6, mec="white", label=f"batch {b}: weights + KV + attention")
        ax.axhline(bare, color=color, ls="--", lw=1.2, label=f"batch {b}: weights only (\u2248 {bare:.0f})")
    _style_log(ax)
    _length_ticks(ax, list(contexts))
    _plain_ticks(ax, "y")
    ax.set_xlabel("context (tokens in the KV cache)")
    ax.set_ylabel("decode intensity (FLOP/byte)")
    ax.set_title(f"{cfg.name}: long context drags decode intensity down")
    ax.legend(fontsize=8, frameon=False)
    return fig


def latency_distributions(results: dict) -> Figure:
    """Distributions (CDFs) of TTFT and TPOT for named simulation results (economics.SimResult)."""
    if not results:
        raise ValueError("latency_distributions needs {name: SimResult}")
    fig, (left, right) = _figure(2, width=11.0, height=4.0)
    colors = {"colocated": "#c62d42", "disaggregated": "#2a9d4b"}
    for i, (name, res) in enumerate(results.items()):
        c = next((v for k, v in colors.items() if name.startswith(k)), _palette(len(results))[i])
        for ax, values in ((left, res.ttft), (right, res.tpot)):
            v = np.sort(np.asarray(values)[np.isfinite(values)]) * 1e3
            ax.plot(v, np.linspace(0, 1, len(v)), color=c, lw=2, label=name)
    for ax, what in ((left, "time to first token (ms)"), (right, "time per output token (ms)")):
        ax.set_xscale("log")
        _si_ticks(ax, "x")  # 20, 50, 100 rather than 2x10^1
        ax.grid(True, **GRID)
        ax.set_xlabel(what)
        ax.set_ylabel("fraction of requests")
        ax.legend(fontsize=8, frameon=False, loc="lower right")
    left.set_title("Waiting for the first token")
    right.set_title("Speed of the rest of the answer")
    return fig
