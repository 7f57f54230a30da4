"""ipywidgets dashboards for the notebooks.

A dashboard is a plain function plus sliders: ``compute(**values)`` returns a matplotlib
figure and a one-line readout, and :func:`dashboard` redraws both whenever a slider moves.
The same plain function is what a neighbouring notebook cell calls at fixed values to
``assert`` the lesson's claim, so the widget and the test share one code path.

Conventions the browser tests rely on (docs/architecture.md): sliders carry the descriptions
``"batch size"`` / ``"prompt length"``; the readout is a widget with the CSS class
``inference-lab-readout``; figures are PNG images. Under the figure, a caption (CSS class
``inference-lab-caption``) says in one line what the figure shows (the figure's ``alt_text``,
see :mod:`inference_lab.plots`); the same text is the image's ``alt`` in the stored output.

This module imports ipywidgets, so it is imported only by notebooks (the GPU image has none).
"""

from __future__ import annotations

import html
import io
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import ipywidgets as W
import matplotlib.pyplot as plt
from IPython.display import Image

from inference_lab.plots.style import alt_text

READOUT_CLASS = "inference-lab-readout"
CAPTION_CLASS = "inference-lab-caption"
# What each of the lab's widgets is, stored with its state: the static site (scripts/build_site.py)
# draws a stored dashboard, quiz or prediction as a picture and text, not as dead controls.
DASHBOARD_CLASS = "inference-lab-dashboard"
QUIZ_CLASS = "inference-lab-quiz"
PREDICTION_CLASS = "inference-lab-prediction"


@dataclass(frozen=True)
class Control:
    """One slider: ``name`` is the keyword passed to ``compute``; ``description`` is what the
    learner (and the browser test) reads next to it; ``options`` are the allowed values."""

    name: str
    description: str
    options: Sequence
    value: object = None

    def widget(self) -> W.SelectionSlider:
        options = list(self.options)
        if not options:
            raise ValueError(f"Control {self.description!r} needs at least one option")
        value = options[0] if self.value is None else self.value
        if value not in options:
            raise ValueError(f"Control {self.description!r}: value={value!r} is not among its options {options}")
        return W.SelectionSlider(
            options=options, value=value, description=self.description,
            continuous_update=False, style={"description_width": "initial"},
            # Grows to 420 px, shrinks to 240 (a fixed width collapsed to a bare handle in a
            # narrow window); the dashboard's row wraps, so two sliders stack when they must.
            layout=W.Layout(flex="1 1 320px", min_width="240px", max_width="420px"),
        )


def figure_png(fig) -> bytes:
    """The figure as PNG bytes (PNG, never SVG: nbval's strict mode cannot compare SVG).
    The figure is closed; read ``alt_text(fig)`` first if you need its description."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def figure_image(fig) -> Image:
    """The figure as a PNG display object whose output metadata carries the figure's one-line
    description as ``alt`` (the static site's ``<img alt>``)."""
    description = alt_text(fig)
    return Image(figure_png(fig), alt=description or None)


# Button colours behind white text at WCAG AA contrast (>= 4.5:1; JupyterLab's own "info" teal and
# "warning" orange give 3.5:1 and 2.7:1). tests/test_widgets.py computes the ratios.
CHECK_COLOR = "#0b5563"   # dark teal
LOCK_COLOR = "#9c4400"    # dark orange
TEXT_COLOR = "#ffffff"


def _button(description: str, color: str) -> W.Button:
    return W.Button(description=description, style={"button_color": color, "text_color": TEXT_COLOR})


def contrast(foreground: str, background: str) -> float:
    """The WCAG 2 contrast ratio of two ``#rrggbb`` colours (1 to 21)."""
    def luminance(hex_color):
        rgb = [int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((luminance(foreground), luminance(background)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def dashboard(compute: Callable, controls: Sequence[Control], *, title: str | None = None,
              measure_again: Callable | None = None) -> W.VBox:
    """Sliders + a readout + a figure and its caption, redrawn by ``compute(**values) -> (figure,
    readout)``; the caption is the figure's one-line description (``alt_text``).

    ``compute`` should draw from data measured beforehand (every slider position), so a move
    redraws at once and two visits to one position agree. ``measure_again``: a button that calls
    it (it re-measures the data ``compute`` reads; its progress bar shows under the button), then
    redraws; the sliders and the button are disabled meanwhile, so no move queues behind it.

    The first draw happens before this returns, so a notebook that is run top to bottom (or
    under nbval) shows a figure without anyone touching a slider.
    """
    sliders = {c.name: c.widget() for c in controls}
    readout = W.HTML(layout=W.Layout(margin="4px 0 4px 0"))
    readout.add_class(READOUT_CLASS)
    output = W.Output()
    caption = W.HTML(layout=W.Layout(margin="0 0 4px 0"))
    caption.add_class(CAPTION_CLASS)

    def redraw(_change=None, *, first=False):
        values = {name: slider.value for name, slider in sliders.items()}
        readout.value = "<i>measuring " + html.escape(_format_values(controls, values)) + " ...</i>"
        try:
            fig, text = compute(**values)
        except Exception as e:
            # Keep the dashboard alive after a bad point (an out-of-memory batch, say): say what
            # failed in the readout. The first draw re-raises, so a broken lesson fails loudly.
            readout.value = html.escape(f"{_format_values(controls, values)}: {type(e).__name__}: {e}")
            output.outputs = ()
            caption.value = ""
            if first:
                raise
            return
        # Replacing the outputs (rather than printing inside `with output`) works in a kernel
        # and outside one, so the tests see exactly what the learner sees.
        output.outputs = ()
        image = figure_image(fig)
        output.append_display_data(image)
        caption.value = (f'<span style="color:#555">Figure: {html.escape(image.alt)}</span>'
                         if image.alt else "")
        readout.value = html.escape(text)

    for slider in sliders.values():
        slider.observe(redraw, names="value")
    redraw(first=True)
    row = list(sliders.values())
    if measure_again is not None:
        button = _button("measure again", CHECK_COLOR)
        busy = W.Output()

        def again(_):
            controls_now = [*sliders.values(), button]
            for w in controls_now:
                w.disabled = True
            readout.value = "<i>measuring again ...</i>"
            failure = None
            try:
                with busy:   # its progress bar draws here; an Output swallows exceptions in a kernel
                    try:
                        measure_again()
                    except Exception as e:  # noqa: BLE001 - said in the readout, the dashboard lives on
                        failure = e
                if failure is None:
                    redraw()
                else:
                    readout.value = html.escape(f"measuring again failed: {type(failure).__name__}: {failure}")
            finally:
                for w in controls_now:
                    w.disabled = False

        button.on_click(again)
        row.append(button)
    children = [W.HBox(row, layout=W.Layout(flex_flow="row wrap")), readout, output, caption]
    if measure_again is not None:
        children.insert(2, busy)
    if title:
        children.insert(0, W.HTML(f"<b>{html.escape(title)}</b>"))
    board = W.VBox(children)
    board.add_class(DASHBOARD_CLASS)
    return board


def _format_values(controls, values) -> str:
    return ", ".join(f"{c.description} {values[c.name]}" for c in controls)


# Check-yourself questions with an automatic check.

RIGHT = "<b style='color:#1a7f37'>Right.</b> "
WRONG = "<b style='color:#b42318'>Not quite.</b> "


def quiz(question: str, options: Sequence[str], answer: str, explanation: str, *,
         why_not: dict | None = None, hint: str = "") -> W.VBox:
    """A multiple-choice question: pick, press "check", read right/wrong and why.

    A wrong pick shows ``why_not[option]`` (why that option is wrong: the feedback explains,
    it does not just say "no"), else ``hint``; a right pick shows ``explanation``.
    """
    if answer not in options:
        raise ValueError(f"quiz answer={answer!r} must be one of the options {list(options)}")
    why_not = dict(why_not or {})
    unknown = set(why_not) - set(options)
    if unknown or answer in why_not:
        raise ValueError(f"quiz why_not keys must be wrong options; got {sorted(unknown | ({answer} & set(why_not)))}")
    choice = W.RadioButtons(options=list(options), value=None, layout=W.Layout(width="auto"))
    button = _button("check", CHECK_COLOR)
    feedback = W.HTML()

    def check(_):
        if choice.value is None:
            feedback.value = "Pick an answer first."
        elif choice.value == answer:
            feedback.value = RIGHT + html.escape(explanation)
        else:
            reason = why_not.get(choice.value) or hint or "Work it out from the numbers in the question, then try again."
            feedback.value = WRONG + html.escape(reason)

    button.on_click(check)
    return W.VBox([W.HTML(f"<b>{html.escape(question)}</b>"), choice, button, feedback]).add_class(QUIZ_CLASS)


def numeric_quiz(question: str, answer: float, *, rel_tol: float = 0.15, unit: str = "",
                 explanation: str = "", hint: str = "") -> W.VBox:
    """A question whose answer is a number; within ``rel_tol`` of ``answer`` counts as right.
    A wrong answer says too high or too low, by how much, and shows ``hint`` (how to get it)."""
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real) or not math.isfinite(answer):
        raise ValueError(f"numeric_quiz answer={answer!r} must be a finite number")
    if isinstance(rel_tol, bool) or not isinstance(rel_tol, numbers.Real) or not 0 < rel_tol < 1:
        raise ValueError(f"numeric_quiz rel_tol={rel_tol!r} must be in (0, 1), e.g. 0.15 for within 15%")
    box = W.FloatText(description="your answer", style={"description_width": "initial"})
    button = _button("check", CHECK_COLOR)
    feedback = W.HTML()

    def check(_):
        guess = box.value
        if math.isclose(guess, answer, rel_tol=rel_tol):
            feedback.value = (f"<b style='color:#1a7f37'>Right:</b> {answer:,.4g} {html.escape(unit)}. "
                              + html.escape(explanation))
        else:
            direction = "high" if guess > answer else "low"
            off = f" (off by about {_factor(guess, answer)})" if guess and answer and guess * answer > 0 else ""
            feedback.value = (f"<b style='color:#b42318'>Too {direction}{off}.</b> "
                              + html.escape(hint or "Try again."))

    button.on_click(check)
    return W.VBox([W.HTML(f"<b>{html.escape(question)}</b>"), W.HBox([box, button]), feedback]).add_class(QUIZ_CLASS)


def _factor(guess: float, answer: float) -> str:
    f = max(guess / answer, answer / guess)
    return f"{f:,.1f}x" if f < 10 else f"{f:,.0f}x"


# Predict, then measure.

class Prediction(W.VBox):
    """What the learner expects, written down before a measurement (see :func:`prediction`).

    ``value``: the number entered (``None`` until "lock in" is pressed), or the chosen range's
    label when the prediction has ``ranges``. :meth:`report` puts it beside the roofline and
    the measurement, once they exist.
    """

    def __init__(self, question: str, *, unit: str = "", ranges: Sequence[tuple] | None = None):
        self.question, self.unit = question, unit
        self.ranges = [tuple(r) for r in ranges] if ranges else None
        if self.ranges:
            for r in self.ranges:
                if len(r) != 3 or not r[1] < r[2]:
                    raise ValueError(f"prediction range {r!r} must be (label, low, high) with low < high")
            self._input = W.RadioButtons(options=[r[0] for r in self.ranges], value=None,
                                         layout=W.Layout(width="auto"))
        else:
            self._input = W.FloatText(description="your prediction", style={"description_width": "initial"})
        self._button = _button("lock in", LOCK_COLOR)
        self._status = W.HTML("<i>No prediction yet: write one down before running the next cell.</i>")
        self._locked = None
        self._button.on_click(self._lock)
        controls = [self._input, self._button] if self.ranges else [W.HBox([self._input, self._button])]
        super().__init__([W.HTML(f"<b>Predict:</b> {html.escape(question)}"), *controls, self._status])
        self.add_class(PREDICTION_CLASS)

    def _lock(self, _=None):
        value = self._input.value
        if value is None:
            self._status.value = "Pick a range first."
            return
        self._locked = value
        shown = value if self.ranges else f"{value:,.4g} {self.unit}".strip()
        self._status.value = f"Locked in: <b>{html.escape(str(shown))}</b>. Now run the measurement."

    @property
    def value(self):
        return self._locked

    def _range_of(self, x: float):
        for label, lo, hi in self.ranges or ():
            if lo <= x < hi:
                return label
        return None

    def report(self, measured: float, *, roofline: float | None = None, what: str = "") -> "PredictionReport":
        """A small table: the prediction, the roofline's figure (if any) and the measurement,
        then one line on how the prediction did. Shown as a cell's result (or ``display``ed), it
        keeps the measurement folded until opened when no prediction was locked in, so a reader
        of the stored notebook (or the site) meets the question before the answer; ``str()`` of
        it is the whole table."""
        unit = f" {self.unit}" if self.unit else ""
        fmt = lambda x: f"{x:,.3g}{unit}"
        rows = [("your prediction", "-" if self.value is None else
                 (str(self.value) if self.ranges else fmt(self.value)))]
        if roofline is not None:
            rows.append(("roofline", fmt(roofline)))
        rows.append(("measured here", fmt(measured) + (f"  ({self._range_of(measured)})" if self.ranges else "")))
        width = max(len(r[0]) for r in rows) + 2
        lines = [f"{name:<{width}}{value}" for name, value in rows]
        if self.value is None:
            lines.append("(no prediction was locked in for this run: in the notebook, lock yours in before you measure)")
        elif self.ranges:
            hit = self._range_of(measured) == self.value
            lines.append("your range holds the measurement" if hit else
                         f"the measurement fell in {self._range_of(measured)!r}, not {self.value!r}: why?")
        elif self.value > 0 and measured > 0:
            off = max(self.value / measured, measured / self.value)
            lines.append(f"your prediction is within {off:,.2g}x of the measurement"
                         + ("" if off <= 2 else ": what did it leave out?"))
        return PredictionReport(self.question, what, lines, locked=self.value is not None)


@dataclass(frozen=True)
class PredictionReport:
    """What :meth:`Prediction.report` returns: the question, then the table. Its text is the whole
    table; its HTML folds everything below "your prediction" into a ``<details>`` when nothing was
    locked in, so the stored answer does not sit in plain view under an empty prediction box."""

    question: str
    what: str
    lines: list
    locked: bool

    def __str__(self) -> str:
        return "\n".join(([self.what] if self.what else []) + list(self.lines))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        pre = '<pre style="margin:0">{}</pre>'
        head = ([self.what] if self.what else []) + list(self.lines[:1])
        body = html.escape("\n".join(self.lines[1:]))
        if self.locked:
            return pre.format(html.escape("\n".join(head)) + "\n" + body)
        return (pre.format(html.escape("\n".join(head)))
                + f"<details><summary><b>Show the measurement</b> (first write down your answer to: "
                  f"{html.escape(self.question)})</summary>{pre.format(body)}</details>")


def prediction(question: str, *, unit: str = "", ranges: Sequence[tuple] | None = None) -> Prediction:
    """A prediction box for just before a measurement: a number (or, with ``ranges`` given as
    ``(label, low, high)`` tuples, one range) and a "lock in" button. The measurement cell
    then prints ``guess.report(measured, roofline=...)``: prediction, roofline and
    measurement side by side. Nothing is graded: the point is to commit before you look."""
    return Prediction(question, unit=unit, ranges=ranges)
