"""Figures of one answer being written: when each token appeared, and what the KV cache saves."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from inference_lab.plots.style import (DECODE_COLOR, GRID, HATCH, PREFILL_COLOR, describe, legend_clear_of_data,
                                       new_figure)


def token_timeline(seconds: Sequence[float], *, title: str | None = None) -> Figure:
    """Left: each token of one streamed answer as a tick at the moment it appeared (the first
    one's time is the TTFT). Right: the gap before each later token (the inter-token latency)."""
    t = np.asarray(seconds, float) * 1e3
    if t.ndim != 1 or len(t) < 2 or not np.all(np.isfinite(t)):
        raise ValueError("token_timeline needs the times (s) of at least two tokens")
    gaps = np.diff(t)
    fig, (left, right) = new_figure(2, width=11.0, height=3.4)
    left.axvspan(0, t[0], color=PREFILL_COLOR, alpha=0.25, hatch=HATCH, label=f"prefill: TTFT {t[0]:,.0f} ms")
    left.plot(t, np.zeros_like(t), "|", color=DECODE_COLOR, ms=18, mew=1.5, label="a token appears")
    left.set_yticks([])
    left.set_xlabel("time since the request arrived (ms)")
    left.set_title("One answer, token by token")
    legend_clear_of_data(left, "upper right", fontsize=8, frameon=False)
    idx = np.arange(2, len(t) + 1)
    right.plot(idx, gaps, "o", color=DECODE_COLOR, ms=4, label="gap before this token")
    right.axhline(np.median(gaps), color="black", ls="--", lw=1, label=f"median {np.median(gaps):,.1f} ms")
    right.set_ylim(bottom=0)
    right.grid(True, **GRID)
    right.set_xlabel("token number")
    right.set_ylabel("inter-token latency (ms)")
    right.set_title("The gaps between tokens")
    legend_clear_of_data(right, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    return describe(fig, f"Timeline of one streamed answer of {len(t)} tokens: the first appeared after "
                          f"{t[0]:,.0f} ms (TTFT, shaded), the rest {np.median(gaps):,.1f} ms apart at the median "
                          f"(max {gaps.max():,.1f} ms), plotted token by token on the right.")


def cache_vs_recompute(lengths: Sequence[int], uncached_s: Sequence[float], cached_s: Sequence[float], *,
                       title: str | None = None) -> Figure:
    """Step time against the tokens in the text so far: recomputing the whole prefix at every
    step (no cache: grows with the length) against one decode step with the KV cache (flat)."""
    n = np.asarray(lengths, float)
    un, ca = np.asarray(uncached_s, float) * 1e3, np.asarray(cached_s, float) * 1e3
    if not (len(n) == len(un) == len(ca) >= 2):
        raise ValueError("cache_vs_recompute needs one uncached and one cached step time per length, at least two")
    fig, (ax,) = new_figure(width=7.5, height=4.2)
    ax.plot(n, un, "o-", color=PREFILL_COLOR, ms=4, lw=1, label="no cache: the whole text again each step")
    ax.plot(n, ca, "^--", color=DECODE_COLOR, ms=4, lw=1, label="KV cache: one new token per step")
    ax.set_ylim(bottom=0)
    ax.grid(True, **GRID)
    ax.set_xlabel("tokens in the text so far")
    ax.set_ylabel("time of one step (ms)")
    ax.set_title(title or "Same answer, two ways: what the KV cache saves")
    legend_clear_of_data(ax, "upper left", fontsize=8, frameon=False)
    return describe(fig, f"Step time against text length from {int(n[0])} to {int(n[-1])} tokens: without a cache "
                          f"it grows from {un[0]:,.2f} to {un[-1]:,.2f} ms (circles, solid); with the KV cache it "
                          f"stays near {np.median(ca):,.2f} ms (triangles, dashed).")
