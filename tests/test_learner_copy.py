"""`make lab` serves the learner's copy of the lessons (scripts/learner_copy.py), never the tracked ones.

Issue 26: JupyterLab's autosave rewrote a tracked notebook half-run. The copy is made on the
first start, completed on later ones, never overwritten, trusted (so stored widget views draw
before anything runs), and one lesson can be put back as shipped without losing the learner's.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("learner_copy", ROOT / "scripts" / "learner_copy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def own_jupyter(tmp_path, monkeypatch):
    """A Jupyter data folder of the test's own: the notary's database is written there."""
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter-data"))
    return tmp_path / "jupyter-data"


def _lesson(folder: Path, name: str, text: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {name}"), nbformat.v4.new_code_cell(text)]
    path = folder / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


def _trusted(path: Path) -> bool:
    from nbformat.sign import NotebookNotary

    return NotebookNotary().check_signature(nbformat.read(path, as_version=4))


@pytest.fixture
def shipped(tmp_path):
    folder = tmp_path / "notebooks"
    (folder / "classroom").mkdir(parents=True)
    (folder / "classroom" / "README.md").write_text("the class's files go here\n")
    (folder / ".ipynb_checkpoints").mkdir()
    (folder / ".ipynb_checkpoints" / "00_start-checkpoint.ipynb").write_text("{}")
    _lesson(folder, "00_start", "print(0)")
    _lesson(folder, "05_batching", "print(5)")
    return folder


def test_first_start_copies_every_lesson_trusted(shipped, tmp_path, own_jupyter):
    lc = _module()
    work = tmp_path / "my-notebooks"
    assert not _trusted(shipped / "00_start.ipynb")  # nobody signed the shipped ones in this notary
    copied, changed = lc.make_copy(work, shipped)
    assert sorted(copied) == ["00_start.ipynb", "05_batching.ipynb", "classroom/README.md"]
    assert changed == []
    assert not (work / ".ipynb_checkpoints").exists()
    for name in ("00_start.ipynb", "05_batching.ipynb"):
        assert (work / name).read_bytes() == (shipped / name).read_bytes()
        assert _trusted(work / name), f"{name}: stored widget views would show as plain text"
    assert not list(work.glob(".*.partial"))


def test_a_learners_work_is_never_overwritten(shipped, tmp_path, own_jupyter):
    lc = _module()
    work = tmp_path / "my-notebooks"
    lc.make_copy(work, shipped)
    mine = _lesson(work, "05_batching", "print('my own experiment')").read_bytes()
    (work / "classroom" / "README.md").write_text("my notes\n")
    _lesson(shipped, "06_new_lesson", "print(6)")  # arrives with a git pull
    copied, changed = lc.make_copy(work, shipped)
    assert copied == ["06_new_lesson.ipynb"]
    assert changed == []
    assert (work / "05_batching.ipynb").read_bytes() == mine
    assert (work / "classroom" / "README.md").read_text() == "my notes\n"


def test_a_changed_lesson_is_reported_and_reset_keeps_the_old_copy(shipped, tmp_path, own_jupyter, capsys):
    lc = _module()
    work = tmp_path / "my-notebooks"
    lc.make_copy(work, shipped)
    mine = _lesson(work, "05_batching", "print('mine')").read_bytes()
    _lesson(shipped, "05_batching", "print('the course, improved')")
    copied, changed = lc.make_copy(work, shipped)
    assert (copied, changed) == ([], ["05_batching.ipynb"])
    fresh, kept = lc.reset_lesson(work, "05", shipped)
    assert fresh.read_bytes() == (shipped / "05_batching.ipynb").read_bytes() and _trusted(fresh)
    assert kept.read_bytes() == mine and kept.name.startswith("05_batching.before-reset-")
    assert lc.make_copy(work, shipped) == ([], [])  # the reset lesson is the shipped one again


def test_reset_names_the_lessons_when_the_name_is_wrong(shipped, tmp_path, own_jupyter):
    lc = _module()
    with pytest.raises(SystemExit, match=r"LESSON='0' names 0 lessons; use one of: 00_start, 05_batching$"):
        lc.reset_lesson(tmp_path / "w", "0", shipped)
    _lesson(shipped, "05_batching_continued", "print(55)")
    assert lc.reset_lesson(tmp_path / "w", "05_batching", shipped)[0].name == "05_batching.ipynb"
    with pytest.raises(SystemExit, match="LESSON='05' names 2 lessons"):
        lc.reset_lesson(tmp_path / "w", "05", shipped)


def test_the_command_line_copies_into_the_named_folder(tmp_path):
    env = dict(os.environ, INFERENCE_LAB_NOTEBOOKS=str(tmp_path / "copy"),
               JUPYTER_DATA_DIR=str(tmp_path / "jupyter-data"))
    run = lambda *args: subprocess.run([sys.executable, str(ROOT / "scripts" / "learner_copy.py"), *args],
                                       capture_output=True, text=True, env=env, timeout=120)
    first = run()
    assert first.returncode == 0 and "the course as shipped stays in notebooks/" in first.stdout, first.stderr
    shipped = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(p.name for p in (tmp_path / "copy").glob("*.ipynb")) == shipped
    assert run().stdout == ""  # nothing new: a start says nothing
    empty = run("--reset", " ")
    assert empty.returncode == 1 and "make reset-lesson LESSON=05" in empty.stderr
