"""One machine, one set of numbers (issue 44): the stored notebooks quote each of the course's
quantities with one value, the record's, unless a line labels its value as a re-measurement
(``lessons.course_record.beside_the_record``).

What is read: every notebook's markdown and printed output. A quantity's value counts as
*the record's* when it is printed in a record line (notebook 00's ``MachineRecord.lines``), and as
*labelled* when its notebook also prints ``<quantity>: <value> re-measured here, <value> in the
record`` (``course_record.beside_the_record``; for the knee, ``knee_beside_the_record``). Anything else printed with another value is the contradiction the issue found (N of
18.6, 20.0, 17.3 and 19.5 in four notebooks) and fails the test. The notebooks that read the
record so far are :data:`READS_THE_RECORD`; the others still measure their own figures (issue
44 is under way) and join the list as they are moved onto the record.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
READS_THE_RECORD = ("00_setup_check", "01_one_model_two_speeds", "04_arithmetic_intensity", "05_batching",
                    "06_on_your_machine")

NUMBER = r"(\d[\d,]*(?:\.\d+)?)"
# how each quantity is printed for this machine (a figure after the name of the reference node, a
# reading of it or a GPU on its line is about that, not this machine, and is skipped)
PRINTED = {
    "N": [rf"\bN = {NUMBER}:", rf"writing is {NUMBER}x slower per token",
          rf"decode [\d.,]+ tok/s: {NUMBER}x \(the roofline allows",          # a verdict's evidence
          rf"^gap \(prefill / decode\) +[\d.]+x +{NUMBER}x"],                   # the MFU / MBU table
    "read ceiling": [rf"read bandwidth {NUMBER} GB/s", rf"ceilings: [^\n]*\bread {NUMBER} GB/s"],
    "knee": [rf"the measured knee \(the step x1\.5 batch 1's\) batch {NUMBER}",
             rf"measured knee of the model [^:]*: batch {NUMBER}",
             rf"^knee \(the first batch whose decode step[^:]*: batch {NUMBER}"],
}
RECORD_LINE = re.compile(r"the course's record of this machine|^ceilings: |^N = ", re.M)
LABELLED = re.compile(rf"^(?P<name>[\w ]+): (?:batch )?{NUMBER}\S* re-measured here, (?:batch )?{NUMBER}\S* in the "
                      "record", re.M)
# on the line before the figure, or a table's title (its block's first line); "your own model": notebook
# 06's section 4 measures a learner's folder, another model than the record's
ELSEWHERE = re.compile(r"reference node|reading [AB]\b|H100|H200|your own model")


def _texts(nb: dict) -> list[tuple[int, str]]:
    """(cell index, text) of every markdown cell and every printed output."""
    out = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown":
            out.append((i, "".join(cell["source"])))
        for o in cell.get("outputs", []):
            text = "".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/markdown", ""))
            if text:
                out.append((i, text))
    return out


def _value(s: str) -> float:
    return round(float(s.replace(",", "")), 1)


def read(notebooks: dict) -> tuple[dict, dict, list]:
    """What the notebooks print of each quantity: the record lines' values, the record values the
    labels cite, and every other value as (notebook, cell, quantity, value, labelled here)."""
    record: dict[str, set] = {q: set() for q in PRINTED}
    recorded_in_labels: dict[str, set] = {q: set() for q in PRINTED}
    seen = []          # (notebook, cell, quantity, value, labelled)
    for name, nb in notebooks.items():
        labels: set = set()           # (quantity, value) this notebook says it re-measured
        for i, text in _texts(nb):
            for m in LABELLED.finditer(text):
                q = m.group("name").strip()
                if q in PRINTED:
                    labels.add((q, _value(m.group(2))))
                    recorded_in_labels[q].add(_value(m.group(3)))
        for i, text in _texts(nb):
            title = text.lstrip().split("\n", 1)[0]
            for line in text.splitlines():
                if LABELLED.match(line):
                    continue
                for q, patterns in PRINTED.items():
                    for pattern in patterns:
                        for m in re.finditer(pattern, line):
                            # a figure of that node or GPU: named before it on its line, or in its table's title
                            if ELSEWHERE.search(line[:m.start()]) or ELSEWHERE.search(title):
                                continue
                            v = _value(m.group(1))
                            if RECORD_LINE.search(line):
                                record[q].add(v)
                            else:
                                seen.append((name, i, q, v, (q, v) in labels))
    return record, recorded_in_labels, seen


def contradictions(notebooks: dict) -> list[str]:
    """``notebooks``: {name: notebook JSON}. One line per value printed for this machine that is
    neither the record's nor labelled as a re-measurement, and per record printed with two values."""
    record, recorded_in_labels, seen = read(notebooks)
    problems = [f"the record's {q} is printed with {len(vs)} values: {sorted(vs)} (one record per course run)"
                for q, vs in record.items() if len(vs) > 1]
    problems += [f"a re-measurement of {q} is set beside a record value {v} that no record line prints "
                 f"(the record: {sorted(record[q])})" for q, vs in recorded_in_labels.items()
                 for v in vs if record[q] and v not in record[q]]
    problems += [f"{name} cell {i}: {q} = {v}, neither the record's ({sorted(record[q]) or 'none printed'}) nor "
                 "labelled as re-measured here" for name, i, q, v, labelled in seen
                 if not labelled and v not in record[q]]
    return problems


def _stored(names) -> dict:
    return {n: json.loads((NOTEBOOKS / f"{n}.ipynb").read_text()) for n in names}


def test_the_notebooks_that_read_the_record_quote_one_value_per_quantity():
    stored = _stored(READS_THE_RECORD)
    assert contradictions(stored) == []
    # ... and the check read them: 00's record and 01's own N, labelled as its re-measurement
    record, cited, seen = read(stored)
    assert len(record["N"]) == 1 and len(record["read ceiling"]) == 1 and cited["N"] == record["N"]
    assert any(name == "01_one_model_two_speeds" and q == "N" and labelled for name, _, q, _, labelled in seen)


def _nb(*cells):
    """A notebook of code cells, each printing the given text."""
    return {"cells": [{"cell_type": "code", "source": [], "outputs": [{"output_type": "stream", "text": t}]}
                      for t in cells]}


def test_a_planted_second_value_fails_and_a_labelled_one_passes():
    stored = _stored(READS_THE_RECORD)
    planted = dict(stored, planted=_nb("prompt length 256: writing is 99.9x slower per token"))
    assert any("planted cell 0: N = 99.9" in p for p in contradictions(planted))
    labelled = dict(stored, planted=_nb("writing is 99.9x slower per token\nN: 99.9 re-measured here, 5.0 in the record"))
    found = contradictions(labelled)
    assert not any("planted cell 0: N" in p for p in found)
    assert any("beside a record value 5.0" in p for p in found)       # the label names a record nobody printed
    # a knee, printed in one cell and labelled (by knee_beside_the_record) in another of the same notebook
    knee = "measured knee of the model (step >= 1.5x batch 1): batch 16"
    assert any("planted cell 0: knee = 16" in p for p in contradictions(dict(stored, planted=_nb(knee))))
    record_knee = sorted(read(stored)[0]["knee"])[0]
    said = f"knee: batch 16 re-measured here, batch {record_knee:g} in the record: the same machine"
    assert not any("planted" in p for p in contradictions(dict(stored, planted=_nb(knee, said))))


def test_two_records_or_a_second_ceiling_fail():
    record = ("the course's record of this machine, made ...\nceilings: 212 GFLOP/s (float32 matmul), read 35.5 GB/s, "
              "a call 7 us\nN = 13.1: writing is 13.1x slower per token than reading")
    assert contradictions({"a": _nb(record)}) == []
    other = record.replace("N = 13.1: writing is 13.1x", "N = 18.6: writing is 18.6x")
    assert any("record's N is printed with 2 values" in p for p in contradictions({"a": _nb(record), "b": _nb(other)}))
    # notebook 06's stale ceiling beside notebook 00's (the first contradiction)
    stale = _nb("cpu (measured here): matmul 0.419 TFLOP/s, read bandwidth 65.2 GB/s")
    assert any("read ceiling = 65.2" in p for p in contradictions({"a": _nb(record), "06": stale}))
    # the reference node's own figures are about that node, not this machine
    assert contradictions({"a": _nb(record), "r": _nb("reference node, reading A: writing is 30.4x slower per token")}) == []
    # a learner's own model (notebook 06, section 4) has its own N: its block's title says so
    own = "decode 255.2 tok/s: 19.8x (the roofline allows 8.7x)"
    assert any("N = 19.8" in p for p in contradictions({"a": _nb(record), "06": _nb(own)}))
    assert contradictions({"a": _nb(record), "06": _nb("your own model, SmolLM2-135M: its probe\n" + own)}) == []
