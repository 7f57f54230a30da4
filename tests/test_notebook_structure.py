"""Every lesson keeps the shape of docs/teaching.md (checked on the stored .ipynb files)."""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
LESSONS = [
    "00_setup_check", "01_one_model_two_speeds", "02_prefill_is_compute_bound",
    "03_decode_is_bandwidth_bound", "04_arithmetic_intensity", "05_batching",
    "06_on_your_machine", "07_serving_economics", "08_speculative_decoding", "09_serving_engine",
    "10_paged_kv_cache", "11_quantization",
]


def _cells(name):
    path = NOTEBOOKS / f"{name}.ipynb"
    assert path.exists(), f"{path} is missing: the list of notebooks is fixed"
    nb = json.loads(path.read_text())
    return nb["cells"]


def _text(cells, kind):
    return ["".join(c["source"]) for c in cells if c["cell_type"] == kind]


def test_the_list_is_exactly_the_eleven_lessons():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == LESSONS


@pytest.mark.parametrize("name", LESSONS)
def test_lesson_shape(name):
    cells = _cells(name)
    markdown, code = _text(cells, "markdown"), _text(cells, "code")
    first = markdown[0]
    assert first.startswith("# "), f"{name}: must open with a title"
    assert "**TL;DR.**" in first, f"{name}: no TL;DR at the top"
    assert "**You will:**" in first, f"{name}: no learning goals at the top"
    assert any(m.startswith("### Glossary") and m.count("<details>") >= 4 for m in markdown), \
        f"{name}: no glossary of foldable terms"
    assert any("## Check yourself" in m for m in markdown), f"{name}: no check-yourself section"
    assert sum(m.count("Show answer") for m in markdown) >= 2, f"{name}: check-yourself answers must be revealable"
    assert any(re.search(r"widgets\.(quiz|numeric_quiz)\(", c) for c in code), f"{name}: no auto-checked question"
    assert any("widgets.dashboard(" in c for c in code), f"{name}: no sweep widget"
    assert any(re.search(r'"(batch size|prompt length)"', c) for c in code), \
        f"{name}: the widget must sweep batch size or prompt length"
    assert any(re.search(r"^\s*assert ", c, re.M) for c in code), f"{name}: no assert of the lesson's claim"
    assert markdown[-1].lstrip().startswith("**Takeaway:**"), f"{name}: must close with a one-line takeaway"


@pytest.mark.parametrize("name", LESSONS)
def test_stored_with_outputs_and_no_errors(name):
    cells = _cells(name)
    code = [c for c in cells if c["cell_type"] == "code"]
    assert all(c.get("execution_count") for c in code), f"{name}: store it executed (make notebooks)"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{name}: stored with an error output: {errors[0].get('ename')}"
    images = [o for c in code for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, f"{name}: no stored PNG figure"
    assert not any("image/svg+xml" in o.get("data", {}) for c in code for o in c.get("outputs", [])), \
        f"{name}: SVG figures break nbval's comparison; use PNG"
    assert "device" in json.dumps(code[0].get("outputs", [])) or "device" in json.dumps(code[:3]), \
        f"{name}: print the device it ran on near the top"


@pytest.mark.parametrize("name", LESSONS)
def test_nbval_markers_are_tags_not_comments(name):
    """A learner reads code, not test markers: nbval's markers live in the cell tags."""
    marked = [i for i, c in enumerate(_cells(name)) if c["cell_type"] == "code"
              and "".join(c["source"]).lstrip().startswith("# NBVAL_")]
    assert not marked, (f"{name}: code cells {marked} start with a '# NBVAL_' comment: "
                        "run python scripts/nbval_tags.py notebooks/*.ipynb")


@pytest.mark.parametrize("name", LESSONS)
def test_no_table_inside_a_quote(name):
    """The site's markdown renders a table inside a blockquote as raw `| ... |` text (issue 26)."""
    quoted = [line for m in _text(_cells(name), "markdown") for line in m.splitlines()
              if line.lstrip().startswith(">") and line.lstrip(" >").startswith("|")]
    assert not quoted, f"{name}: a markdown table inside a quote: {quoted[0][:60]}"
