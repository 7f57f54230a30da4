"""Figures of serving economics: the price ratio, and latency under load from the simulator."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from inference_lab import economics
from inference_lab.plots._style import (
    DECODE_COLOR, GRID, MARKERS, MODE_STYLES, OKABE_ITO, ROOF_COLOR, _describe, _figure, _style_log,
    _base2_batches, _si_ticks, _palette, _shades, _tint)


def price_ratio_plot(cfg, spec, *, batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
                     contexts: Sequence[int] = (512, 2048, 8192), dtype=None,
                     band: tuple[float, float] = (3, 5), title: str | None = None) -> Figure:
    """Predicted output/input price ratio against decode batch, one line per context length,
    with the 3-5x band providers charge shaded."""
    fig, (ax,) = _figure()
    ax.axhspan(*band, color=_tint(OKABE_ITO["orange"]), zorder=0,
               label=f"what providers charge ({band[0]:g}-{band[1]:g}x)")
    ends = []
    for i, (color, ctx) in enumerate(zip(_shades(DECODE_COLOR, len(contexts)), contexts)):
        ratios = economics.price_ratio_vs_batch(cfg, spec, batches, context=ctx, dtype=dtype)
        ends.append(f"context {ctx:,}: {ratios[0]:,.3g}x at batch {batches[0]} to {ratios[-1]:,.3g}x at {batches[-1]}")
        ax.plot(batches, ratios, "-", marker=MARKERS[i % len(MARKERS)], color=color, ms=5, mec="white",
                label=f"context {ctx:,} tokens")
    _style_log(ax, x=False)
    _base2_batches(ax, batches)
    _si_ticks(ax, "y")
    ax.set_xlabel("decode batch size (sequences sharing each step)")
    ax.set_ylabel("output / input price (x, per token)")
    ax.set_title(title or f"Why output costs more: {cfg.name} on {spec.name} (roofline)")
    ax.legend(fontsize=8, frameon=False)
    return _describe(fig, f"Predicted output/input price ratio of {cfg.name} on {spec.name} against decode batch, "
                          f"one line per context: {'; '.join(ends)}; shaded band: the {band[0]:g}-{band[1]:g}x "
                          "providers charge.")


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
    for mode in sorted({r["mode"] for r in rows}):
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r[x])
        xs = [r[x] for r in mine]
        s = MODE_STYLES.get(mode, {"color": ROOF_COLOR, "marker": "D", "linestyle": "-."})
        left.plot(xs, [r["ttft_p50_ms"] for r in mine], **s, label=f"{mode}, p50")
        left.plot(xs, [r["ttft_p99_ms"] for r in mine], **s, mfc="white", alpha=0.7, label=f"{mode}, p99")
        right.plot(xs, [1e3 / r["tpot_p50_ms"] for r in mine], **s, label=mode)
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
    modes = sorted({r["mode"] for r in rows})
    return _describe(fig, f"Two panels against {xlabel}, one colour, marker and line style per serving mode "
                          f"({', '.join(modes)}): time to first token at p50 (filled markers) and p99 (hollow), "
                          "and the decode tokens/s each user sees (p50).")


def latency_distributions(results: dict) -> Figure:
    """Distributions (CDFs) of TTFT and TPOT for named simulation results (economics.SimResult)."""
    if not results:
        raise ValueError("latency_distributions needs {name: SimResult}")
    fig, (left, right) = _figure(2, width=11.0, height=4.0)
    medians = []
    for i, (name, res) in enumerate(results.items()):
        s = next((v for k, v in MODE_STYLES.items() if name.startswith(k)),
                 {"color": _palette(len(results))[i], "linestyle": ("-", "--", ":", "-.")[i % 4]})
        for ax, values in ((left, res.ttft), (right, res.tpot)):
            v = np.sort(np.asarray(values)[np.isfinite(values)]) * 1e3
            ax.plot(v, np.linspace(0, 1, len(v)), color=s["color"], linestyle=s["linestyle"], lw=2, label=name)
        medians.append(f"{name}: median time to first token {np.nanmedian(res.ttft) * 1e3:,.3g} ms, per output "
                       f"token {np.nanmedian(res.tpot) * 1e3:,.3g} ms")
    for ax, what in ((left, "time to first token (ms)"), (right, "time per output token (ms)")):
        ax.set_xscale("log")
        _si_ticks(ax, "x")  # 20, 50, 100 rather than 2x10^1
        ax.grid(True, **GRID)
        ax.set_xlabel(what)
        ax.set_ylabel("fraction of requests")
        ax.legend(fontsize=8, frameon=False, loc="lower right")
    left.set_title("Waiting for the first token")
    right.set_title("Speed of the rest of the answer")
    return _describe(fig, "Cumulative distributions (log time axes, one line style per run) of time to first "
                          "token and time per output token; " + "; ".join(medians) + ".")
