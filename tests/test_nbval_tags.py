"""scripts/nbval_tags.py: nbval's marker comments become cell tags, once, and nbval reads them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import nbval_tags  # noqa: E402

sys.path.remove(str(ROOT / "scripts"))


def _stream(text):
    return new_output("stream", name="stdout", text=text)


def _notebook(path: Path) -> Path:
    nb = new_notebook(cells=[
        new_markdown_cell("# NBVAL_SKIP is a heading here, not a marker"),
        new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(2)", outputs=[_stream("1\n")], execution_count=1),
        new_code_cell("# NBVAL_IGNORE_OUTPUT\n\nimport random\nprint(random.random())",
                      outputs=[_stream("0.5\n")], execution_count=2),
        new_code_cell("#NBVAL_RAISES_EXCEPTION\n1 / 0", execution_count=3),
        new_code_cell("x = 1\n# NBVAL_SKIP\nraise SystemExit('skipped cells never run')", execution_count=4),
        new_code_cell("# an ordinary comment stays\ny = 2", execution_count=5),
    ])
    nb.cells[2].metadata["tags"] = ["nbval-check-output", "keep-me"]  # a comment beats a tag in nbval
    nbformat.write(nb, path)
    return path


def test_markers_become_tags_once(tmp_path):
    path = _notebook(tmp_path / "nb.ipynb")
    assert nbval_tags.main(["--check", str(path)]) == 1
    assert nbval_tags.convert_file(path) == 4
    cells = nbformat.read(path, as_version=4).cells
    assert cells[0].source == "# NBVAL_SKIP is a heading here, not a marker"
    assert [c.source for c in cells[1:]] == [
        "print(2)", "import random\nprint(random.random())", "1 / 0",
        "x = 1\nraise SystemExit('skipped cells never run')", "# an ordinary comment stays\ny = 2"]
    assert [c.metadata.get("tags") for c in cells[1:]] == [
        ["nbval-check-output"], ["keep-me", "nbval-ignore-output"], ["raises-exception"], ["nbval-skip"], None]
    assert cells[1].outputs and cells[1].execution_count == 1  # outputs and counts untouched

    before = path.read_bytes()
    assert nbval_tags.convert_file(path) == 0  # idempotent: nothing left to convert
    assert path.read_bytes() == before
    assert nbval_tags.main(["--check", str(path)]) == 0


def test_nbval_reads_the_tags(tmp_path):
    """Under `make notebook-test`'s flags the tags act as the comments did: the checked cell is
    compared (its stored output is wrong, so it fails), the ignored one is not, the exception is
    expected, the skipped cell never runs."""
    pytest.importorskip("nbval")
    path = _notebook(tmp_path / "nb.ipynb")
    nbval_tags.convert_file(path)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", str(path), "--nbval-lax", "--nbval-current-env",
         "-p", "no:cacheprovider", "-q", "-rf", "-W", "ignore"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path)
    summary = out.stdout.strip().splitlines()[-1]
    assert "1 failed" in summary and "1 skipped" in summary and "3 passed" in summary, out.stdout[-3000:]
    assert "FAILED nb.ipynb::Cell 0" in out.stdout, out.stdout[-3000:]  # the checked cell, print(2)
