"""The dashboard convention the notebooks and the browser tests rely on."""

import pytest

W = pytest.importorskip("ipywidgets")
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from inference_lab import widgets  # noqa: E402


def _view(batch, prompt_len):
    fig, ax = plt.subplots()
    ax.plot([1, 2], [batch, prompt_len])
    return fig, f"batch size {batch}, prompt length {prompt_len}: {batch * prompt_len} tokens"


def _find(widget, cls):
    found = [widget] if isinstance(widget, cls) else []
    for child in getattr(widget, "children", ()):
        found += _find(child, cls)
    return found


def test_dashboard_redraws_and_updates_the_readout():
    calls = []

    def view(batch, prompt_len):
        calls.append((batch, prompt_len))
        return _view(batch, prompt_len)

    board = widgets.dashboard(view, [widgets.Control("batch", "batch size", [1, 2, 4]),
                                     widgets.Control("prompt_len", "prompt length", [16, 64], 64)])
    sliders = _find(board, W.SelectionSlider)
    assert [s.description for s in sliders] == ["batch size", "prompt length"]
    (readout,) = [w for w in _find(board, W.HTML) if widgets.READOUT_CLASS in w._dom_classes]
    assert calls == [(1, 64)] and readout.value == "batch size 1, prompt length 64: 64 tokens"
    (output,) = _find(board, W.Output)
    assert output.outputs and "image/png" in output.outputs[0]["data"]
    sliders[0].value = 4
    assert calls[-1] == (4, 64) and readout.value.startswith("batch size 4")


def test_measure_again_remeasures_then_redraws_and_a_move_measures_nothing():
    data = {"round": 1}
    measured, calls = [], []

    def view(batch):
        calls.append(batch)
        return _view(batch, data["round"])

    def measure_again():
        measured.append(True)
        data["round"] += 1

    board = widgets.dashboard(view, [widgets.Control("batch", "batch size", [1, 2])], measure_again=measure_again)
    (slider,) = _find(board, W.SelectionSlider)
    (button,) = [b for b in _find(board, W.Button) if b.description == "measure again"]
    (readout,) = [w for w in _find(board, W.HTML) if widgets.READOUT_CLASS in w._dom_classes]
    slider.value = 2
    assert measured == [] and calls == [1, 2]
    button.click()
    assert measured == [True] and calls == [1, 2, 2] and readout.value.endswith("prompt length 2: 4 tokens")
    assert not slider.disabled and not button.disabled

    def failing():
        raise RuntimeError("the machine went away")

    board = widgets.dashboard(view, [widgets.Control("batch", "batch size", [1, 2])], measure_again=failing)
    (button,) = [b for b in _find(board, W.Button) if b.description == "measure again"]
    (readout,) = [w for w in _find(board, W.HTML) if widgets.READOUT_CLASS in w._dom_classes]
    button.click()
    assert "measuring again failed: RuntimeError: the machine went away" in readout.value and not button.disabled
    assert not [b for b in _find(widgets.dashboard(view, [widgets.Control("batch", "batch size", [1])]), W.Button)]


def test_a_failing_view_reports_in_the_readout():
    def sometimes(batch):
        if batch == 2:
            raise RuntimeError("out of memory")
        return _view(batch, 1)

    with pytest.raises(RuntimeError):  # a broken first draw fails the notebook cell loudly
        widgets.dashboard(sometimes, [widgets.Control("batch", "batch size", [2, 1])])
    board = widgets.dashboard(sometimes, [widgets.Control("batch", "batch size", [1, 2])])
    (slider,) = _find(board, W.SelectionSlider)
    (readout,) = [w for w in _find(board, W.HTML) if widgets.READOUT_CLASS in w._dom_classes]
    (output,) = _find(board, W.Output)
    assert output.outputs
    slider.value = 2  # a later bad point: said in the readout, old figure cleared, no exception
    assert "RuntimeError: out of memory" in readout.value and output.outputs == ()
    slider.value = 1
    assert readout.value.startswith("batch size 1") and output.outputs


def test_control_rejects_a_value_outside_its_options():
    with pytest.raises(ValueError, match="not among its options"):
        widgets.Control("batch", "batch size", [1, 2], 3).widget()


def test_quizzes_say_right_and_wrong():
    box = widgets.quiz("Which phase is bandwidth-bound?", ["prefill", "decode"], "decode", "one token per step")
    radio, button, feedback = box.children[1], box.children[2], box.children[3]
    radio.value = "prefill"
    button.click()
    assert "Not quite" in feedback.value
    radio.value = "decode"
    button.click()
    assert "Right" in feedback.value
    number = widgets.numeric_quiz("ridge?", 295.0, rel_tol=0.1)
    text, check = number.children[1].children
    feedback = number.children[2]
    text.value = 100
    check.click()
    assert "Too low" in feedback.value
    text.value = 300
    check.click()
    assert "Right" in feedback.value
    with pytest.raises(ValueError):
        widgets.quiz("q", ["a"], "b", "")


def test_the_caption_and_the_image_alt_say_what_the_figure_shows():
    from inference_lab import plots

    def view(batch):
        fig = plots.time_split_bars(1e-3 * batch, 5e-3)
        return fig, f"batch size {batch}"

    board = widgets.dashboard(view, [widgets.Control("batch", "batch size", [1, 8])])
    (output,) = _find(board, W.Output)
    (caption,) = [w for w in _find(board, W.HTML) if widgets.CAPTION_CLASS in w._dom_classes]
    alt = output.outputs[0]["metadata"]["image/png"]["alt"]
    assert alt.startswith("2 bars") and "compute 1 ms" in alt
    assert "Figure: 2 bars" in caption.value and "compute 1 ms" in caption.value
    (slider,) = _find(board, W.SelectionSlider)
    slider.value = 8
    assert "compute 8 ms" in output.outputs[0]["metadata"]["image/png"]["alt"]
    assert "compute 8 ms" in caption.value
    # A figure that says nothing about itself gets no caption (and no empty alt).
    plain = widgets.dashboard(lambda batch: _view(batch, 1), [widgets.Control("batch", "batch size", [1])])
    (caption,) = [w for w in _find(plain, W.HTML) if widgets.CAPTION_CLASS in w._dom_classes]
    assert caption.value == ""
def test_wrong_answers_explain_why():
    box = widgets.quiz("Which phase is bandwidth-bound?", ["prefill", "decode", "neither"], "decode", "one token per step",
                       why_not={"prefill": "prefill reuses each weight for every prompt token"}, hint="count FLOPs per byte")
    radio, button, feedback = box.children[1], box.children[2], box.children[3]
    radio.value = "prefill"
    button.click()
    assert "Not quite" in feedback.value and "reuses each weight" in feedback.value
    radio.value = "neither"
    button.click()
    assert "count FLOPs per byte" in feedback.value          # no specific reason: the hint
    with pytest.raises(ValueError, match="why_not"):
        widgets.quiz("q", ["a", "b"], "a", "", why_not={"a": "the answer cannot be wrong"})
    number = widgets.numeric_quiz("ridge?", 295.0, rel_tol=0.1, hint="divide FLOP/s by bytes/s")
    text, check = number.children[1].children
    text.value = 2950
    check.click()
    assert "Too high" in number.children[2].value and "10x" in number.children[2].value
    assert "divide FLOP/s" in number.children[2].value


def test_prediction_number_then_report():
    guess = widgets.prediction("prefill/decode ratio?", unit="x")
    assert isinstance(guess, W.VBox) and guess.value is None
    report = str(guess.report(12.0, roofline=7.8, what="ratio:"))
    assert report.startswith("ratio:\nyour prediction  -") and "roofline" in report and "measured here" in report
    assert "no prediction was locked in for this run" in report
    # Stored in a notebook with no prediction locked in, the answer is folded under the empty prediction.
    page = guess.report(12.0, roofline=7.8)._repr_html_()
    head, folded = page.split("<details>")
    assert "your prediction" in head and "12 x" not in head and "7.8 x" not in head
    assert "12 x" in folded and "Show the measurement" in folded and "prefill/decode ratio?" in folded
    (box,) = _find(guess, W.FloatText)
    (button,) = _find(guess, W.Button)
    box.value = 30.0
    assert guess.value is None                   # nothing counts until it is locked in
    button.click()
    assert guess.value == 30.0
    box.value = 5.0                              # changing the box later does not move the locked value
    assert "<details>" not in guess.report(12.0)._repr_html_()   # locked in: nothing left to hide
    report = str(guess.report(12.0, roofline=7.8))
    assert "30 x" in report and "7.8 x" in report and "12 x" in report
    assert "within 2.5x" in report and "what did it leave out" in report


def test_prediction_ranges():
    guess = widgets.prediction("knee?", ranges=[("2", 2, 3), ("3 to 8", 3, 9), ("9 or more", 9, float("inf"))])
    (radio,) = _find(guess, W.RadioButtons)
    (button,) = _find(guess, W.Button)
    button.click()
    assert guess.value is None                   # nothing picked: nothing locked
    radio.value = "3 to 8"
    button.click()
    assert guess.value == "3 to 8"
    assert "your range holds the measurement" in str(guess.report(4))
    miss = str(guess.report(2))
    assert "fell in '2'" in miss and "why?" in miss
    with pytest.raises(ValueError, match="low < high"):
        widgets.prediction("q", ranges=[("bad", 5, 1)])


def test_the_buttons_meet_wcag_aa_contrast():
    """Issue 26: white on JupyterLab's orange (2.7:1) and teal (3.5:1) was below AA's 4.5:1."""
    from inference_lab import widgets

    assert widgets.contrast("#ffffff", "#ff9800") < 3.0 and widgets.contrast("#000000", "#ffffff") == pytest.approx(21)
    for color in (widgets.CHECK_COLOR, widgets.LOCK_COLOR):
        assert widgets.contrast(widgets.TEXT_COLOR, color) >= 4.5
    quiz = widgets.quiz("q?", ["a", "b"], "a", "because")
    buttons = [w for w in _walk(quiz) if isinstance(w, __import__("ipywidgets").Button)]
    assert buttons and all(b.style.button_color == widgets.CHECK_COLOR and b.style.text_color == "#ffffff"
                           for b in buttons)


def _walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _walk(child)
