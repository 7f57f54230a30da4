"""Weights in fewer bytes: decode throughput over the batch for each stored format (notebook 11)."""

from __future__ import annotations

from typing import Sequence

from matplotlib.figure import Figure

from inference_lab.plots.style import (GRID, OKABE_ITO, batch_ticks, describe, legend_clear_of_data, new_figure,
                                       si_ticks)

# One colour, marker and line style per stored format (the measured names map onto them).
FORMAT_STYLES = {
    "float32": {"color": OKABE_ITO["vermillion"], "marker": "o", "linestyle": "-"},
    "bfloat16": {"color": OKABE_ITO["vermillion"], "marker": "o", "linestyle": "-"},
    "int8": {"color": OKABE_ITO["blue"], "marker": "s", "linestyle": "--"},
    "int4 g32": {"color": OKABE_ITO["green"], "marker": "^", "linestyle": ":"},
    "int4 g128": {"color": OKABE_ITO["orange"], "marker": "D", "linestyle": "-."},
    "int8, weight-only": {"color": OKABE_ITO["sky_blue"], "marker": "v", "linestyle": "none"},
    "int8 x int8": {"color": OKABE_ITO["blue"], "marker": "s", "linestyle": "none"},
}


def quantization_plot(predicted: Sequence[dict], measured: Sequence[dict] = (), *, mark_batch: int | None = None,
                      title: str | None = None) -> Figure:
    """Decode tokens/s against the batch, one series per weight format: ``predicted`` rows
    (``format``, ``batch``, ``decode_tokens_per_s``) as hollow markers on lines (the roofline),
    ``measured`` rows the same, filled and larger. ``mark_batch``: a vertical line at that batch."""
    if not predicted:
        raise ValueError("quantization_plot needs predicted rows: {'format', 'batch', 'decode_tokens_per_s'}")
    fig, (ax,) = new_figure(1, width=8.0, height=4.6)
    notes = []
    names = list(dict.fromkeys(r["format"] for r in predicted)) + list(dict.fromkeys(r["format"] for r in measured))
    for name in dict.fromkeys(names):
        st = FORMAT_STYLES.get(name, {"color": "#4a4a4a", "marker": "X", "linestyle": "-"})
        line = sorted((r for r in predicted if r["format"] == name), key=lambda r: r["batch"])
        dots = sorted((r for r in measured if r["format"] == name), key=lambda r: r["batch"])
        if line:
            ax.plot([r["batch"] for r in line], [r["decode_tokens_per_s"] for r in line], color=st["color"],
                    marker=st["marker"], ls=st["linestyle"] if st["linestyle"] != "none" else "-", lw=1.4, ms=5,
                    mfc="white", label=f"{name}, roofline")
            notes.append(f"{name} roofline {line[0]['decode_tokens_per_s']:,.0f} tok/s at batch {line[0]['batch']}")
        if dots:
            ax.plot([r["batch"] for r in dots], [r["decode_tokens_per_s"] for r in dots], color=st["color"],
                    marker=st["marker"], ls="none", ms=10, label=f"{name}, measured")
            notes.append(f"{name} measured {dots[0]['decode_tokens_per_s']:,.0f} tok/s at batch {dots[0]['batch']}")
    if mark_batch is not None:
        ax.axvline(mark_batch, color="#888888", lw=0.8, ls=(0, (2, 2)))
    batch_ticks(ax, [r["batch"] for r in predicted] + [r["batch"] for r in measured])
    ax.set_yscale("log")
    si_ticks(ax, "y")
    ax.grid(**GRID)
    ax.set_xlabel("decode batch (sequences per step)")
    ax.set_ylabel("decode tokens/s (whole batch)")
    legend_clear_of_data(ax, fontsize=7, frameon=False)
    fig.suptitle(title or "Fewer bytes per weight: decode throughput over the batch")
    return describe(fig, "Decode tokens per second against the batch on log axes, one series per weight format "
                         "(float vermillion circles, int8 blue squares, int4 green triangles and orange "
                         "diamonds), the roofline hollow on lines, this run filled: " + "; ".join(notes) + ".")
