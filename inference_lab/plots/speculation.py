"""Figures of speculative decoding: its speed-up over the number of guesses, and what a verify
step costs as the batch grows."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from inference_lab.plots.style import (DECODE_COLOR, GRID, PREFILL_COLOR, ROOF_COLOR, batch_ticks, describe,
                                       legend_clear_of_data, new_figure)


def speedup_over_k(ks: Sequence[int], measured: Sequence[float], predicted: Sequence[float], *, draft: str,
                   highlight: int | None = None, predicted_label: str = "predicted (cost model)") -> Figure:
    """Speed-up over plain decode against ``k`` (guesses per round) for one draft: measured
    points and the cost model's line, with 1x (no gain) drawn."""
    ks, m, p = (np.asarray(a, float) for a in (ks, measured, predicted))
    if not (len(ks) == len(m) == len(p) >= 2):
        raise ValueError("speedup_over_k needs one measured and one predicted speed-up per k, at least two")
    fig, (ax,) = new_figure(width=7.0, height=4.0)
    ax.plot(ks, p, "s--", color=ROOF_COLOR, ms=5, lw=1.2, label=predicted_label)
    ax.plot(ks, m, "o-", color=DECODE_COLOR, ms=6, lw=1.5, label="measured here")
    ax.axhline(1.0, color="black", lw=0.8, ls=":", label="1x: plain decode")
    if highlight is not None and highlight in ks:
        i = int(np.flatnonzero(ks == highlight)[0])
        ax.plot([ks[i]], [m[i]], "o", ms=13, mfc="none", mec="black", mew=1.5, label=f"k = {highlight}")
    ax.set_xticks(ks)
    ax.set_ylim(0, max(1.2, float(np.nanmax(np.r_[m, p])) * 1.15))
    ax.grid(True, **GRID)
    ax.set_xlabel("k: guesses per round")
    ax.set_ylabel("tokens/s over plain decode's")
    ax.set_title(f"Speculative decoding, draft: {draft}")
    legend_clear_of_data(ax, "lower right", fontsize=8, frameon=False)
    best = int(ks[int(np.nanargmax(m))])
    return describe(fig, f"Speed-up over plain decode for the {draft} draft at k = {int(ks[0])} to {int(ks[-1])}: "
                          f"measured x{np.nanmin(m):.2f} to x{np.nanmax(m):.2f} (circles, best at k = {best}); "
                          f"the cost model predicted x{p.min():.2f} to x{p.max():.2f} (squares, dashed).")


def verify_cost_over_batch(batches: Sequence[int], measured: Sequence[float], predicted: Sequence[float], *,
                           k: int, highlight: int | None = None, where: str = "here") -> Figure:
    """A verify of ``k + 1`` tokens per row, in decode steps' time, against the batch: measured
    and on the roofline, with 1 (free guesses) and ``k + 1`` (a step per token) drawn."""
    b, m, p = (np.asarray(a, float) for a in (batches, measured, predicted))
    if not (len(b) == len(m) == len(p) >= 2):
        raise ValueError("verify_cost_over_batch needs one measured and one predicted ratio per batch, at least two")
    fig, (ax,) = new_figure(width=7.0, height=4.0)
    ax.axhline(1.0, color="black", lw=0.8, ls=":", label="1: checking the guesses is free")
    ax.axhline(k + 1, color=PREFILL_COLOR, lw=1.0, ls="-.", label=f"{k + 1}: each token costs a step")
    ax.plot(b, p, "s--", color=ROOF_COLOR, ms=5, lw=1.2, label="roofline, this machine's ceilings")
    ax.plot(b, m, "o-", color=DECODE_COLOR, ms=6, lw=1.5, label=f"measured {where}")
    if highlight is not None and highlight in b:
        i = int(np.flatnonzero(b == highlight)[0])
        ax.plot([b[i]], [m[i]], "o", ms=13, mfc="none", mec="black", mew=1.5, label=f"batch {highlight}")
    ax.set_xscale("log", base=2)
    batch_ticks(ax, [int(x) for x in b])
    ax.set_ylim(0, k + 1.6)
    ax.grid(True, **GRID)
    ax.set_xlabel("batch size")
    ax.set_ylabel(f"verify of {k + 1} tokens / one decode step")
    ax.set_title(f"What checking {k} guesses costs, batch by batch")
    legend_clear_of_data(ax, "upper left", fontsize=8, frameon=False)
    return describe(fig, f"A verify of {k + 1} tokens per row costs x{m[0]:.2f} a decode step at batch {int(b[0])} "
                          f"and x{m[-1]:.2f} at batch {int(b[-1])} measured (circles); the roofline says x{p[0]:.2f} "
                          f"and x{p[-1]:.2f} (squares, dashed); {k + 1} would be a step per token.")
