"""The classroom overlay trusts nothing (issue 25, root cause 3): one reader for classroom folders
with load_records' rules; cross-field checks; duplicate keys refused; the machine id anchored;
a skip reason that still says what is wrong; optional fields that are missing never break the
overlay; a big class is capped and says so."""

from __future__ import annotations

import json
import os
from pathlib import Path


from inference_lab.lessons import on_your_machine as classroom
from inference_lab.measure.records import load_records

ROOT = Path(__file__).resolve().parent.parent
STORED = json.loads((ROOT / "docs" / "measurements" / "probe-2026-12-01-cpu-2core-small-reference.json").read_text())


def _write(folder: Path, name: str, data) -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _with(**changes):
    out = json.loads(json.dumps(STORED))
    for dotted, value in changes.items():
        target, *keys = [out] + dotted.split("__")
        obj = out
        for k in keys[:-1]:
            obj = obj[int(k)] if isinstance(obj, list) else obj[k]
        obj[int(keys[-1]) if isinstance(obj, list) else keys[-1]] = value
    return out


BAD = {
    "mfu-tiny.json": (_with(prefill__mfu=1e-310), "prefill/mfu"),
    "too-fast.json": (_with(decode__0__decode_tokens_per_s=1e17), "disagrees with its own counts"),
    "twice.json": (_with(decode=[STORED["decode"][0], STORED["decode"][0]]), "batch 1 twice"),
    "id-newline.json": (_with(machine__id=STORED["machine"]["id"] + "\n"), "machine/id"),
    "long-value.json": (_with(device="x" * 400), "fails maxLength=200"),
    "dup-key.json": ('{"schema_version": 2, "schema_version": 2}', "appears twice"),
}


def test_each_bad_file_is_skipped_with_what_is_wrong(tmp_path):
    for name, (data, _) in BAD.items():
        _write(tmp_path, name, data)
    (tmp_path / "loop.json").symlink_to(tmp_path / "loop.json")
    runs = classroom.load_measured(tmp_path)
    assert not runs
    reasons = {p.name: why for p, why in runs.skipped}
    for name, (_, words) in BAD.items():
        assert words in reasons[name], (name, reasons[name])
    assert "not a regular file" in reasons["loop.json"]
    assert all(len(why) <= 300 for why in reasons.values())


def test_one_reader_for_classroom_folders(tmp_path):
    _write(tmp_path, "B.JSON", STORED)                        # upper-case suffix: read like load_records
    _write(tmp_path, ".hidden.json", STORED)                  # hidden: left out, like load_records
    runs = classroom.load_measured(tmp_path, tmp_path / "clasroom", tmp_path / "B.JSON")
    assert len(runs) == 2                                     # the folder's file, and the file given as a folder
    assert [p.name for p, _ in runs.skipped] == ["clasroom"]
    assert "the folder does not exist" in classroom.classroom_summary(runs)
    assert len(load_records(tmp_path)) == len(STORED["decode"]) + 1


def test_missing_optional_fields_never_break_the_overlay(tmp_path):
    _write(tmp_path, "unknown-preset.json", _with(model__preset="mystery"))
    _write(tmp_path, "no-bytes.json", _with(model__preset="mystery2", decode__0__bytes_per_step=None))
    _write(tmp_path, "partial.json", _with(complete=False))
    runs = classroom.load_measured(tmp_path)
    assert len(runs) == 3 and not runs.skipped
    assert sum(label.endswith("(partial)") for label in runs) == 1
    assert "partial run" in classroom.classroom_summary(runs)
    points = classroom.ratio_points(runs, reference=False)
    left = dict(points.left_out)
    assert len(points) == 1 and len(left) == 2 and all("no ceilings" in why for why in left.values())
    fig, text = classroom.classroom_view(runs, 1)
    assert "batch size 1: 3 run(s)" in text


def test_a_big_class_is_capped_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(classroom, "MAX_FILES", classroom.MAX_OVERLAY + 3)
    for i in range(classroom.MAX_OVERLAY + 5):
        data = _with(machine__id=f"{i:08x}")
        _write(tmp_path, f"run-{i:03d}.json", data)
    runs = classroom.load_measured(tmp_path)
    assert len(runs) == classroom.MAX_OVERLAY + 3                    # the folder's first MAX_FILES files
    assert "holds 65 files; the overlay read the first 63" in runs.skipped[0][1]
    fig, text = classroom.classroom_view(runs, 1)
    assert f"draws {classroom.MAX_OVERLAY} of {classroom.MAX_OVERLAY + 3} runs" in text
    assert len(fig.axes[1].get_lines()) <= classroom.MAX_OVERLAY + 2
    assert f"the chart draws the first {classroom.MAX_OVERLAY}" in classroom.classroom_summary(runs)
    assert os.listdir(tmp_path)


def test_the_instructors_one_call_names_each_model(tmp_path, capsys):
    """Issue 26: one call for the class's folder; labels name the preset, and a mix of models says
    which comparisons hold."""
    _write(tmp_path, "laptop.json", STORED)
    _write(tmp_path, "tiny.json", _with(model__preset="tiny", machine__id="0badcafe"))
    runs = classroom.classroom(tmp_path)
    out = capsys.readouterr().out
    assert len(runs) >= 2 and any("[tiny]" in label for label in runs) and any("[small]" in label for label in runs)
    assert "tokens/s compare only between runs of one model" in out
    assert "ceilings allow" in classroom.ratio_table(classroom.ratio_points(runs))
