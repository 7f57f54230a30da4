"""Figures of serving economics: the price ratio, latency under load from the simulator (or a
real engine's ``vllm bench serve`` run beside it), goodput, and the balance of xPyD pools.

Serving modes are told apart by colour, marker and line style together (``MODE_STYLES``);
medians are hollow markers on thin lines, p99s filled markers on thick ones.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from inference_lab.analytic import economics, roofline
from inference_lab.plots.style import (
    DECODE_COLOR, DEVICE_MARKERS, GRID, MARKERS, MODE_STYLES, OKABE_ITO, PREFILL_COLOR, LabFigure, describe,
    legend_clear_of_data, new_figure, log_axes, batch_ticks, si_ticks, shades, tint)

_LINESTYLES = ("-", "--", ":", "-.")


def price_ratio_plot(cfg, spec, *, batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
                     contexts: Sequence[int] = (512, 2048, 8192), dtype=None,
                     band: tuple[float, float] = (3, 5), title: str | None = None,
                     prefill_mfu: float | Sequence[float] = 1.0) -> Figure:
    """Predicted output/input price ratio against decode batch, one line per context length
    and prefill MFU assumed (line style), with the 3-5x band providers charge shaded. Where the
    spec has a memory size, each line stops at the largest batch that fits at its context
    (:func:`roofline.max_batch`), marked with an x: a batch that does not fit has no price."""
    mfus = [prefill_mfu] if isinstance(prefill_mfu, (int, float)) else list(prefill_mfu)
    fig, (ax,) = new_figure()
    ax.axhspan(*band, color=tint(OKABE_ITO["orange"]), zorder=0,
               label=f"what providers charge ({band[0]:g}-{band[1]:g}x)")
    ends = []
    for j, mfu in enumerate(mfus):
        for i, (color, ctx) in enumerate(zip(shades(DECODE_COLOR, len(contexts)), contexts)):
            full = roofline.max_batch(cfg, spec, ctx) if spec.memory_bytes else None
            bs = [b for b in batches if full is None or b <= full]
            if full and full < batches[-1] and full not in bs:
                bs.append(full)
            if not bs:
                continue
            ratios = economics.price_ratio_vs_batch(cfg, spec, bs, context=ctx, dtype=dtype, prefill_mfu=mfu)
            stop = " (memory full)" if full and full < batches[-1] else ""
            ends.append(f"context {ctx:,} at {mfu:.0%} MFU: {ratios[0]:,.3g}x at batch {bs[0]} to "
                        f"{ratios[-1]:,.3g}x at {bs[-1]}{stop}")
            ax.plot(bs, ratios, marker=MARKERS[(i + j * len(contexts)) % len(MARKERS)], ls=_LINESTYLES[j % 4],
                    color=color, ms=5, mec="white", label=f"context {ctx:,} tokens, prefill at {mfu:.0%} MFU")
            if stop:
                ax.plot([bs[-1]], [ratios[-1]], "x", color="black", ms=9, mew=2, zorder=5)
    log_axes(ax, x=False)
    batch_ticks(ax, batches)
    si_ticks(ax, "y")
    ax.set_xlabel("decode batch size (sequences sharing each step)")
    ax.set_ylabel("output / input price (x, per token)")
    ax.set_title(title or f"Why output costs more: {cfg.name} on {spec.name} (roofline)")
    legend_clear_of_data(ax, fontsize=8, frameon=False)
    return describe(fig, f"Predicted output/input price ratio of {cfg.name} on {spec.name} against decode batch, "
                          f"one line per context (a line ends, marked x, where memory is full): {'; '.join(ends)}; shaded band: "
                          f"the {band[0]:g}-{band[1]:g}x providers charge.")


def _style(name: str, i: int, n: int) -> dict:
    """A mode's style, or for anything else (a measured engine, an xPyD split) one of ``n``
    along a colour-blind-safe sequential map, each with its own marker and line style."""
    for mode, style in MODE_STYLES.items():
        if name.startswith(mode):
            return dict(style)
    return {"color": colormaps["viridis"](0.9 * i / max(n - 1, 1)), "marker": DEVICE_MARKERS[(i + 3) % len(DEVICE_MARKERS)],
            "linestyle": _LINESTYLES[i % 4]}


def _series(rows, key):
    names = []
    for r in rows:
        if r[key] not in names:
            names.append(r[key])
    return names


def serving_plot(rows: Sequence[dict], *, x: str = "rate", title: str | None = None,
                 series: str = "mode") -> Figure:
    """TTFT, TPOT and ITL (median and p99) against load, one series per ``series`` value.

    ``rows``: :meth:`SimResult.summary` rows carrying ``x`` (``simulator.load_sweep`` adds
    ``rate``), or a real run's :meth:`vllm_bench.BenchRun.summary` (drawn where it has a
    finite ``x``). Each row needs ``ttft_p50_ms``, ``ttft_p99_ms``, ``tpot_p50_ms``; TPOT and
    ITL p99 are drawn where present.
    """
    if not rows:
        raise ValueError("serving_plot needs rows from simulator.load_sweep(...)")
    if any(x not in r for r in rows):
        raise ValueError(f"serving_plot(x={x!r}): every row needs a {x!r} entry")
    xlabel = {"rate": "arrival rate (requests/s)", "prompt_len": "mean prompt length (tokens)",
              "chunk_tokens": "chunk budget (tokens per iteration)"}.get(x, x)
    fig, axes = new_figure(3, width=13.5, height=4.4)
    panels = (("ttft", "time to first token (ms)", "Time to first token"),
              ("tpot", "time per output token (ms)", "TPOT: each request's mean gap"),
              ("itl", "inter-token latency (ms)", "ITL: every gap"))
    names = _series(rows, series)
    for i, name in enumerate(names):
        mine = sorted((r for r in rows if r[series] == name and r[x] is not None and math.isfinite(r[x])),
                      key=lambda r: r[x])
        if not mine:
            continue
        st = _style(str(name), i, len(names))
        xs = [r[x] for r in mine]
        for ax, (metric, _, _) in zip(axes, panels):
            for q, lw, face in ((50, 1.0, "white"), (99, 2.2, st["color"])):
                ys = [r.get(f"{metric}_p{q}_ms", math.nan) for r in mine]
                if all(v is None or not math.isfinite(v) for v in ys):
                    continue
                ax.plot(xs, ys, color=st["color"], marker=st["marker"], ls=st["linestyle"], lw=lw, ms=6,
                        mfc=face, label=f"{name}, p{q}")
    log_x = x not in ("rate", "prompt_len")
    xs_all = sorted({r[x] for r in rows if r[x] is not None and math.isfinite(r[x])})
    for ax, (_, ylabel, t) in zip(axes, panels):
        log_axes(ax, x=False)
        if log_x:
            batch_ticks(ax, xs_all)  # log base 2, ticks at the values swept, plain numbers
        si_ticks(ax, "y")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(t)
    legend_clear_of_data(axes[0], fontsize=7, frameon=False)
    fig.suptitle(title or "Under load: what each serving mode does to TTFT, TPOT and ITL")
    return describe(fig, f"Three panels against {xlabel}: time to first token, time per output token and "
                          f"inter-token latency, median (thin line, hollow markers) and p99 (thick, filled), one "
                          f"colour, marker and line style per {series} ({', '.join(map(str, names))}).")


def _trace_of(result):
    return getattr(result, "trace", None) or result  # a BenchRun carries its trace


def latency_distributions(results: dict) -> Figure:
    """Distributions (CDFs) of TTFT, TPOT and ITL for named runs: ``SimResult``s, or measured
    ``vllm_bench.BenchRun``s saved with ``--save-detailed``."""
    if not results:
        raise ValueError("latency_distributions needs {name: SimResult}")
    fig, axes = new_figure(3, width=13.5, height=4.0)
    for i, (name, res) in enumerate(results.items()):
        tr = _trace_of(res)
        if not hasattr(tr, "ttft"):
            raise ValueError(f"{name}: no per-request timings (a vLLM run needs --save-detailed)")
        st = _style(str(name), i, len(results))
        for ax, values in zip(axes, (tr.ttft, tr.tpot, tr.itl)):
            v = np.sort(np.asarray(values)[np.isfinite(values)]) * 1e3
            if len(v):
                ax.plot(v, np.linspace(0, 1, len(v)), color=st["color"], ls=st["linestyle"], lw=2, label=name)
                ax.plot(v[-1:], [1.0], color=st["color"], marker=st["marker"], ls="none", ms=7)
    for ax, what, t in zip(axes, ("time to first token (ms)", "time per output token (ms)", "inter-token gap (ms)"),
                           ("Waiting for the first token", "TPOT: each request's mean gap", "ITL: every gap")):
        ax.set_xscale("log")
        si_ticks(ax, "x")
        ax.grid(True, **GRID)
        ax.set_xlabel(what)
        ax.set_ylabel("fraction of requests" if "gap" not in what else "fraction of gaps")
        ax.set_title(t)
    legend_clear_of_data(axes[0], "lower right", fontsize=8, frameon=False)
    medians = [f"{name}: median TTFT {np.nanmedian(_trace_of(res).ttft) * 1e3:,.3g} ms, TPOT "
               f"{np.nanmedian(_trace_of(res).tpot) * 1e3:,.3g} ms" for name, res in results.items()]
    return describe(fig, "Cumulative distributions (log time axes, one line style and end marker per run) of time "
                          "to first token, time per output token and inter-token gaps; " + "; ".join(medians) + ".")


def goodput_plot(rows: Sequence[dict], *, x: str = "rate", series: str = "config",
                 slo: str | None = None, title: str | None = None) -> Figure:
    """Goodput (requests/s meeting the SLO) against offered load, one line per ``series``
    value (a mode, or an xPyD split such as ``"6P2D"``), with the most a run can score: every
    request good, counted like goodput over the run's duration (first arrival to last token), so
    below the offered load by the time the last answers take to finish."""
    rows = [r for r in rows if r.get("goodput_rps") is not None]
    if not rows:
        raise ValueError("goodput_plot needs summary rows computed with an slo=SLO(...)")
    fig, (ax,) = new_figure(width=8.0, height=4.8)
    xs_all = sorted({r[x] for r in rows})
    best = [max(r["request_throughput"] for r in rows if r[x] == v) for v in xs_all]
    ax.plot(xs_all, xs_all, color="#bbbbbb", lw=1, ls=":", label="offered load")
    ax.plot(xs_all, best, color="#777777", lw=1, ls="--", label="every request meets the SLO (completed / duration)")
    names = _series(rows, series)
    for i, name in enumerate(names):
        mine = sorted((r for r in rows if r[series] == name), key=lambda r: r[x])
        st = _style(str(name), i, len(names))
        ax.plot([r[x] for r in mine], [r["goodput_rps"] for r in mine], color=st["color"], marker=st["marker"],
                ls=st["linestyle"], lw=2, ms=6, label=str(name))
    ax.grid(True, **GRID)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("offered load (requests/s)" if x == "rate" else x)
    ax.set_ylabel("goodput (requests/s meeting the SLO)")
    ax.set_title(title or ("Goodput" + (f" at {slo}" if slo else "")))
    legend_clear_of_data(ax, "upper left", fontsize=7, frameon=False, ncol=2)
    peaks = [f"{name} peaks at {max(r['goodput_rps'] for r in rows if r[series] == name):,.3g}" for name in names]
    return describe(fig, f"Goodput (requests/s meeting the SLO) against offered load, one line, marker and style "
                          f"per {series}: {'; '.join(peaks)} requests/s; a dotted diagonal at the offered load and a dashed "
                          "line at the most a run can score, every request meeting the SLO over the run's duration.")


def pool_balance_plot(splits: Sequence[str], prefill_rps: Sequence[float], decode_rps: Sequence[float], *,
                      title: str | None = None) -> Figure:
    """For each xPyD split: requests/s its prefill pool and its decode pool can each sustain.
    The system runs at the smaller of the two; the best split is where they meet."""
    if not (len(splits) == len(prefill_rps) == len(decode_rps)) or not splits:
        raise ValueError("pool_balance_plot needs one prefill and one decode capacity per split")
    fig, (ax,) = new_figure(width=8.0, height=4.4)
    pos = np.arange(len(splits))
    ax.bar(pos - 0.2, prefill_rps, 0.4, color=PREFILL_COLOR, label="prefill pool can take")
    ax.bar(pos + 0.2, decode_rps, 0.4, color=DECODE_COLOR, hatch="//", edgecolor="white", label="decode pool can take")
    both = np.minimum(prefill_rps, decode_rps)
    ax.plot(pos, both, color="black", marker="o", lw=1.5, label="the system (the smaller)")
    best = int(np.argmax(both))
    ax.annotate(f"best: {splits[best]}", (pos[best], both[best]), textcoords="offset points", xytext=(0, 12),
                ha="center", fontsize=9, fontweight="bold")
    ax.set_xticks(pos, splits)
    ax.grid(True, axis="y", **GRID)
    ax.set_xlabel("split of the GPUs (x prefill, y decode)")
    ax.set_ylabel("sustainable load (requests/s)")
    ax.set_title(title or "Sizing the pools: each must keep up")
    legend_clear_of_data(ax, fontsize=8, frameon=False)
    return describe(fig, f"Paired bars per xPyD split ({', '.join(splits)}): requests/s the prefill pool (solid) "
                          f"and the decode pool (hatched) can sustain; the system takes the smaller, best at "
                          f"{splits[best]}.")


KV_LAYOUTS = {"contiguous": {"color": OKABE_ITO["vermillion"], "marker": "o", "linestyle": "-"},
              "paged": {"color": OKABE_ITO["blue"], "marker": "s", "linestyle": "--"}}


def kv_memory_plot(rows: Sequence[dict], measured: Sequence[dict] = (), *, title: str | None = None) -> Figure:
    """Requests decoding at once, output tokens/s and TTFT p50 against the KV memory budget, one
    series per cache layout (``KV_LAYOUTS``: contiguous slots, paged blocks). ``rows``: simulated
    points, hollow markers on lines; ``measured``: the engine's runs, filled markers, larger. Each
    row: ``budget`` (full contexts of memory), ``layout``, ``at_once``, ``tokens_per_s``, ``ttft_p50_ms``."""
    if not rows:
        raise ValueError("kv_memory_plot needs simulated rows: {'budget', 'layout', 'at_once', ...}")
    fig, axes = new_figure(3, width=13.5, height=4.2)
    panels = (("at_once", "requests decoding at once", "The batch the memory allows"),
              ("tokens_per_s", "output tokens/s", "Throughput"),
              ("ttft_p50_ms", "time to first token, p50 (ms)", "Waiting to start"))
    notes = []
    for layout, st in KV_LAYOUTS.items():
        mine = sorted((r for r in rows if r["layout"] == layout), key=lambda r: r["budget"])
        seen = [r for r in measured if r["layout"] == layout]
        for ax, (key, _, _) in zip(axes, panels):
            if mine:
                ax.plot([r["budget"] for r in mine], [r[key] for r in mine], color=st["color"], marker=st["marker"],
                        ls=st["linestyle"], lw=1.4, ms=6, mfc="white", label=f"{layout}, simulated")
            if seen:
                ax.plot([r["budget"] for r in seen], [r[key] for r in seen], color=st["color"], marker=st["marker"],
                        ls="none", ms=10, label=f"{layout}, measured")
        if mine:
            notes.append(f"{layout} {mine[0]['at_once']:.1f} to {mine[-1]['at_once']:.1f} at once from "
                         f"{mine[0]['budget']:g} to {mine[-1]['budget']:g} contexts")
    for ax, (_, ylabel, t) in zip(axes, panels):
        ax.grid(**GRID)
        ax.set_xlabel("KV memory budget (full contexts)")
        ax.set_ylabel(ylabel)
        ax.set_title(t)
        ax.set_ylim(bottom=0)
    legend_clear_of_data(axes[0], fontsize=7, frameon=False)
    fig.suptitle(title or "One KV memory budget: contiguous slots against paged blocks")
    return describe(fig, "Three panels against the KV memory budget in full contexts: requests decoding at once, "
                          "output tokens per second and median time to first token, contiguous (vermillion "
                          "circles, solid) and paged (blue squares, dashed); simulated hollow on lines, measured "
                          f"filled: {'; '.join(notes)}.")


def step_timeline_plot(gap_times: Sequence[float], gap_ms: Sequence[float], steps: Sequence[dict], *,
                       target_ms: float | None = None, title: str | None = None) -> Figure:
    """Two panels on one time axis (seconds into the run). Top: every gap between two tokens of a
    request, at the time of the later token, the longest circled, a latency target dashed. Bottom:
    every engine step at the time its tokens came, its measured time (squares: steps carrying
    prompt tokens; circles: decode rows alone) and the time its shape was predicted to take
    (bars); the step that made the longest gap starred. ``steps``: dicts with ``at`` (s), ``ms``,
    ``predicted_ms`` (or None) and ``prompt_tokens``."""
    if not len(gap_ms) or not steps:
        raise ValueError("step_timeline_plot needs the trace's gaps and the engine's steps")
    gap_times, gap_ms = np.asarray(gap_times, float), np.asarray(gap_ms, float)
    fig = LabFigure(figsize=(8.0, 5.6), layout="constrained", dpi=110)
    top, bottom = fig.subplots(2, 1, sharex=True)
    for ax in (top, bottom):
        ax.set_axisbelow(True)
        ax.spines[["top", "right"]].set_visible(False)
        ax.grid(True, **GRID)
    worst = int(np.argmax(gap_ms))
    top.plot(gap_times, gap_ms, ls="none", marker=".", ms=4, color=DECODE_COLOR, label="a gap between two tokens")
    top.plot([gap_times[worst]], [gap_ms[worst]], ls="none", marker="o", ms=12, mfc="none", mew=1.6, color="black",
             label=f"the longest: {gap_ms[worst]:.1f} ms")
    if target_ms is not None:
        top.axhline(target_ms, color=OKABE_ITO["vermillion"], ls="--", lw=1.2, label=f"target {target_ms:.1f} ms")
    top.set_ylabel("inter-token gap (ms)")
    top.set_ylim(bottom=0)
    legend_clear_of_data(top, fontsize=8, frameon=False)
    at = np.array([s["at"] for s in steps])
    ms = np.array([s["ms"] for s in steps])
    prompt = np.array([s["prompt_tokens"] > 0 for s in steps])
    bottom.plot(at[prompt], ms[prompt], ls="none", marker="s", ms=4, color=PREFILL_COLOR,
                label="step with prompt tokens")
    bottom.plot(at[~prompt], ms[~prompt], ls="none", marker="o", ms=3, color=DECODE_COLOR, label="decode rows alone")
    predicted = [(s["at"], s["predicted_ms"]) for s in steps if s.get("predicted_ms")]
    if predicted:
        bottom.plot(*zip(*predicted), ls="none", marker="_", ms=8, color="black", label="its shape's prediction")
    # the step whose tokens the longest gap waited for: the last to end before that token came
    made = max(int(np.searchsorted(at, gap_times[worst] + 1e-6, side="right")) - 1, 0)
    bottom.plot([at[made]], [ms[made]], ls="none", marker="*", ms=14, color=OKABE_ITO["orange"], mec="black",
                label="the step that made the longest gap")
    bottom.set_ylabel("step time (ms)")
    bottom.set_xlabel("seconds into the run")
    bottom.set_ylim(bottom=0)
    legend_clear_of_data(bottom, fontsize=8, frameon=False)
    fig.suptitle(title or "Which step made that gap: a trace's gaps above, the engine's steps below")
    return describe(fig, f"Two panels over {gap_times.max():.1f} s: {len(gap_ms)} inter-token gaps (longest "
                          f"{gap_ms[worst]:.1f} ms at {gap_times[worst]:.2f} s"
                          + (f", target {target_ms:.1f} ms" if target_ms is not None else "") +
                          f") above; {len(steps)} engine steps below, {int(prompt.sum())} with prompt tokens, the one "
                          f"that made the longest gap starred ({ms[made]:.1f} ms).")
