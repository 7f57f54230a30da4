"""The learner's own copy of the lessons, which `make lab` opens (never the tracked notebooks).

JupyterLab autosaves an open notebook every two minutes. Opened from ``notebooks/``, a half-run
lesson would replace the course as shipped: its stored outputs and dashboards gone, ``git pull``
in conflict, ``make site`` rendering the partial run. So ``make lab`` serves a copy instead:

- ``my-notebooks/`` (ignored by git; ``INFERENCE_LAB_NOTEBOOKS`` names another folder) gets
  every file of ``notebooks/`` that it does not have yet, on every start: a lesson added by a
  later ``git pull`` arrives, and nothing the learner has is ever overwritten.
- Each notebook copied is marked trusted for this user (``jupyter trust``, the notary in the
  user's Jupyter data folder): JupyterLab draws an untrusted notebook's stored widget views as
  their plain-text stand-in (``VBox(children=(HTML(...``), so without it the dashboards and
  quizzes stored with the lessons would not show until their cells run. The lessons are code the
  learner is about to run; trusting their stored outputs grants nothing more.
- When a shipped lesson changed since the learner's copy was made (its digest at copy time is
  kept in ``.shipped.json``), a start says so, and ``make reset-lesson LESSON=05`` takes the new
  one; the learner's copy is kept beside it as ``05_batching.before-reset-<time>.ipynb``.

Usage: python scripts/learner_copy.py [--work my-notebooks] [--reset LESSON]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "notebooks"
DEFAULT_WORK = ROOT / "my-notebooks"
RECORD = ".shipped.json"  # {relative path: sha256 of the shipped file when it was copied}
SKIP = {".ipynb_checkpoints", "__pycache__"}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _shipped_files(shipped: Path) -> list[Path]:
    return sorted(
        p for p in shipped.rglob("*")
        if p.is_file() and not SKIP & set(p.relative_to(shipped).parts)
    )


def _trust(path: Path) -> None:
    """Sign the notebook in this user's notary, as `jupyter trust` does."""
    import nbformat
    from nbformat.sign import NotebookNotary

    NotebookNotary().sign(nbformat.read(path, as_version=nbformat.NO_CONVERT))


def _copy_new(source: Path, target: Path) -> bool:
    """Copy ``source`` to ``target`` unless ``target`` exists (also if it appears meanwhile)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    shutil.copy2(source, partial)
    try:
        os.link(partial, target)  # fails if the name exists: a learner's file is never replaced
    except FileExistsError:
        return False
    finally:
        partial.unlink()
    return True


def _read_record(work: Path) -> dict[str, str]:
    try:
        record = json.loads((work / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_record(work: Path, record: dict[str, str]) -> None:
    partial = work / f".{RECORD}.{os.getpid()}.partial"
    partial.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    partial.replace(work / RECORD)


def make_copy(work: Path, shipped: Path = SHIPPED) -> tuple[list[str], list[str]]:
    """Copy what ``work`` lacks of ``shipped``; return (copied, changed since copied) as names."""
    work.mkdir(parents=True, exist_ok=True)
    record = _read_record(work)
    copied, changed = [], []
    for source in _shipped_files(shipped):
        name = source.relative_to(shipped).as_posix()
        target = work / name
        if _copy_new(source, target):
            copied.append(name)
            record[name] = _digest(source)
            if target.suffix == ".ipynb":
                _trust(target)
        elif target.suffix == ".ipynb" and name in record and record[name] != _digest(source):
            changed.append(name)
    _write_record(work, record)
    return copied, changed


def _lesson(shipped: Path, lesson: str) -> Path:
    """The shipped notebook named by ``lesson``: "05", "05_batching" or "05_batching.ipynb"."""
    stem = lesson.removesuffix(".ipynb")
    lessons = sorted(shipped.glob("*.ipynb"))
    matches = [p for p in lessons if p.stem == stem] or [p for p in lessons if p.stem.startswith(f"{stem}_")]
    if len(matches) != 1:
        names = ", ".join(p.stem for p in lessons)
        raise SystemExit(f"learner_copy: LESSON={lesson!r} names {len(matches)} lessons; use one of: {names}")
    return matches[0]


def reset_lesson(work: Path, lesson: str, shipped: Path = SHIPPED) -> tuple[Path, Path | None]:
    """Put the shipped ``lesson`` back in ``work``; the learner's copy is renamed, never deleted.

    Returns (the fresh copy, where the old copy was kept or None if there was none).
    """
    source = _lesson(shipped, lesson)
    target = work / source.name
    kept = None
    if target.exists():
        kept = target.with_name(f"{source.stem}.before-reset-{time.strftime('%Y%m%d-%H%M%S')}.ipynb")
        if kept.exists():
            raise SystemExit(f"learner_copy: {kept} exists; wait a second and reset again")
        target.rename(kept)
    _copy_new(source, target)
    _trust(target)
    record = _read_record(work)
    record[source.name] = _digest(source)
    _write_record(work, record)
    return target, kept


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path,
                        default=Path(os.environ.get("INFERENCE_LAB_NOTEBOOKS") or DEFAULT_WORK),
                        help="the learner's folder (default: my-notebooks/, or $INFERENCE_LAB_NOTEBOOKS)")
    parser.add_argument("--reset", metavar="LESSON", default=None,
                        help='put the shipped lesson back ("05" or "05_batching"); your copy is kept beside it')
    args = parser.parse_args(argv)
    work = args.work.resolve()
    if args.reset is not None:
        if not args.reset.strip():
            raise SystemExit("learner_copy: name the lesson to reset, e.g. make reset-lesson LESSON=05")
        fresh, kept = reset_lesson(work, args.reset.strip())
        print(f"{_shown(fresh)}: the lesson as shipped" + (f"; your copy is now {_shown(kept)}" if kept else ""))
        return 0
    copied, changed = make_copy(work)
    if copied:
        print(f"your copy of the lessons: {_shown(work)}/ ({len(copied)} new files); "
              f"the course as shipped stays in notebooks/")
    for name in changed:
        print(f"{name}: the shipped lesson changed since your copy was made; "
              f"`make reset-lesson LESSON={name.split('_')[0]}` takes the new one (your copy is kept)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
