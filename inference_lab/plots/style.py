"""The look every lesson figure shares: colours with a meaning, log axes with plain ticks,
a one-line description of each figure, and the small helpers that read records by attribute.

Colours carry meaning throughout: blue = prefill, vermillion = decode, grey = the roofline;
filled markers are measured, hollow ones predicted. Colours come from one colour-blind-safe
palette (Okabe-Ito), and no two series of a figure differ by colour alone: each pair also
differs by marker, line style, fill or hatching, so a figure reads in greyscale too
(tests/test_plot_accessibility.py checks every figure).

Every figure is a :class:`LabFigure`: ``fig.alt_text`` is a one-line description of what it
shows, with its numbers. Displayed in a notebook it goes into the output's metadata (the
``alt`` of its ``<img>`` on the static site); dashboards show it under the readout.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter
from matplotlib.transforms import Affine2D

from inference_lab.base import checks

# Okabe and Ito's colour-blind-safe palette ("Color Universal Design", 2008): eight colours that
# stay distinct under the common colour-vision deficiencies. Paired series also differ by marker
# or line style, so every figure still reads in greyscale.
OKABE_ITO = {"blue": "#0072B2", "vermillion": "#D55E00", "green": "#009E73", "orange": "#E69F00",
             "sky_blue": "#56B4E9", "purple": "#CC79A7", "yellow": "#F0E442", "black": "#000000"}
PREFILL_COLOR = OKABE_ITO["blue"]
DECODE_COLOR = OKABE_ITO["vermillion"]
ROOF_COLOR = "#4a4a4a"
# The serving modes the simulator compares: colour, marker and line style each differ.
MODE_STYLES = {
    "colocated": {"color": OKABE_ITO["vermillion"], "marker": "o", "linestyle": "-"},
    "chunked": {"color": OKABE_ITO["sky_blue"], "marker": "s", "linestyle": "--"},
    "disaggregated": {"color": OKABE_ITO["green"], "marker": "^", "linestyle": ":"},
}
# One marker and one line style per member of a family of series (batches, contexts, ...),
# so neighbours differ by shape as well as by shade.
MARKERS = "os^Dv<>PX*h"
LINESTYLES = ("--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)))
HATCH = "///"   # on the bars of the second phase (decode, memory) of a two-colour bar chart
GRID = dict(which="major", color="#dddddd", linewidth=0.8)
GRID_MINOR = dict(which="minor", color="#f0f0f0", linewidth=0.5)
DEVICE_MARKERS = "osD^vP*Xh<>"


class LabFigure(Figure):
    """A matplotlib Figure that carries ``alt_text``, a one-line description of what it shows.

    In IPython its display adds ``{"image/png": {"alt": alt_text}}`` to the output's metadata
    (the PNG itself comes from the inline backend as for any Figure), so the description is
    stored in the notebook with the image.
    """

    alt_text: str = ""

    def _repr_mimebundle_(self, include=None, exclude=None):
        if not self.alt_text:
            return None
        return {}, {"image/png": {"alt": self.alt_text}}


def alt_text(fig) -> str:
    """The one-line description of a figure: its ``alt_text``, else its titles, else ""."""
    text = getattr(fig, "alt_text", "") or ""
    if not text:
        titles = [fig.get_suptitle()] if hasattr(fig, "get_suptitle") else []
        titles += [ax.get_title() for ax in fig.axes]
        text = "; ".join(t for t in titles if t)
    return " ".join(str(text).split())


def describe(fig, text: str):
    """Set ``fig.alt_text`` to ``text`` on one line, give every short log axis readable ticks
    (:func:`label_short_log_axes`; every lesson figure ends here); returns the figure."""
    fig.alt_text = " ".join(text.split())
    label_short_log_axes(fig)
    return fig


def label_short_log_axes(fig) -> None:
    """Label the minor ticks (2 and 5 of each decade; every one on a span under 3x) of a log
    axis whose major ticks leave fewer than two labels in view: one decade label, or none, does
    not tell a reader the scale. On a CPU the lessons' ranges are often that short."""
    for ax in fig.axes:
        for axis, limits in ((ax.xaxis, ax.get_xlim), (ax.yaxis, ax.get_ylim)):
            lo, hi = sorted(limits())
            if axis.get_scale() != "log" or lo <= 0:
                continue
            majors = [v for v in axis.get_major_locator()() if lo <= v <= hi]
            if sum(bool(axis.get_major_formatter()(v)) for v in majors) >= 2:
                continue
            keep = range(1, 10) if hi / lo < 3 else (2, 5)

            def minor(v, _pos, keep=keep):
                mantissa = round(v / 10 ** math.floor(math.log10(v) + 1e-9))
                return si_label(v).replace(" ", "") if mantissa in keep else ""

            axis.set_minor_formatter(FuncFormatter(minor))


LEGEND_PLACES = ("upper left", "upper right", "lower right", "lower left", "center left", "center right",
                 "upper center", "lower center")


def legend_clear_of_data(ax, prefer: str = "upper left", **kwargs):
    """The legend of ``ax`` in the first place (``prefer``, then :data:`LEGEND_PLACES`) where it
    covers no line and no scatter point of the axes; outside the axes on the right when every
    place inside does.

    Measured data moves from machine to machine, so no fixed place is clear for every learner
    (05's legend sat on its two lines on one CPU)."""
    to_axes = ax.transData + ax.transAxes.inverted()
    data = [_densified(to_axes.transform(np.column_stack([np.asarray(line.get_xdata(orig=False), float),
                                                          np.asarray(line.get_ydata(orig=False), float)])))
            for line in ax.get_lines() if line.get_visible() and len(line.get_xdata(orig=False))]
    data += [to_axes.transform(np.asarray(c.get_offsets(), float)) for c in ax.collections
             if c.get_visible() and len(c.get_offsets())]
    for place in dict.fromkeys((prefer, *LEGEND_PLACES)):
        legend = ax.legend(loc=place, **kwargs)
        box = legend.get_window_extent().transformed(ax.transAxes.inverted())
        if not any(_inside(points, box) for points in data):
            return legend
    return ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kwargs)


def annotate_apart(ax, items, *, offset=(6, -12), fontsize: float = 8, gap: float = 1.5) -> list:
    """Label points so no two labels print over each other: ``items`` are ``(x, y, text)`` or
    ``(x, y, text, annotate_kwargs)`` (a colour, say). Call it once the panel is complete (limits,
    titles, legend): positions are taken from the laid-out figure.

    Each label starts ``offset`` points from its point; one that would overlap a label already
    placed (higher points first) moves down below it, with a thin line back to its point. Sizes
    are estimated from the font, so the layout is the same on every machine. Returns the
    annotations."""
    fig = ax.figure
    fig.draw_without_rendering()   # constrained layout moves the axes; place labels where they end up
    to_points = ax.transData + fig.dpi_scale_trans.inverted() + _POINTS_PER_INCH
    placed, out = [], []
    for x, y, text, *style in sorted(items, key=lambda it: -to_points.transform((it[0], it[1]))[1]):
        px, py = to_points.transform((x, y))
        lines = str(text).split("\n")
        width = 0.62 * fontsize * max(len(line) for line in lines)
        height = 1.3 * fontsize * len(lines)
        dx, dy = offset
        moved = True
        while moved:
            moved = False
            for (x0, y0, x1, y1) in placed:
                left, bottom = px + dx, py + dy
                if left < x1 and left + width > x0 and bottom < y1 and bottom + height > y0:
                    dy = y0 - gap - height - py
                    moved = True
        placed.append((px + dx, py + dy, px + dx + width, py + dy + height))
        line = dict(arrowstyle="-", lw=0.6, color="#888888") if dy != offset[1] else None
        label = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                            va="bottom", arrowprops=line, **(style[0] if style else {}))
        label.set_in_layout(False)   # else the layout would move the axes again, and the points under the labels
        out.append(label)
    return out


_POINTS_PER_INCH = Affine2D().scale(72.0)


def _densified(points, per_segment: int = 24):
    """Points along every segment of a line (in axes coordinates), so a segment that crosses a box
    between two markers counts as crossing it."""
    points = points[np.isfinite(points).all(axis=1)]
    if len(points) < 2:
        return points
    t = np.linspace(0.0, 1.0, per_segment, endpoint=False)[None, :, None]
    a, b = points[:-1, None, :], points[1:, None, :]
    return np.concatenate([(a + (b - a) * t).reshape(-1, 2), points[-1:]])


def _inside(points, box, margin: float = 0.005) -> bool:
    return bool(((points[:, 0] > box.x0 + margin) & (points[:, 0] < box.x1 - margin)
                 & (points[:, 1] > box.y0 + margin) & (points[:, 1] < box.y1 - margin)).any())


def shades(color, n: int) -> list:
    """``n`` shades of one colour, darker to lighter (a family of series of one meaning)."""
    rgb = np.array(to_rgb(color))
    out = []
    for w in (np.linspace(-0.3, 0.45, n) if n > 1 else [0.0]):
        shade = rgb * (1 + w) if w < 0 else rgb + (1 - rgb) * w
        out.append(tuple(np.clip(shade, 0, 1)))
    return out


def tint(color, weight: float = 0.25) -> tuple:
    """A light tint of a palette colour (``weight`` of the colour over white), for filled areas."""
    return tuple(1 - weight * (1 - c) for c in to_rgb(color))


def new_figure(ncols: int = 1, width: float = 7.0, height: float = 4.6):
    fig = LabFigure(figsize=(width, height), layout="constrained", dpi=110)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    for ax in axes:
        ax.set_axisbelow(True)
        ax.spines[["top", "right"]].set_visible(False)
    return fig, axes


def log_axes(ax, x=True, y=True):
    if x:
        ax.set_xscale("log")
    if y:
        ax.set_yscale("log")
    ax.grid(True, **GRID)
    ax.grid(True, **GRID_MINOR)


def plain_ticks(ax, axis="x"):
    """Log axis ticks written as plain numbers (1, 8, 64 rather than 10^0 ...)."""
    fmt = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}")
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_formatter(fmt)
    target.set_minor_formatter(NullFormatter())


def length_ticks(ax, lengths):
    """Ticks at the measured prompt lengths when there are few of them, plain numbers."""
    lengths = sorted(set(lengths))
    if 1 < len(lengths) <= 10:
        ax.set_xticks(lengths)
    plain_ticks(ax, "x")


def batch_ticks(ax, batches):
    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(b) for b in batches))
    if len(ticks) <= 12:
        ax.set_xticks(ticks)
    plain_ticks(ax, "x")


def amount(v: float) -> str:
    """Three significant digits, never in e-notation: 0.0123, 4.56, 789, 1,480."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def si_label(v: float) -> str:
    """1.2e12 -> '1.2 T' (value and SI prefix, for labels and ticks)."""
    for scale, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:,.3g} {p}"
    return f"{v:,.3g} "


def si_ticks(ax, axis="y"):
    """Log-axis ticks as 500, 2k, 40k, 1.5M. Minor ticks get labels only on short axes."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    lim = ax.get_ylim if axis == "y" else ax.get_xlim

    def major(v, _):
        return si_label(v).replace(" ", "")

    def minor(v, _):
        lo, hi = lim()
        if hi / max(lo, 1e-300) > 30:
            return ""
        mant = v / 10 ** math.floor(math.log10(v) + 1e-9)
        return major(v, _) if round(mant) in (2, 5) else ""

    target.set_major_formatter(FuncFormatter(major))
    target.set_minor_formatter(FuncFormatter(minor))


def flops_unit(peak: float):
    for scale, name in ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s")):
        if peak >= 3 * scale:
            return scale, name
    return 1e6, "MFLOP/s"


def is_decode(rec) -> bool:
    return getattr(rec, "step_seconds", None) is not None or getattr(rec, "phase", None) == "decode"


def is_prefill(rec) -> bool:
    return not is_decode(rec) and getattr(rec, "prompt_len", None) is not None \
        and getattr(rec, "seconds", None) is not None


def plain_text(text) -> str:
    """``text`` as matplotlib draws it literally: a ``$`` would start mathtext (and an
    unbalanced one raises when the figure is drawn), so each is escaped; control characters
    become spaces. For every label that comes from a file or a learner."""
    text = "".join(c if c.isprintable() else " " for c in str(text))
    return text.replace("$", r"\$")


def median_by(pairs):
    groups = defaultdict(list)
    for k, v in pairs:
        if v is not None:
            groups[k].append(float(v))
    keys = sorted(groups)
    return np.array(keys, dtype=float), np.array([np.median(groups[k]) for k in keys])


def as_records(records) -> list:
    records = list(records or [])
    for r in records:
        if not (is_decode(r) or is_prefill(r)):
            raise ValueError(
                f"record {r!r} is neither a PrefillRecord (prompt_len, seconds) nor a "
                "DecodeRecord (batch, step_seconds): pass measure.load_records(...) output"
            )
    return records


def prediction_args(recs, cfg, spec, name: str, kind: str):
    """A figure needs ``kind`` records, or ``cfg`` and ``spec`` (both) to draw a prediction."""
    if not recs and cfg is None:
        raise ValueError(f"{name} needs {kind} records or cfg= and spec= for a prediction")
    if (cfg is None) != (spec is None):
        raise ValueError("pass cfg= and spec= together (the prediction needs both)")


def peak_of(spec, dtype):
    checks.hardware_spec(spec)
    return spec.peak_flops(dtype)  # raises a clear ValueError for an unknown dtype


def palette(n):
    order = ["blue", "vermillion", "green", "orange", "sky_blue", "purple", "black", "yellow"]
    return [OKABE_ITO[order[i % len(order)]] for i in range(n)]
