"""Figures of the discriminating experiments: each puts a measurement between the predictions
of two (or three) explanations, so the figure shows which one the machine follows.

- :func:`flops_or_bytes`: decode step time as the FLOPs grow (batch) and as the bytes grow
  (context), against "time follows the FLOPs" and "time follows the bytes";
- :func:`kernel_vs_model`: the model's decode step and the lone matmul kernel against batch;
- :func:`three_regimes`: measured time against the roofline's time, with the overhead floor;
- :func:`users_vs_total`: per-user and total decode tokens/s against batch;
- :func:`ratio_vs_ridge`: each machine's prefill/decode ratio against the ratio its ceilings allow.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
from matplotlib.figure import Figure

from inference_lab.analytic import roofline
from inference_lab.plots.style import (
    DECODE_COLOR, DEVICE_MARKERS, GRID, OKABE_ITO, PREFILL_COLOR, ROOF_COLOR, annotate_apart, batch_ticks, describe,
    legend_clear_of_data, new_figure, palette, plain_ticks, si_ticks, log_axes, plain_text, amount)

COMPUTE_STYLE = dict(color=PREFILL_COLOR, ls="--", marker="s", ms=5, lw=1.4)
BYTES_STYLE = dict(color=OKABE_ITO["green"], ls=":", marker="^", ms=6, lw=1.8)
MEASURED_STYLE = dict(color="black", ls="-", marker="o", ms=7, lw=1.6, mec="white")


def _ratios(recs, key):
    recs = sorted(recs, key=lambda r: getattr(r, key))
    base = recs[0]
    x = [getattr(r, key) for r in recs]
    return (x, [r.step_seconds / base.step_seconds for r in recs], [r.flops_per_step / base.flops_per_step for r in recs],
            [r.bytes_per_step / base.bytes_per_step for r in recs])


def flops_or_bytes(batch_records: Iterable, context_records: Iterable = (), *, title: str | None = None) -> Figure:
    """Left: batch sweep (FLOPs grow ~B-fold, bytes barely). Right: context sweep at batch 1
    (KV bytes grow, matmul FLOPs fixed). Each panel: measured step time relative to its
    first point, beside what a compute-bound step (time x FLOPs) and a bandwidth-bound step
    (time x bytes) would do."""
    batch_records, context_records = list(batch_records), list(context_records)
    if not batch_records:
        raise ValueError("flops_or_bytes needs decode records of a batch sweep")
    panels = [(batch_records, "batch", "batch size (FLOPs x batch, weight bytes x ~1)")]
    if context_records:
        panels.append((context_records, "context", "context at batch 1 (KV bytes grow, matmul FLOPs fixed)"))
    fig, axes = new_figure(len(panels), width=5.6 * len(panels), height=4.2)
    for ax, (recs, key, xlabel) in zip(axes, panels):
        x, t, f, b = _ratios(recs, key)
        ax.plot(x, f, label="if compute-bound: time x FLOPs", **COMPUTE_STYLE)
        ax.plot(x, b, label="if bandwidth-bound: time x bytes", **BYTES_STYLE)
        ax.plot(x, t, label="measured step time", **MEASURED_STYLE)
        for xi, ti in zip(x, t):
            ax.annotate(f"x{ti:.2f}", (xi, ti), xytext=(4, 6), textcoords="offset points", fontsize=8)
        if key == "batch":
            log_axes(ax, x=True, y=True)
            batch_ticks(ax, x)
            plain_ticks(ax, "y")
        else:  # a short range: linear axes read better
            ax.grid(True, **GRID)
            ax.set_xticks(x)
            ax.set_ylim(0.9, max(t + f + b) * 1.1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"relative to {key} {x[0]} (x)")
        legend_clear_of_data(ax, "upper left", fontsize=8, frameon=False)
    axes[0].set_title("Add FLOPs, keep the bytes", fontsize=10)
    if len(axes) > 1:
        axes[1].set_title("Add bytes, keep the matmul FLOPs", fontsize=10)
    fig.suptitle(plain_text(title) if title else
                 f"Which one does a decode step follow? ({plain_text(batch_records[0].device)}, {batch_records[0].preset})")
    said = []
    for recs, key, _ in panels:
        x, t, f, b = _ratios(recs, key)
        said.append(f"{key} {x[0]} to {x[-1]}: FLOPs x{f[-1]:.3g}, bytes x{b[-1]:.3g}, measured step time x{t[-1]:.3g}")
    return describe(fig, f"{len(panels)} panel(s) of decode step time relative to the first point, beside time "
                          f"following the FLOPs and time following the bytes. " + "; ".join(said) + ".")


def kernel_vs_model(records: Iterable, kernels: Iterable, *, cfg=None, spec=None, dtype=None,
                    knee_factor: float = 1.5, title: str | None = None) -> Figure:
    """Step time relative to batch 1: the model's decode step (per batch), matmul kernels timed
    alone (per row count m; one series per ``KernelPoint.describe()``, e.g. one large matmul and
    the model's own matrices) and, with ``cfg`` and ``spec``, the roofline's prediction."""
    recs = sorted(records, key=lambda r: r.batch)
    series = {}
    for k in sorted(kernels, key=lambda k: k.m):
        series.setdefault(k.describe(), []).append(k)
    if not recs or not series or recs[0].batch != 1 or any(ks[0].m != 1 for ks in series.values()):
        raise ValueError("kernel_vs_model needs decode records and kernel points that start at batch 1 / m = 1")
    fig, (ax,) = new_figure()
    xb = [r.batch for r in recs]
    ax.plot(xb, [r.step_seconds / recs[0].step_seconds for r in recs],
            label=f"model decode step ({recs[0].preset}, context {recs[0].context})", **MEASURED_STYLE)
    styles = [{**COMPUTE_STYLE, "color": DECODE_COLOR}, {**BYTES_STYLE, "color": OKABE_ITO["purple"], "marker": "D"}]
    for (name, ks), style in zip(series.items(), styles * 4):
        ax.plot([p.m for p in ks], [p.seconds / ks[0].seconds for p in ks], label=name, **style)
    ks = [k for group in series.values() for k in group]
    if cfg is not None and spec is not None:
        c = recs[0].context
        grid = sorted(set(xb) | {p.m for p in ks})
        base = roofline.predicted_decode_step_seconds(cfg, spec, 1, c, dtype)
        ax.plot(grid, [roofline.predicted_decode_step_seconds(cfg, spec, g, c, dtype) / base for g in grid],
                color=ROOF_COLOR, lw=2, label=f"roofline on {spec.name}'s ceilings")
    ax.axhline(knee_factor, color="#999999", ls=":", lw=1)
    ax.text(xb[0], knee_factor * 1.03, f"knee: {knee_factor:g}x batch 1", fontsize=8, color="#777777")
    log_axes(ax)
    batch_ticks(ax, xb + [p.m for p in ks])
    top = max(max(line.get_ydata()) for line in ax.get_lines())
    ax.set_yticks([v for v in (1, 1.5, 2, 3, 4, 6, 8, 12, 16, 32, 64) if v <= top * 1.05])
    plain_ticks(ax, "y")
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}")
    ax.set_xlabel("batch size (model) = rows m (kernel)")
    ax.set_ylabel("time relative to batch 1 / m = 1 (x)")
    ax.set_title(plain_text(title) if title else "The model's step against its matmuls alone and the roofline", fontsize=10)
    legend_clear_of_data(ax, "upper left", fontsize=8, frameon=False)
    said = [f"model decode step x{recs[-1].step_seconds / recs[0].step_seconds:.3g} at batch {recs[-1].batch}"]
    said += [f"{name} x{ks[-1].seconds / ks[0].seconds:.3g} at m = {ks[-1].m}" for name, ks in series.items()]
    return describe(fig, "Log-log lines of time relative to batch 1 (m = 1) against batch size: "
                          + "; ".join(said) + f"; a dotted line marks the knee at {knee_factor:g}x.")


REGIME_COLORS = {"overhead": OKABE_ITO["purple"], "memory": DECODE_COLOR, "compute": PREFILL_COLOR}
KIND_MARKERS = {"stream": "^", "matmul": "s", "decode": "o", "prefill": "D"}


def three_regimes(ops: Iterable, spec, dtype="float32", *, title: str | None = None) -> Figure:
    """Measured time of each op against its two-term roofline time ``max(FLOPs/peak,
    bytes/bandwidth)``, on this machine's ceilings. On the diagonal: the roofline holds;
    on the flat floor (``spec.overhead_s``): the fixed cost of a call dominates. Colour and
    fill: the regime the three-term model predicts (overhead hollow, memory solid, compute
    hatched); marker: the kind of op.

    ``ops``: rows with ``kind``, ``label``, ``flops``, ``bytes``, ``seconds``.
    """
    ops = list(ops)
    if not ops:
        raise ValueError("three_regimes needs measured ops")
    peak, bw = spec.peak_flops(dtype), spec.bandwidth
    over = roofline.overhead_seconds(spec)
    fig, (ax,) = new_figure(width=8.0, height=5.0)
    roof = np.array([max(o.flops / peak, o.bytes / bw) for o in ops])
    lo, hi = min(roof.min(), over or roof.min()) / 3, max(roof.max(), max(o.seconds for o in ops)) * 3
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.plot(x, x, color=ROOF_COLOR, lw=1.2, ls="--", label="roofline: max(FLOPs/peak, bytes/bandwidth)")
    if over:
        ax.plot(x, x + over, color=ROOF_COLOR, lw=2.2, label=f"+ overhead {over * 1e6:,.1f} \u00b5s per call")
        ax.axhline(over, color=REGIME_COLORS["overhead"], lw=1, ls=":")
    seen = set()
    for o, r in zip(ops, roof):
        compute, memory = o.flops / peak, o.bytes / bw
        regime = "overhead" if over >= max(compute, memory) else ("compute" if compute >= memory else "memory")
        key = (o.kind, regime)
        # The regime shows in colour and in fill (overhead hollow, memory solid, compute hatched),
        # so a reader who cannot tell the colours apart still can.
        ax.scatter([r], [o.seconds], s=55, marker=KIND_MARKERS.get(o.kind, "o"),
                   facecolors="white" if regime == "overhead" else REGIME_COLORS[regime],
                   edgecolors=REGIME_COLORS[regime] if regime == "overhead" else "black",
                   hatch="////" if regime == "compute" else None, linewidths=1.4 if regime == "overhead" else 0.5,
                   zorder=5,
                   label=f"{o.kind}: {regime}-bound" if key not in seen else None)
        seen.add(key)
        if getattr(o, "label", None):
            ax.annotate(o.label, (r, o.seconds), xytext=(5, -10), textcoords="offset points", fontsize=7)
    log_axes(ax)
    ax.set_xlim(lo, hi)
    floor = min([o.seconds for o in ops] + ([over] if over else []))
    ax.set_ylim(floor / 3, hi)
    ax.set_xlabel("roofline time on this machine's ceilings (s)")
    ax.set_ylabel("measured time per call (s)")
    ax.set_title(plain_text(title) if title else f"Three regimes on {plain_text(spec.name)}: overhead, bandwidth, compute",
                 fontsize=10)
    legend_clear_of_data(ax, "upper left", fontsize=7, frameon=False)
    counts = {}
    for o in ops:
        compute, memory = o.flops / peak, o.bytes / bw
        regime = "overhead" if over >= max(compute, memory) else ("compute" if compute >= memory else "memory")
        counts[regime] = counts.get(regime, 0) + 1
    return describe(fig, f"Log-log scatter of {len(ops)} measured ops, measured time against roofline time on "
                          f"{spec.name}'s ceilings" + (f", with an overhead floor of {over * 1e6:,.1f} µs" if over else "")
                          + ": " + ", ".join(f"{n} {k}-bound" for k, n in counts.items()) + ".")


def users_vs_total(records: Iterable, *, highlight: int | None = None, title: str | None = None) -> Figure:
    """Decode tokens/s against batch: the whole batch's (throughput) and one sequence's
    (what a user sees): the serving trade-off."""
    recs = sorted(records, key=lambda r: r.batch)
    if not recs:
        raise ValueError("users_vs_total needs decode records")
    b = [r.batch for r in recs]
    fig, (ax,) = new_figure()
    ax.plot(b, [r.decode_tokens_per_s for r in recs], label="total: every sequence of the batch",
            color=DECODE_COLOR, marker="o", ls="-", lw=1.8, ms=7, mec="white")
    ax.plot(b, [r.decode_tokens_per_s / r.batch for r in recs], label="per user: 1 / step time",
            color=PREFILL_COLOR, marker="s", ls="--", lw=1.8, ms=6, mec="white")
    if highlight is not None and highlight in b:
        r = recs[b.index(highlight)]
        for y in (r.decode_tokens_per_s, r.decode_tokens_per_s / r.batch):
            ax.scatter([highlight], [y], s=200, facecolors="none", edgecolors="black", lw=1.8, zorder=6)
    log_axes(ax)
    batch_ticks(ax, b)
    si_ticks(ax, "y")
    ax.set_xlabel("batch size (sequences decoded together)")
    ax.set_ylabel("decode throughput (tokens/s)")
    ax.set_title(plain_text(title) if title else "Throughput for the server, speed for each user", fontsize=10)
    legend_clear_of_data(ax, "upper left", fontsize=8, frameon=False)
    first, last = recs[0], recs[-1]
    return describe(fig, f"Log-log lines of decode tokens/s against batch {b[0]} to {b[-1]}: the total goes from "
                          f"{first.decode_tokens_per_s:,.0f} to {last.decode_tokens_per_s:,.0f}, one user's from "
                          f"{first.decode_tokens_per_s / first.batch:,.0f} to {last.decode_tokens_per_s / last.batch:,.0f}.")


def ratio_vs_ridge(points: Sequence[dict], *, title: str | None = None) -> Figure:
    """Each machine's measured prefill/decode ratio (y) against the ratio its own ceilings
    allow (x): ``peak / (2 P)`` prompt tokens/s over ``bandwidth / (P * dtype_bytes)`` decode
    tokens/s, i.e. ``ridge * dtype_bytes / 2``. ``points``: dicts with ``label``, ``ideal``,
    ``measured`` and optionally ``quoted=True`` (a figure quoted, not a probe file)."""
    if not points:
        raise ValueError("ratio_vs_ridge needs at least one machine")
    fig, (ax,) = new_figure(width=7.0, height=4.8)
    xs = [p["ideal"] for p in points] + [p["measured"] for p in points]
    lo, hi = min(xs) / 3, max(xs) * 3
    ax.plot([lo, hi], [lo, hi], color=ROOF_COLOR, lw=1.5, ls="--", label="measured = what the ceilings allow")
    colors = palette(len(points))
    for i, p in enumerate(points):
        marker = "*" if p.get("quoted") else DEVICE_MARKERS[i % len(DEVICE_MARKERS)]
        hollow = (i // len(DEVICE_MARKERS)) % 2 == 1  # past eleven machines the markers repeat, hollow
        ax.scatter([p["ideal"]], [p["measured"]], s=140 if p.get("quoted") else 70, marker=marker,
                   facecolors="white" if hollow else colors[i], edgecolors=colors[i] if hollow else "black",
                   linewidths=1.5 if hollow else 0.6, zorder=5, label=plain_text(p["label"]))
    log_axes(ax)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    plain_ticks(ax, "x")
    plain_ticks(ax, "y")
    ax.grid(True, **GRID)
    ax.set_xlabel("prefill/decode ratio the ceilings allow (ridge x bytes per weight / 2)")
    ax.set_ylabel("measured prefill/decode ratio (batch 1)")
    ax.set_title(plain_text(title) if title else "The gap each machine shows vs the gap its ceilings allow", fontsize=10)
    legend_clear_of_data(ax, "upper left", fontsize=8, frameon=False)
    # two machines of one kind land on one spot: their labels are moved apart, not printed over each other
    annotate_apart(ax, [(p["ideal"], p["measured"], f"{amount(p['measured'])}x of {amount(p['ideal'])}x") for p in points])
    return describe(fig, "Log-log scatter of measured prefill/decode ratio against the ratio the ceilings allow, "
                          "with the diagonal where they are equal: " + "; ".join(
                              f"{p['label']} {p['measured']:,.3g}x of {p['ideal']:,.3g}x" for p in points) + ".")
