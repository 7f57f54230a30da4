"""Figures of measured prefill and decode: one request's timeline, TTFT against prompt length,
FLOP/s against prompt length, decode bytes and step time, decode throughput against batch."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable, Sequence

import numpy as np
from matplotlib.figure import Figure

from inference_lab.analytic import costs, roofline
from inference_lab.base import checks
from inference_lab.plots.style import (
    PREFILL_COLOR, DECODE_COLOR, ROOF_COLOR, GRID, HATCH, MARKERS, OKABE_ITO, describe, legend_clear_of_data,
    new_figure, log_axes, length_ticks, batch_ticks, si_ticks, flops_unit, is_decode, is_prefill,
    median_by, as_records, prediction_args, peak_of, shades, tint, plain_text, amount)


def request_timeline(ttft_s: float, decode_s: float, prompt_len: int, new_tokens: int) -> Figure:
    """One request as a timeline: prefill (time to first token), then the decode steps."""
    fig, (ax,) = new_figure(width=8.5, height=2.4)
    scale, unit = (1.0, "s") if ttft_s + decode_s >= 2 else (1e-3, "ms")
    ax.barh(0, ttft_s / scale, color=PREFILL_COLOR, height=0.5)
    ax.barh(0, decode_s / scale, left=ttft_s / scale, color=DECODE_COLOR, height=0.5, hatch=HATCH,
            edgecolor="white")
    step = decode_s / max(new_tokens, 1) / scale
    for i in range(1, new_tokens):  # one tick per decode step: the tokens come one by one
        ax.plot([(ttft_s / scale) + i * step] * 2, [-0.25, 0.25], color="white", lw=0.6)
    ax.text(ttft_s / scale / 2, 0.42, f"prefill: {prompt_len} tokens read\n{amount(ttft_s / scale)} {unit}",
            ha="center", va="bottom", fontsize=9, color=PREFILL_COLOR)
    ax.text((ttft_s + decode_s / 2) / scale, 0.42, f"decode: {new_tokens} tokens written\n{amount(decode_s / scale)} {unit}",
            ha="center", va="bottom", fontsize=9, color=DECODE_COLOR)
    ax.set_ylim(-0.5, 1.3)
    ax.set_yticks([])
    ax.spines["left"].set_visible(False)
    ax.set_xlabel(f"time since the request arrived ({unit})")
    ax.set_title(f"Reading {prompt_len} tokens vs writing {new_tokens}: "
                 f"{prompt_len / ttft_s:,.0f} vs {new_tokens / decode_s:,.0f} tokens/s", fontsize=10)
    return describe(fig, f"Timeline of one request: prefill reads {prompt_len} tokens in {amount(ttft_s / scale)} "
                          f"{unit} (solid bar), then decode writes {new_tokens} tokens one by one in "
                          f"{amount(decode_s / scale)} {unit} (hatched bar): {prompt_len / ttft_s:,.0f} vs "
                          f"{new_tokens / decode_s:,.0f} tokens/s.")


def two_speeds_bars(result, *, reference: dict | None = None) -> Figure:
    """Prefill vs decode tokens/s here (``result``: a lessons.TwoSpeeds or anything with
    ``prefill_tokens_per_s``/``decode_tokens_per_s``), beside a reference node's."""
    groups = [("this machine", result.prefill_tokens_per_s, result.decode_tokens_per_s)]
    if reference:
        groups.append((reference["name"], reference["prefill_tokens_per_s"], reference["decode_tokens_per_s"]))
    fig, (ax,) = new_figure(width=7.5, height=4.0)
    for i, (name, pre, dec) in enumerate(groups):
        ax.bar(i - 0.18, pre, width=0.34, color=PREFILL_COLOR, label="prefill (reading)" if i == 0 else None)
        ax.bar(i + 0.18, dec, width=0.34, color=DECODE_COLOR, hatch=HATCH, edgecolor="white",
               label="decode (writing)" if i == 0 else None)
        ax.text(i - 0.18, pre, f"{pre:,.0f}", ha="center", va="bottom", fontsize=9)
        ax.text(i + 0.18, dec, f"{dec:,.0f}", ha="center", va="bottom", fontsize=9)
        ax.annotate(f"{pre / dec:.0f}x", xy=(i, math.sqrt(pre * dec)), ha="center", fontsize=12, weight="bold")
    ax.set_yscale("log")
    ax.grid(True, axis="y", **GRID)
    si_ticks(ax, "y")
    ax.set_xticks(range(len(groups)), [g[0] for g in groups])
    ax.set_ylabel("tokens/s (batch 1)")
    ax.set_title("Same model, same chip: reading vs writing")
    legend_clear_of_data(ax, fontsize=8, frameon=False)
    return describe(fig, "Bars of tokens/s at batch 1, log scale, prefill (solid) beside decode (hatched): "
                          + "; ".join(f"{name} {pre:,.0f} vs {dec:,.0f} ({pre / dec:,.0f}x)"
                                      for name, pre, dec in groups) + ".")


def ttft_plot(records: Iterable = (), *, cfg=None, spec=None, dtype=None,
              prompt_lengths: Sequence[int] | None = None, title: str | None = None) -> Figure:
    """Time to first token (the prefill) against prompt length, measured and predicted.

    Measured prefill records are grouped by batch size; the roofline line (``cfg`` + ``spec``)
    is for batch 1. Its slope is ~1 while matmuls dominate and steepens at long prompts, where
    attention's ``T^2`` term takes over.
    """
    recs = [r for r in as_records(records) if is_prefill(r)]
    prediction_args(recs, cfg, spec, "ttft_plot", "prefill")
    fig, (ax,) = new_figure()
    by_batch = defaultdict(list)
    for r in recs:
        by_batch[int(r.batch)].append(r)
    measured = []
    for i, (color, (b, rs)) in enumerate(zip(shades(PREFILL_COLOR, len(by_batch)), sorted(by_batch.items()))):
        T, sec = median_by((int(r.prompt_len), r.seconds) for r in rs)
        measured.append(f"batch {b}: {sec[0] * 1e3:,.3g} ms at {T[0]:,.0f} tokens to {sec[-1] * 1e3:,.3g} ms "
                        f"at {T[-1]:,.0f}")
        ax.plot(T, sec * 1e3, "-", marker=MARKERS[i % len(MARKERS)], color=color, ms=6, mec="white",
                label=f"measured, batch {b}")
    if cfg is not None:
        lengths = prompt_lengths or sorted({int(r.prompt_len) for r in recs}) or [64, 8192]
        lo, hi = min(lengths), max(lengths)
        grid = np.unique(np.round(np.logspace(math.log10(lo), math.log10(max(hi, lo + 1)), 120)).astype(int))
        dt = dtype if dtype is not None else cfg.dtype
        pred = [roofline.predicted_prefill_seconds(cfg, spec, 1, int(t), dt) for t in grid]
        ax.plot(grid, np.array(pred) * 1e3, color=ROOF_COLOR, lw=2, label=f"roofline, {spec.name}, batch 1")
    log_axes(ax)
    length_ticks(ax, sorted({int(r.prompt_len) for r in recs}) or list(prompt_lengths or []))
    si_ticks(ax, "y")
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("time to first token (ms)")
    ax.set_title(title or "Time to first token grows with the prompt")
    legend_clear_of_data(ax, "upper left", fontsize=8, frameon=False)
    parts = ["measured " + "; ".join(measured)] if measured else []
    if cfg is not None:
        parts.append(f"the roofline's prediction for {spec.name} at batch 1 (grey line)")
    return describe(fig, "Time to first token against prompt length, log-log: " + "; ".join(parts) + ".")


def prefill_flops_vs_length(records: Iterable, spec, dtype, *, highlight: int | None = None,
                            kernels: Iterable = ()) -> Figure:
    """Achieved FLOP/s of prefill against prompt length, under the measured matmul ceiling,
    with the roofline's prediction (min(peak, intensity x bandwidth)) and, given ``kernels``
    (``experiments.KernelPoint``), the FLOP/s of one lone matmul with m = that many rows."""
    recs = sorted((r for r in as_records(records) if is_prefill(r)), key=lambda r: r.prompt_len)
    if not recs:
        raise ValueError("prefill_flops_vs_length needs prefill records")
    peak = peak_of(spec, dtype)
    scale, unit = flops_unit(peak)
    T = np.array([r.prompt_len for r in recs], float)
    achieved = np.array([r.flops / r.seconds for r in recs])
    predicted = np.array([min(peak, r.flops / r.bytes * spec.bandwidth) for r in recs])
    fig, (ax,) = new_figure()
    ax.axhline(peak / scale, color=ROOF_COLOR, lw=2, label=f"measured matmul peak ({peak / scale:,.3g} {unit})")
    ax.plot(T, predicted / scale, "--", color=ROOF_COLOR, lw=1.2, label="roofline prediction")
    ks = sorted(kernels, key=lambda k: k.m)
    if ks:
        ax.plot([k.m for k in ks], [k.flops_per_s / scale for k in ks], "s:", color=DECODE_COLOR, ms=6, lw=1.4,
                label=f"one matmul [m, {ks[0].k}] @ [{ks[0].k}, {ks[0].n}], m = prompt length")
    ax.plot(T, achieved / scale, "-o", color=PREFILL_COLOR, ms=7, mec="white", label=plain_text(f"measured ({recs[0].device})"))
    if highlight is not None:
        sel = [i for i, r in enumerate(recs) if r.prompt_len == highlight]
        if sel:
            ax.scatter(T[sel], achieved[sel] / scale, s=220, facecolors="none", edgecolors="black", lw=2, zorder=6)
    log_axes(ax)
    length_ticks(ax, T.astype(int).tolist())
    si_ticks(ax, "y")
    ax.set_xlabel("prompt length (tokens, batch 1)")
    ax.set_ylabel(f"achieved ({unit})")
    ax.set_title("Prefill climbs toward the compute ceiling as the prompt grows")
    legend_clear_of_data(ax, "lower right", fontsize=8, frameon=False)
    return describe(fig, f"Achieved prefill {unit} against prompt length, log-log: from {achieved[0] / scale:,.3g} "
                          f"at {int(T[0]):,} tokens to {achieved[-1] / scale:,.3g} at {int(T[-1]):,}, under the "
                          f"measured matmul peak of {peak / scale:,.3g} {unit}; dashed: the roofline's prediction.")


def decode_bytes_bars(records: Iterable, cfg, *, highlight: int | None = None) -> Figure:
    """Per context: the bytes one decode step moves (weights vs KV cache) and its measured time."""
    recs = sorted((r for r in as_records(records) if is_decode(r)), key=lambda r: r.context)
    if not recs:
        raise ValueError("decode_bytes_bars needs decode records")
    fig, (left, right) = new_figure(2, width=11.0, height=4.0)
    x = np.arange(len(recs))
    steps = [costs.decode_cost(cfg, r.batch, r.context) for r in recs]
    weights = np.array([c.parts.get("weights", 0) + c.parts.get("embedding_rows", 0) for c in steps]) / 1e6
    kv = np.array([c.parts.get("kv_read", 0) + c.parts.get("kv_write", 0) for c in steps]) / 1e6
    left.bar(x, weights, color="#8c8c8c", label="weights")
    left.bar(x, kv, bottom=weights, color=DECODE_COLOR, hatch=HATCH, edgecolor="white", label="KV cache")
    right.bar(x, [r.step_seconds * 1e3 for r in recs], color=DECODE_COLOR)
    for ax in (left, right):
        ax.set_xticks(x, [f"{r.context:,}" for r in recs])
        ax.set_xlabel("context (tokens already in the cache)")
        ax.grid(True, axis="y", **GRID)
        if highlight is not None:
            for i, r in enumerate(recs):
                if r.context == highlight:
                    ax.get_xticklabels()[i].set_fontweight("bold")
                    ax.axvspan(i - 0.45, i + 0.45, color=tint(OKABE_ITO["yellow"], 0.35), zorder=0)
    left.set_ylabel("bytes moved per step (MB)")
    left.set_title("What one decode step must move")
    legend_clear_of_data(left, fontsize=8, frameon=False)
    right.set_ylabel("measured step time (ms)")
    right.set_title("How long it takes (batch 1)")
    steps = [r.step_seconds * 1e3 for r in recs]
    return describe(fig, f"Two bar charts over contexts {', '.join(f'{r.context:,}' for r in recs)} tokens: the "
                          f"bytes one decode step moves, {weights[0]:,.0f} MB of weights (grey) plus "
                          f"{kv[0]:,.1f} to {kv[-1]:,.1f} MB of KV cache (hatched), and its measured time, "
                          f"{min(steps):,.3g} to {max(steps):,.3g} ms.")


def decode_time_vs_bytes(records: Iterable, spec, dtype=None, *, label=None) -> Figure:
    """Measured decode step time against the bytes the step moves, beside the two roofline
    times: bytes / bandwidth (memory) and, with ``dtype``, FLOPs / peak (compute). Decode
    points sit near the memory line and far above the compute one: bandwidth-bound.
    ``label(record) -> str`` names each point (default: its context)."""
    label = label or (lambda r: f"context {r.context:,}")
    recs = sorted((r for r in as_records(records) if is_decode(r)), key=lambda r: r.bytes_per_step)
    if not recs:
        raise ValueError("decode_time_vs_bytes needs decode records")
    checks.hardware_spec(spec)
    b = np.array([r.bytes_per_step for r in recs])
    t = np.array([r.step_seconds for r in recs])
    fig, (ax,) = new_figure()
    grid = np.linspace(0, b.max() * 1.15, 50)
    ax.plot(grid / 1e6, grid / spec.bandwidth * 1e3, color=DECODE_COLOR, lw=2,
            label=f"memory time: bytes / measured bandwidth ({spec.bandwidth / 1e9:,.3g} GB/s)")
    if dtype is not None:
        peak = peak_of(spec, dtype)
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
    ax.set_title("Decode step time against the bytes the step moves")
    legend_clear_of_data(ax, "upper left", fontsize=8, frameon=False)
    mbu = [100 * (r.mbu or 0) for r in recs]
    return describe(fig, f"Measured decode step time against the bytes the step moves: {len(recs)} points from "
                          f"{b[0] / 1e6:,.0f} MB in {t[0] * 1e3:,.3g} ms to {b[-1] / 1e6:,.0f} MB in "
                          f"{t[-1] * 1e3:,.3g} ms (MBU {min(mbu):.0f} to {max(mbu):.0f}%), close to the memory "
                          "line (bytes / bandwidth)" + (" and far above the dashed compute line"
                                                        if dtype is not None else "") + ".")


def decode_throughput_plot(records: Iterable, *, cfg=None, spec=None, dtype=None,
                           context: int | None = None, knee_factor: float = 1.5,
                           title: str | None = None) -> Figure:
    """Decode tokens/s against batch size: measured points, the roofline curve, both knees.

    ``records``: the decode records of one sweep (prefill records are ignored). With ``cfg``
    and ``spec`` the predicted tokens/s is drawn (solid: with the KV-cache term; dashed:
    weights only) at ``context`` (default: the records' context), with the predicted flip.
    The measured knee (first batch whose step takes >= 1.5x the batch-1 step) is marked.
    """
    recs = [r for r in as_records(records) if is_decode(r)]
    prediction_args(recs, cfg, spec, "decode_throughput_plot", "decode")
    fig, (ax,) = new_figure()
    batches_all = [int(r.batch) for r in recs]
    if context is None:
        contexts = sorted({int(r.context) for r in recs})
        context = contexts[len(contexts) // 2] if contexts else 1024
    if recs:
        b, tps = median_by((int(r.batch), r.decode_tokens_per_s) for r in recs)
        ax.plot(b, tps, "-", color=DECODE_COLOR, lw=1.0, alpha=0.5)
        ax.scatter(b, tps, s=60, color=DECODE_COLOR, zorder=5, edgecolors="white",
                   label=plain_text(f"measured ({recs[0].device})"))
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
    knee = None
    if recs and 1 in batches_all and len(set((r.device, r.preset, r.context) for r in recs)) == 1:
        knee = roofline.measured_knee(recs, knee_factor)
        if knee is not None:
            kb, kt = median_by((int(r.batch), r.decode_tokens_per_s) for r in recs if int(r.batch) == knee)
            ax.axvline(knee, color=DECODE_COLOR, ls="--", lw=1.2, alpha=0.8)
            ax.annotate(f"measured knee B={knee}\n(step >= {knee_factor:g}x batch 1)", xy=(knee, kt[0]),
                        xytext=(-10, 18), textcoords="offset points", ha="right", fontsize=9,
                        color=DECODE_COLOR, arrowprops=dict(arrowstyle="->", color=DECODE_COLOR))
    log_axes(ax, x=False)
    batch_ticks(ax, batches_all or [1, 2, 4, 8, 16, 32, 64, 128, 256])
    si_ticks(ax, "y")
    ax.set_xlabel("batch size (sequences decoded together)")
    ax.set_ylabel("decode throughput (tokens/s, whole batch)")
    ax.set_title(title or "Batching shares each weight read: decode tokens/s against batch")
    legend_clear_of_data(ax, "upper left", fontsize=8, frameon=False)
    parts = []
    if recs:
        parts.append(f"measured from {tps[0]:,.0f} at batch {int(b[0])} to {tps[-1]:,.0f} at batch {int(b[-1])}")
        if knee is not None:
            parts.append(f"measured knee at batch {knee}")
    if cfg is not None:
        parts.append(f"the roofline for {spec.name} at context {context:,} ({verdict})")
    return describe(fig, "Decode tokens/s against batch size, log scales: " + "; ".join(parts) + ".")
