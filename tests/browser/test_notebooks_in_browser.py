"""The curriculum in a real browser: JupyterLab in headless Chromium, driven as a learner would.

nbval proves each cell runs in a kernel; this proves what a learner sees. Notebooks 00, 01
and 05 are run end to end from the Run menu; then the dashboard's "batch size" or "prompt
length" slider is moved with the keyboard, and its figure must redraw (the <img> changes)
and its `inference-lab-readout` text must show the new value. The other five notebooks are
opened without running: their stored outputs must show a figure and no error.

The same checks run on tests/browser/fixtures/, so the harness is proven without the
lessons; a missing lesson notebook FAILS (the notebooks are the product).

Fixtures (server, browser, screenshots on failure) live in conftest.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip(
    "playwright.sync_api",
    reason="playwright is not installed: pip install playwright (the dev extra), and "
    "apt-get install chromium for the browser; never `playwright install`",
)

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# The fixed list of lessons (docs/architecture.md): three run end to end, six opened.
RUN_END_TO_END = ["00_setup_check", "01_one_model_two_speeds", "05_batching"]
OPEN_ONLY = [
    "02_prefill_is_compute_bound",
    "03_decode_is_bandwidth_bound",
    "04_arithmetic_intensity",
    "06_on_your_machine",
    "07_serving_economics",
    "08_speculative_decoding",
]
RUN_ALL_TIMEOUT_S = 150  # a lesson takes ~30 s on the 2-core CPU; margin for a noisy machine


def lesson(name: str) -> Path:
    path = NOTEBOOKS / f"{name}.ipynb"
    if not path.exists():
        pytest.fail(f"notebooks/{name}.ipynb does not exist: the curriculum's fixed list needs it")
    return path


def run_and_move_slider(lab, notebook: Path) -> None:
    """Run all cells from the menu, check no error, move the dashboard's slider, see it redraw."""
    lab.open(notebook)
    lab.run_all(timeout_s=RUN_ALL_TIMEOUT_S)
    errors = lab.error_outputs()
    assert not errors, f"{notebook.name}: error outputs after run-all: {errors}"
    assert not lab.unexecuted_cells(), (
        f"{notebook.name}: code cells not executed by run-all: {lab.unexecuted_cells()}"
    )

    dashboard = lab.dashboard()
    before = dashboard.state()
    assert before["figures_decoded"] >= 1, (
        f"{notebook.name}: the dashboard of {dashboard.label!r} shows no figure "
        "(a PNG drawn into an ipywidgets Output in the slider's cell)"
    )
    assert before["readout_visible"], (
        f"{notebook.name}: no visible, non-empty widget with the class inference-lab-readout"
    )

    old_value, new_value = dashboard.move_slider()
    after = dashboard.wait_redrawn(before, new_value)
    assert after["figure"] != before["figure"]
    assert after["readout"] != before["readout"]
    errors = lab.error_outputs()
    assert not errors, f"{notebook.name}: error outputs after moving {dashboard.label!r}: {errors}"


def open_and_check_stored_outputs(lab, notebook: Path) -> None:
    """Open without running: stored outputs show at least one figure and no error."""
    lab.open(notebook, wait_for_kernel=False)
    figures = lab.rendered_figures()
    assert figures >= 1, f"{notebook.name}: no stored figure (<img> in an output) rendered"
    errors = lab.error_outputs()
    assert not errors, f"{notebook.name}: stored error outputs: {errors}"


# ---------------------------------------------------------------------------- the lessons
@pytest.mark.parametrize("name", RUN_END_TO_END)
def test_lesson_runs_and_its_widget_redraws(lab, name):
    run_and_move_slider(lab, lesson(name))


@pytest.mark.parametrize("name", OPEN_ONLY)
def test_lesson_stored_outputs_render(lab, name):
    open_and_check_stored_outputs(lab, lesson(name))


# ---------------------------------------------------- the harness, proven without lessons
def test_harness_on_fixture_runs_and_widget_redraws(lab):
    run_and_move_slider(lab, FIXTURES / "widget_fixture.ipynb")


def test_harness_on_fixture_stored_outputs_render(lab):
    open_and_check_stored_outputs(lab, FIXTURES / "widget_fixture.ipynb")


def test_harness_sees_stored_errors_and_not_stderr(lab):
    """The error detector must find a traceback: otherwise "no error outputs" proves nothing.

    error_fixture.ipynb holds a ZeroDivisionError; widget_fixture.ipynb a line on stderr,
    which must not count (checked above by the fixture tests passing).
    """
    lab.open(FIXTURES / "error_fixture.ipynb", wait_for_kernel=False)
    lab.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output").first.wait_for()
    errors = lab.error_outputs()
    assert len(errors) == 1 and "ZeroDivisionError" in errors[0]["text"], errors
