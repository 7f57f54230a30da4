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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import ipywidgets as W
import matplotlib.pyplot as plt
from IPython.display import Image

from inference_lab.plots._style import alt_text

READOUT_CLASS = "inference-lab-readout"
CAPTION_CLASS = "inference-lab-caption"


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
            layout=W.Layout(width="420px"),
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


def dashboard(compute: Callable, controls: Sequence[Control], *, title: str | None = None) -> W.VBox:
    """Sliders + a readout + a figure and its caption, redrawn by ``compute(**values) -> (figure,
    readout)``; the caption is the figure's one-line description (``alt_text``).

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
        caption.value = (f'<span style="color:#555;font-size:0.9em">Figure: {html.escape(image.alt)}</span>'
                         if image.alt else "")
        readout.value = html.escape(text)

    for slider in sliders.values():
        slider.observe(redraw, names="value")
    redraw(first=True)
    children = [W.HBox(list(sliders.values())), readout, output, caption]
    if title:
        children.insert(0, W.HTML(f"<b>{html.escape(title)}</b>"))
    return W.VBox(children)


def _format_values(controls, values) -> str:
    return ", ".join(f"{c.description} {values[c.name]}" for c in controls)


# Check-yourself questions with an automatic check.

def quiz(question: str, options: Sequence[str], answer: str, explanation: str) -> W.VBox:
    """A multiple-choice question: pick, press "check", read right/wrong and why."""
    if answer not in options:
        raise ValueError(f"quiz answer={answer!r} must be one of the options {list(options)}")
    choice = W.RadioButtons(options=list(options), value=None, layout=W.Layout(width="auto"))
    button = W.Button(description="check", button_style="info")
    feedback = W.HTML()

    def check(_):
        if choice.value is None:
            feedback.value = "Pick an answer first."
        elif choice.value == answer:
            feedback.value = "<b style='color:#1a7f37'>Right.</b> " + html.escape(explanation)
        else:
            feedback.value = ("<b style='color:#b42318'>Not quite.</b> Think again, or open the "
                              "answer below the question.")

    button.on_click(check)
    return W.VBox([W.HTML(f"<b>{html.escape(question)}</b>"), choice, button, feedback])


def numeric_quiz(question: str, answer: float, *, rel_tol: float = 0.15, unit: str = "",
                 explanation: str = "") -> W.VBox:
    """A question whose answer is a number; within ``rel_tol`` of ``answer`` counts as right."""
    if not math.isfinite(answer):
        raise ValueError(f"numeric_quiz answer={answer!r} must be a finite number")
    box = W.FloatText(description="your answer", style={"description_width": "initial"})
    button = W.Button(description="check", button_style="info")
    feedback = W.HTML()

    def check(_):
        guess = box.value
        if math.isclose(guess, answer, rel_tol=rel_tol):
            feedback.value = (f"<b style='color:#1a7f37'>Right:</b> {answer:,.4g} {html.escape(unit)}. "
                              + html.escape(explanation))
        else:
            direction = "high" if guess > answer else "low"
            feedback.value = f"<b style='color:#b42318'>Too {direction}.</b> Try again."

    button.on_click(check)
    return W.VBox([W.HTML(f"<b>{html.escape(question)}</b>"), W.HBox([box, button]), feedback])
