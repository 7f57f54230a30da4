"""Move nbval's markers out of the code a learner reads and into cell tags.

nbval accepts its markers two ways: as a comment line in the cell (``# NBVAL_IGNORE_OUTPUT``)
or as a tag in the cell's metadata (``nbval-ignore-output``). The comment sits at the top of
the code a learner is reading; the tag is invisible unless asked for (JupyterLab's property
inspector shows it). This rewrites every marker comment of every code cell as the matching tag:

    # NBVAL_IGNORE_OUTPUT     ->  nbval-ignore-output
    # NBVAL_CHECK_OUTPUT      ->  nbval-check-output
    # NBVAL_SKIP              ->  nbval-skip
    # NBVAL_RAISES_EXCEPTION  ->  raises-exception   (nbval's, nbclient's and JupyterLab's
                                                      "run all" honour it alike)

The marker line goes; a tag of the same kind already on the cell is replaced (a comment wins
in nbval, so the converted notebook tests exactly as before). Nothing else changes, so a second
run is a no-op, and a notebook without marker comments is not rewritten. `make notebooks` runs
it before executing the notebooks.

Usage: python scripts/nbval_tags.py [--check] NOTEBOOK ...
  --check  change nothing; exit 1 if a notebook still has marker comments
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# comment marker -> (tag, what it decides); one tag per decision.
MARKERS = {
    "NBVAL_IGNORE_OUTPUT": ("nbval-ignore-output", "check"),
    "NBVAL_CHECK_OUTPUT": ("nbval-check-output", "check"),
    "PYTEST_VALIDATE_IGNORE_OUTPUT": ("nbval-ignore-output", "check"),
    "NBVAL_SKIP": ("nbval-skip", "skip"),
    "NBVAL_RAISES_EXCEPTION": ("raises-exception", "exception"),
}
TAG_DECIDES = {tag: decides for tag, decides in MARKERS.values()}
TAG_DECIDES["nbval-raises-exception"] = "exception"
TAG_DECIDES["pytest-validate-ignore-output"] = "check"


def marker_of(line: str) -> str | None:
    """The marker a source line is, the way nbval reads it (``#`` then the name), or None."""
    text = line.strip()
    if not text.startswith("#"):
        return None
    name = text.lstrip("#").strip()
    return name if name in MARKERS else None


def convert_cell(cell) -> bool:
    """Turn the marker comments of one code cell into tags; True if the cell changed."""
    if cell.get("cell_type") != "code":
        return False
    lines = cell["source"].splitlines(keepends=True)
    found = [marker_of(line) for line in lines]
    if not any(found):
        return False
    kept = [line for line, marker in zip(lines, found) if marker is None]
    while kept and not kept[0].strip():  # the blank line a marker left at the top
        kept.pop(0)
    source = "".join(kept)
    if source.endswith("\n") and not cell["source"].endswith("\n"):
        source = source[:-1]
    cell["source"] = source
    tags = list(cell.setdefault("metadata", {}).get("tags", []))
    for marker in (m for m in found if m):
        tag, decides = MARKERS[marker]
        tags = [t for t in tags if TAG_DECIDES.get(t) != decides]
        tags.append(tag)
    cell["metadata"]["tags"] = tags
    return True


def convert_notebook(nb) -> int:
    """Convert every code cell of a notebook node in place; returns the number changed."""
    return sum(convert_cell(cell) for cell in nb.cells)


def convert_file(path: Path, *, check: bool = False) -> int:
    """Convert one notebook file (rewritten only if something changed); returns cells changed."""
    import nbformat

    nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    changed = convert_notebook(nb)
    if changed and not check:
        nbformat.write(nb, path)
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if any notebook has marker comments")
    args = parser.parse_args(argv)
    total = 0
    for path in args.notebooks:
        changed = convert_file(path, check=args.check)
        total += changed
        if changed:
            verb = "has" if args.check else "converted"
            print(f"{path}: {verb} {changed} cell(s) with nbval marker comments")
    if args.check and total:
        print("run: python scripts/nbval_tags.py NOTEBOOK ... (or make notebooks)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
