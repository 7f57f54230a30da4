"""How long each stored notebook takes: to read (word count) and to run (its cells' stored run times).

Reading: the words of the prose (markdown, folded answers included) and of what the cells print,
at 238 words a minute, the average silent reading rate for non-fiction in English found by
Brysbaert's meta-analysis of 190 studies ("How many words do we read per minute?", Journal of
Memory and Language 109, 2019). That rate is for continuous prose: a reader who works the
predictions, the worked problems and the dashboards takes longer, which docs/teaching.md says.
Code is counted in lines, not read at a rate: the code cells, and the source a cell displays for
reading (``machine.show_function`` and ``show_kernel``, highlighted Python), which is code too.

Running: the sum over code cells of the time between the kernel starting a cell and its reply
(``metadata.execution``, which nbclient stores when it runs a notebook), so the figures are those
of the machine that stored the notebook; ``--processor`` names it in the table.

Usage: python scripts/reading_time.py [NOTEBOOK ...]   (default: every notebook in notebooks/)
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

WORDS_PER_MINUTE = 238
ROOT = Path(__file__).resolve().parents[1]


def _words(text: str) -> int:
    text = re.sub(r"<[^>]+>", " ", text)            # HTML tags of the folds are not words
    return len(re.findall(r"[A-Za-z0-9][\w'’.,/%-]*", text))


def _is_source(output) -> bool:
    """A displayed piece of source code (IPython's ``Code``: highlighted HTML), not printed words."""
    return 'class="highlight"' in "".join(output.get("data", {}).get("text/html", ""))


def _shown_code_lines(cell) -> int:
    return sum(len([ln for ln in "".join(o["data"].get("text/plain", "")).splitlines() if ln.strip()])
               for o in cell.get("outputs", []) if _is_source(o))


def _printed(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        if _is_source(o):
            continue
        if o["output_type"] == "stream":
            out.append("".join(o["text"]))
        elif "text/plain" in o.get("data", {}) and not any(k.startswith(("image/", "application/vnd.jupyter.widget"))
                                                           for k in o["data"]):
            out.append("".join(o["data"]["text/plain"]))
    return "".join(out)


def _seconds(cell) -> float:
    ex = cell.get("metadata", {}).get("execution", {})
    start, end = ex.get("iopub.execute_input"), ex.get("shell.execute_reply")
    if not (start and end):
        return 0.0
    parse = datetime.datetime.fromisoformat
    return max(0.0, (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds())


def measure(path: Path) -> dict:
    """Prose words, printed words, code lines, minutes to read and seconds to run of one notebook."""
    cells = json.loads(path.read_text())["cells"]
    prose = sum(_words("".join(c["source"])) for c in cells if c["cell_type"] == "markdown")
    printed = sum(_words(_printed(c)) for c in cells if c["cell_type"] == "code")
    code = sum(len([ln for ln in "".join(c["source"]).splitlines() if ln.strip()]) + _shown_code_lines(c)
               for c in cells if c["cell_type"] == "code")
    run = sum(_seconds(c) for c in cells if c["cell_type"] == "code")
    return {"notebook": path.stem, "prose_words": prose, "printed_words": printed, "code_lines": code,
            "read_minutes": (prose + printed) / WORDS_PER_MINUTE, "run_seconds": run}


def table(rows) -> str:
    lines = ["| notebook | prose words | printed words | code lines | reading (min) | run here (s) |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['notebook']} | {r['prose_words']:,} | {r['printed_words']:,} | {r['code_lines']:,} | "
                     f"{r['read_minutes']:.0f} | {r['run_seconds']:.0f} |")
    total = {k: sum(r[k] for r in rows) for k in ("prose_words", "printed_words", "code_lines", "read_minutes", "run_seconds")}
    lines.append(f"| all | {total['prose_words']:,} | {total['printed_words']:,} | {total['code_lines']:,} | "
                 f"{total['read_minutes']:.0f} | {total['run_seconds']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=Path)
    args = ap.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"reading_time: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    print(table([measure(p) for p in paths]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
