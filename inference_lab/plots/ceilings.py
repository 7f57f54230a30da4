"""Figures of the analytic model: the roofline, ridge points, intensity, the kitchen."""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
from matplotlib.figure import Figure

from inference_lab.analytic import costs, roofline
from inference_lab.plots.style import (
    PREFILL_COLOR, DECODE_COLOR, ROOF_COLOR, GRID, HATCH, MARKERS, LINESTYLES, OKABE_ITO, LabFigure,
    annotate_apart, describe, legend_clear_of_data, new_figure, log_axes, plain_ticks, length_ticks, si_label,
    si_ticks, flops_unit, is_decode, as_records, peak_of, palette, tint, plain_text)


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
    peak = peak_of(spec, dtype)
    records = as_records(records)
    bw = spec.bandwidth
    ridge = peak / bw
    scale, unit = flops_unit(peak)
    fig, (ax,) = new_figure(width=9.0)

    # points: (intensity, achieved FLOP/s or None, phase, label)
    points = []
    for r in records:
        if is_decode(r):
            f, b, t = r.flops_per_step, r.bytes_per_step, r.step_seconds
            points.append((f / b, f / t, "decode", f"B={r.batch}"))
        else:
            f, b, t = r.flops, r.bytes, r.seconds
            points.append((f / b, f / t, "prefill", f"T={r.prompt_len}"))
    if cfg is not None and not records:
        for T in prefill_lengths:
            c = costs.prefill_cost(cfg, 1, T)
            points.append((c.intensity, None, "prefill", f"T={T}"))
        for B in decode_batches:
            c = costs.decode_cost(cfg, B, context)
            points.append((c.intensity, None, "decode", f"B={B}"))

    xs = [p[0] for p in points] + [ridge]
    lo = 10 ** math.floor(math.log10(max(min(xs) / 3, 1e-3)))
    hi = 10 ** math.ceil(math.log10(max(xs) * 3))
    x = np.logspace(math.log10(lo), math.log10(hi), 400)
    roof = np.minimum(peak, x * bw)
    ax.plot(x, roof / scale, color=ROOF_COLOR, lw=2.4, zorder=2,
            label=plain_text(f"roofline: {spec.name}, {dtype}") + f"\n{si_label(peak)}FLOP/s, {si_label(bw)}B/s")
    ax.fill_between(x, roof / scale, (lo * bw) / scale / 10, color="#f2f2f2", zorder=0)
    ax.axvline(ridge, color=ROOF_COLOR, ls=":", lw=1.2)
    ax.text(lo * 1.3, peak / scale * 1.12, f"peak {peak / scale:,.0f} {unit}", fontsize=9, color=ROOF_COLOR)

    seen, labels = set(), []
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
        labels.append((inten, on_roof if achieved is None else achieved / scale, label, {"color": color}))

    log_axes(ax)
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
    si_ticks(ax, "x")
    plain_ticks(ax, "y")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel(f"attainable performance ({unit})")
    ax.set_title(title or plain_text(f"Roofline of {spec.name}: where prefill and decode sit"))
    fig.legend(*ax.get_legend_handles_labels(), loc="outside right upper", fontsize=8, frameon=False)
    annotate_apart(ax, labels)   # B=1 of two contexts, or T=128 beside T=512, sit close together
    where = []
    for phase, shape in (("prefill", "circles"), ("decode", "triangles")):
        mine = [p for p in points if p[2] == phase]
        if mine:
            kind = "measured" if any(p[1] is not None for p in mine) else "predicted"
            lo_i, hi_i = min(p[0] for p in mine), max(p[0] for p in mine)
            where.append(f"{len(mine)} {kind} {phase} points ({shape}) at {lo_i:,.3g} to {hi_i:,.3g} FLOP/byte")
    return describe(fig, f"Log-log roofline of {spec.name} ({dtype}): attainable {unit} against arithmetic "
                          f"intensity, rising to a peak of {peak / scale:,.3g} {unit} at the ridge, "
                          f"{ridge:,.0f} FLOP/byte; " + ("; ".join(where) or "no points") + ".")


def ridge_comparison(specs: Sequence, dtypes: Sequence[str]) -> Figure:
    """Ridge points (peak FLOP/s / bandwidth) of several chips, on a log axis."""
    if len(specs) != len(dtypes):
        raise ValueError("ridge_comparison needs one dtype per spec")
    ridges = [s.ridge_point(d) for s, d in zip(specs, dtypes)]
    fig, (ax,) = new_figure(width=7.5, height=0.7 + 0.6 * len(specs))
    colors = palette(len(specs))
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
    return describe(fig, "Ridge points, log scale (FLOP per byte; below it a kernel is memory-bound): "
                          + ", ".join(f"{s.name} {r:,.0f} ({d})" for s, d, r in zip(specs, dtypes, ridges)) + ".")


def intensity_vs_context(cfg, *, batches: Sequence[int] = (1, 64),
                         contexts: Sequence[int] = (256, 1024, 4096, 16384, 65536)) -> Figure:
    """Decode arithmetic intensity against context, with and without the KV-cache term."""
    fig, (ax,) = new_figure()
    colors = palette(len(batches))
    lines = []
    for i, (color, b) in enumerate(zip(colors, batches)):
        full = [costs.decode_cost(cfg, b, c).intensity for c in contexts]
        bare = costs.forward_cost_no_attention(cfg, b).intensity
        lines.append((b, full[0], full[-1], bare))
        ax.plot(contexts, full, "-", marker=MARKERS[i % len(MARKERS)], color=color, ms=6, mec="white",
                label=f"batch {b}: weights + KV + attention")
        ax.axhline(bare, color=color, ls=LINESTYLES[i % len(LINESTYLES)], lw=1.2,
                   label=f"batch {b}: weights only (\u2248 {bare:.0f})")
    attn = 2 * cfg.n_heads / (cfg.n_kv_heads * cfg.dtype_bytes)  # attention FLOPs per KV byte read
    # A marked line, not a dash pattern: matplotlib reports every custom dash as "--", and the
    # weights-only lines already use the plain dash styles.
    ax.plot(contexts, [attn] * len(contexts), "-", marker="x", color=ROOF_COLOR, lw=1.2, ms=6,
            label=f"attention alone: 2\u00b7Hq/(Hkv\u00b7bytes) = {attn:.3g} FLOP/byte")
    log_axes(ax)
    length_ticks(ax, list(contexts))
    plain_ticks(ax, "y")
    ax.set_xlabel("context (tokens in the KV cache)")
    ax.set_ylabel("decode intensity (FLOP/byte)")
    ax.set_title(f"{cfg.name}: long context pulls decode intensity toward attention's own")
    legend_clear_of_data(ax, fontsize=8, frameon=False)
    return describe(fig, f"Decode arithmetic intensity of {cfg.name} against context, {contexts[0]:,} to "
                          f"{contexts[-1]:,} tokens, log-log: " + "; ".join(
                              f"batch {b} goes from {a:,.3g} to {z:,.3g} FLOP/byte (weights only: {w:,.3g})"
                              for b, a, z, w in lines) + f"; attention alone: {attn:.3g} FLOP/byte.")


def time_split_bars(compute_s: float, memory_s: float, *, overhead_s: float | None = None,
                    title: str | None = None) -> Figure:
    """Horizontal bars: the predicted compute time and memory time of one step, and (given)
    the fixed overhead of a call. The longest one sets the step's regime."""
    for name, v in (("compute_s", compute_s), ("memory_s", memory_s)):
        if not v > 0:
            raise ValueError(f"{name}={v!r} must be a positive number of seconds")
    fig, (ax,) = new_figure(width=7.5, height=2.6 if overhead_s is None else 3.1)
    bars = [("compute: FLOPs / peak FLOP/s (the stoves)", compute_s, PREFILL_COLOR),
            ("memory: bytes / bandwidth (the van)", memory_s, DECODE_COLOR)]
    if overhead_s is not None:
        bars.append(("overhead: fixed cost of a call (the order slip)", overhead_s, "#CC79A7"))
    longest = max(b[1] for b in bars)
    scale, unit = (1e-3, "ms") if longest >= 1e-3 else (1e-6, "\u00b5s")
    for i, (label, value, color) in enumerate(bars):
        ax.barh(i, value / scale, color=color, alpha=1.0 if value == longest else 0.45, height=0.6,
                hatch=(HATCH if i == 1 else "..") if i else None, edgecolor="white")
        ax.text(value / scale, i, f"  {value / scale:,.3g} {unit}", va="center", fontsize=9)
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=9)
    ax.set_xlim(0, longest / scale * 1.35)
    ax.set_xlabel(f"predicted time per decode step ({unit})")
    ax.grid(True, axis="x", **GRID)
    ax.set_title(title or "Which ceiling sets the step time?", fontsize=10)
    longest_name = max(bars, key=lambda b: b[1])[0].split(":")[0]
    extra = f", overhead {overhead_s / scale:,.3g} {unit}" if overhead_s is not None else ""
    return describe(fig, f"{len(bars)} bars, the predicted time of one decode step: compute {compute_s / scale:,.3g} "
                          f"{unit}, memory {memory_s / scale:,.3g} {unit}{extra}; the {longest_name} time is the "
                          "longest and sets the step time.")


def kitchen(cfg, spec, *, dtype=None, batch: int = 1, context: int = 512) -> Figure:
    """The pantry (memory), the van (bandwidth) and the stoves (compute), drawn with this
    model's bytes and this machine's ceilings."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    dtype = dtype or cfg.dtype
    cost = costs.decode_cost(cfg, batch, context)
    compute_s, memory_s = roofline.predict_terms(cost, spec, dtype)
    fig = LabFigure(figsize=(10, 3.8), dpi=110)
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
    box(0.2, 0.6, 2.9, 2.9, tint(OKABE_ITO["orange"]), "PANTRY = memory",
        f"HBM on a GPU, DRAM on a CPU\n{spec.memory_bytes / 1e9:,.0f} GB here\n\nweights {weights / 1e6:,.0f} MB\n"
        f"KV cache {kvb / 1e6:,.1f} MB" if spec.memory_bytes else
        f"HBM on a GPU, DRAM on a CPU\n\nweights {weights / 1e6:,.0f} MB\nKV cache {kvb / 1e6:,.1f} MB")
    box(6.9, 0.6, 2.9, 2.9, tint(PREFILL_COLOR), "STOVES = compute",
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
    return describe(fig, f"Diagram of decode at batch {batch} as a kitchen: the pantry (memory) holds "
                          f"{weights / 1e6:,.0f} MB of weights and {kvb / 1e6:,.1f} MB of KV cache; the van "
                          f"(bandwidth, {spec.bandwidth / 1e9:,.1f} GB/s) hauls {cost.bytes / 1e6:,.0f} MB per "
                          f"step, {memory_s * 1e3:,.3g} ms; the stoves (compute, "
                          f"{spec.peak_flops(dtype) / 1e9:,.0f} GFLOP/s) cook for {compute_s * 1e3:,.3g} ms. "
                          + verdict)
