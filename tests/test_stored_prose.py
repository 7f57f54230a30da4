"""The stored notebooks as a learner reads them: every verdict of the stored run holds, the prose
quotes no number that can move from run to run, and each sentence the code writes from its
numbers agrees with the table it was written from. These read the stored outputs only (nothing
runs), so they fail when a notebook is stored from a run whose words and numbers disagree."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# A number with a unit of measurement (or a factor such as x1.5): what a sentence quotes.
QUOTED = re.compile(r"(?<![\w.])~?(\d[\d,]*(?:\.\d+)?)\s?(ms|us|µs|s|GB/s|TB/s|MB/s|GB|MB|KiB|MiB|GiB|tok/s|tokens/s|%"
                    r"|FLOP/byte|GFLOP/s|TFLOP/s)(?![\w/])")

# Numbers the prose may quote although no deterministic cell prints them: fixed facts with their
# source (datasheets, published measurements, worked problems' own givens). A measured number of
# this machine never belongs here: print it from a code cell instead.
FIXED = {
    "00_setup_check": {"782 TFLOP/s", "4.31 TB/s",            # MI300X datasheet (the ridge table's row)
                       "43%", "50 MB", "17 µs", "2.2 ms", "0.5 ms"},  # H200 over H100 bandwidth; worked problem 3
    "01_one_model_two_speeds": {"0.3 s", "0.5 MB",            # the worked problem's givens
                                "6.7 MB"},                    # the shakespeare model's weights (its shape, not a timing)
    "02_prefill_is_compute_bound": {"227 KiB"},               # an H100 SM's shared memory (datasheet)
    "03_decode_is_bandwidth_bound": {"141 GB", "1.05 GB", "2.87 TB/s", "4.31 TB/s", "3.09 TB/s",   # H200 datasheet
                                     "191 tokens/s", "15.0 GB", "67%", "60%", "28%",  # the H200 anchors (docs/benchmarks.md)
                                     "0.91 TB/s", "3.02 TB/s"},  # the first H200 run's decode attention (docs/benchmarks.md)
    "04_arithmetic_intensity": {"0.5%", "50 MB"},             # 1/206, a worked answer; an H100's L2 (datasheet)
    "05_batching": {"900 GB/s", "450 GB/s",                   # NVLink (datasheet)
                    "18,293 tokens/s", "3.50 ms"},            # the H200 plain-JAX 1B run (docs/benchmarks.md)
    "07_serving_economics": {"989 TFLOP/s", "450 GB/s", "900 GB/s", "29.8 ms", "0.02%", "63%"},
    "08_speculative_decoding": {"70%", "100%", "90%"},        # worked problems' acceptance rates; a perfect draft
    "09_serving_engine": {"10%",                              # the latency target's tolerance (step_timeline.HOLD)
                          "595 tok/s", "4,707 tok/s", "1.68 ms", "1.70 ms"},  # the first H200 run (docs/benchmarks.md)
    "10_paged_kv_cache": {"80%", "77%", "75%",                # the worked block-table example's arithmetic
                          "595 tok/s", "4,707 tok/s"},        # the first H200 run (docs/benchmarks.md)
    "11_quantization": {"3.35 TB/s", "989 TFLOP/s", "3,350 GB/s", "220 tokens/s", "440 tokens/s", "830 tokens/s",
                        "15 GB", "4.5 ms", "7.5 GB", "4.0 GB", "1.2 ms",   # H100 datasheet; the worked problem
                        "34 GB", "2.1 GB"},                   # the int8 KV cache's worked problem
}


def _load(path):
    return json.loads(path.read_text())


def _out(cell) -> str:
    text = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            text.append("".join(o["text"]))
        else:
            text.append("".join(o.get("data", {}).get("text/plain", "")))
    return "".join(text)


def _tags(cell) -> set:
    return set(cell.get("metadata", {}).get("tags", []))


def _printed(nb, needle: str) -> str:
    """The stored output of the one code cell whose output contains ``needle``."""
    hits = [_out(c) for c in nb["cells"] if c["cell_type"] == "code" and needle in _out(c)]
    assert len(hits) == 1, f"{len(hits)} cells print {needle!r}: re-execute the notebook"
    return hits[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_stored_verdict_holds(path):
    """A stored run shows the effect its notebook teaches: none of its verdicts is undecided."""
    nb = _load(path)
    for i, cell in enumerate(nb["cells"]):
        for word in re.findall(r"^(FAILS|CANNOT DECIDE HERE):", _out(cell), re.M):
            pytest.fail(f"{path.stem} cell {i} stores a verdict that says {word}: re-execute it on a quiet machine")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_quotes_only_numbers_that_cannot_move(path):
    """A number with a unit in the prose must come from a cell whose output is checked (nbval
    compares it on every run), from code, or be a fixed fact listed above with its source."""
    nb = _load(path)
    fixed_text = "".join("".join(c["source"]) + (_out(c) if "nbval-check-output" in _tags(c) else "")
                         for c in nb["cells"] if c["cell_type"] == "code")
    fixed = FIXED.get(path.stem, set())
    moving = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for m in QUOTED.finditer("".join(cell["source"])):
            quoted = f"{m.group(1)} {m.group(2)}"
            if m.group(1) not in fixed_text and quoted not in fixed and m.group(0).lstrip("~") not in fixed:
                moving.append(f"cell {i}: {m.group(0)!r}")
    assert not moving, (f"{path.stem}: prose quotes numbers no checked cell prints (print them from code, "
                        f"or list a fixed fact in FIXED with its source): {moving}")


# ----------------------------------------------------------------------------- one per notebook
def _rows(table: str, first: str):
    """The rows of a printed table whose first column is a number, from the header holding ``first``."""
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if first in line)
    rows = []
    for line in lines[start + 1:]:
        cells = line.replace(",", "").split()
        if not cells or not re.fullmatch(r"\d+", cells[0]):
            break
        rows.append(cells)
    return rows


def test_05_the_knee_sentence_is_the_sweeps_knee():
    nb = _load(ROOT / "notebooks" / "05_batching.ipynb")
    table = _printed(nb, "step ms      tok/s")
    steps = {int(r[0]): float(r[2]) for r in _rows(table, "step ms")}
    knee = next((b for b in sorted(steps) if steps[b] >= 1.5 * steps[1]), None)
    reading = _printed(nb, "measured knee of the model")
    flip = int(re.search(r"predicted flip, with KV reads at context \d+: batch (\d+)", reading).group(1))
    predicted = _printed(nb, "predicted flip without the KV term")
    assert re.search(rf"with it \(context \d+\): batch {flip}\b", predicted), "05's two cells print different flips"
    assert f"measured knee of the model (step >= 1.5x batch 1): batch {knee}" in reading
    where = "well before" if knee * 2 <= flip else "later than" if knee >= flip * 2 else "near"
    assert f"the knee (batch {knee}) comes {where} the roofline's flip (batch {flip})" in reading
    close = [b for b in sorted(steps) if 1 < b < knee and steps[b] >= 1.35 * steps[1]]
    assert ("came within 10%" in reading) == bool(close)


def test_01_the_same_step_twice_quotes_both_cells():
    nb = _load(ROOT / "notebooks" / "01_one_model_two_speeds.ipynb")
    twice = _printed(nb, "the same model's batch-1 step, timed twice")
    table = _printed(nb, "hollow twin     streams")
    small_ms = re.search(r"^small\s+[\d.]+ MB\s+([\d.]+) ms", table, re.M).group(1)
    speeds = _printed(nb, "slower per token (reference node")
    decode = float(re.search(r"decode ([\d,.]+) tok/s", speeds).group(1).replace(",", ""))
    here = re.search(r"timed twice in compiled loops: ([\d.]+) ms here", twice).group(1)
    there = float(re.search(r"([\d.]+) ms in the twin table", twice).group(1))
    assert abs(there - float(small_ms)) <= 0.006, (there, small_ms)
    assert abs(float(here) - 1e3 / decode) < 0.02 * float(here), (here, decode)


def test_03_the_kernels_share_of_the_ceiling_is_its_rate_over_the_ceiling():
    nb = _load(ROOT / "notebooks" / "03_decode_is_bandwidth_bound.ipynb")
    line = _printed(nb, "the matrix-vector kernel alone")
    rate, share, ceiling = re.search(r"= ([\d.]+) GB/s, (\d+)% of the read ceiling \(([\d.,]+) GB/s", line).groups()
    assert abs(float(rate) / float(ceiling.replace(",", "")) * 100 - int(share)) <= 1


def test_04_the_stream_line_is_the_tables_largest_sum():
    nb = _load(ROOT / "notebooks" / "04_arithmetic_intensity.ipynb")
    out = _printed(nb, "streamed at")
    row = re.search(r"^\s*256 MiB\s+256 MiB\s+[\d.e+]+\s+[\d,.]+\s+([\d,.]+)", out, re.M)
    rate = 2**28 / (float(row.group(1).replace(",", "")) * 1e-6) / 1e9
    assert f"streamed at {rate:.1f} GB/s (median" in out


def test_08_the_gpus_stop_paying_where_their_ridges_say():
    nb = _load(ROOT / "notebooks" / "08_speculative_decoding.ipynb")
    out = _printed(nb, "by hand batch")
    once = dict(re.findall(r"(H100_SXM|H200), llama3_8b, context [\d,]+: on the roofline, stops paying at batch (\d+) \(a verify reading", out))
    assert set(once) == {"H100_SXM", "H200"} and once["H100_SXM"] != once["H200"], out


def test_08_predictions_use_the_timed_prompts_acceptance():
    nb = _load(ROOT / "notebooks" / "08_speculative_decoding.ipynb")
    table = _printed(nb, "the one section 4 times")
    alone = {m.group(1).strip(): m.group(2) for m in
             re.finditer(r"^(never right|n-gram|shakespeare|the target itself)\s+\d+%\s+[\d.]+\s+\d+\s+(\d+%)$", table, re.M)}
    predicted = _printed(nb, "acceptance on prompt 1")
    for name, rate in alone.items():
        assert f"{name} {rate}" in predicted, (name, rate, predicted)


def test_teaching_states_each_notebooks_reading_time():
    """docs/teaching.md's reading-time table is the stored notebooks' own word count (within 10%,
    so a small edit does not break it; regenerate it with scripts/reading_time.py after a large one)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("reading_time", ROOT / "scripts" / "reading_time.py")
    reading_time = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reading_time)
    doc = (ROOT / "docs" / "teaching.md").read_text()
    for path in NOTEBOOKS:
        row = re.search(rf"^\| {path.stem} \| ([\d,]+) \| ([\d,]+) \| [\d,]+ \| (\d+) \|", doc, re.M)
        assert row, f"docs/teaching.md has no reading-time row for {path.stem}: run scripts/reading_time.py"
        got = reading_time.measure(path)
        stated = int(row.group(1).replace(",", ""))
        assert abs(stated - got["prose_words"]) <= 0.1 * got["prose_words"], (path.stem, stated, got["prose_words"])
        assert abs(int(row.group(3)) - got["read_minutes"]) <= 2, (path.stem, row.group(3), got["read_minutes"])
