"""A classroom's files: written whole or not at all, read without one bad file breaking the
folder, every machine counted once, labels drawn as plain text.

Everything here is file handling on the host: no model runs, so the tests take well under a
second each.
"""

import copy
import errno
import json
import os
import threading
import time
from pathlib import Path

import pytest

from inference_lab import plots
from inference_lab.measure import probe, probe_args, schema as probe_schema, records
from inference_lab.lessons import on_your_machine as lesson
from inference_lab.measure.records import DecodeRecord, PrefillRecord
from pallas_kernels import files


def probe_v2(mid="0a1b2c3d", name=None, device="cpu", processor="AMD Ryzen 7 5800X", speed=1.0):
    """A valid schema-2 probe result (values shaped like a laptop's)."""
    return {
        "schema_version": 2, "machine": {"id": mid, "name": name, "processor": processor},
        "device": device, "backend": "cpu", "kernels": "reference",
        "versions": {"python": "3.12.1", "jax": "0.11.2", "jaxlib": "0.11.2", "flax": "0.12.10"},
        "model": {"preset": "small", "params": 56_000_000, "dtype": "float32"},
        "ceilings": {"matmul_flops_per_s": 1.9e11, "bandwidth_bytes_per_s": 3e10, "method": "measured"},
        "prompt_len": 256, "new_tokens": 16,
        "prefill": {"batch": 1, "prompt_len": 256, "seconds": 0.2 / speed, "prefill_tokens_per_s": 1280.0 * speed,
                    "mfu": 0.4},
        "decode": [{"batch": b, "context": 256, "step_seconds": 0.01 * b ** 0.3 / speed,
                    "decode_tokens_per_s": b / (0.01 * b ** 0.3 / speed), "bytes_per_step": 2.3e8,
                    "mbu": 0.7, "mfu": 0.01} for b in (1, 8)],
        "ratio": 12.8, "tp": 1, "weight_bytes_per_device": 224_000_000, "all_reduces_per_step": 0,
        "complete": True, "skipped": [],
    }


def probe_v1(device="cpu"):
    d = probe_v2(device=device)
    for key in ("machine", "complete", "skipped"):
        del d[key]
    d["schema_version"] = 1
    return d


def _records(mid):
    m = dict(device="cpu", backend="cpu", kernels="reference", preset="tiny", dtype="float32", machine_id=mid)
    return [PrefillRecord(**m, batch=1, prompt_len=8, seconds=0.5, prefill_tokens_per_s=16.0,
                          flops=1e9, bytes=2e6, mfu=None),
            DecodeRecord(**m, batch=4, context=8, step_seconds=0.01, decode_tokens_per_s=400.0,
                         bytes_per_step=3e6, flops_per_step=5e6, mbu=0.5, mfu=0.1, steps=4)]


def _with(change):
    d = probe_v2()
    change(d)
    return json.dumps(d)


# Each kind of damage a classroom folder has shown: (file name, content, what the reason says).
GOOD = json.dumps(probe_v2())
DAMAGE = [
    ("truncated.json", GOOD[: len(GOOD) // 2], "is not valid JSON"),
    ("empty.json", "", "is empty"),
    ("latin1.json", "{\"device\": \"caf\xe9\"}".encode("latin-1"), "is not UTF-8"),
    ("not-a-probe.json", json.dumps({"hello": "world"}), "without schema_version"),
    ("missing-key.json", _with(lambda d: d.pop("prefill")), "'prefill' is a required property"),
    ("decode-five.json", _with(lambda d: d.update(decode=5)), "decode: 5 is not of type 'array'"),
    ("deep.json", "[" * 200_000 + "]" * 200_000, "nested too deeply"),
    ("nan-rate.json", _with(lambda d: d["decode"][0].update(decode_tokens_per_s=float("nan"))), "NaN is not allowed"),
    ("negative-rate.json", _with(lambda d: d["prefill"].update(prefill_tokens_per_s=-5.0)), "prefill_tokens_per_s"),
    ("inf-rate.json", GOOD.replace('"ratio": 12.8', '"ratio": 1e999'), "out of range"),
    ("billion-steps.json", _with(lambda d: d.update(new_tokens=10**9)), "new_tokens: 1000000000 is greater"),
    ("version-true.json", _with(lambda d: d.update(schema_version=True)), "schema_version is true"),
    ("version-string.json", _with(lambda d: d.update(schema_version="1")), 'schema_version is "1"'),
    ("huge-int.json", GOOD.replace('"tp": 1', '"tp": ' + "9" * 5000), "digits"),
    ("list-of-ints.json", "[1, 2, 3]", "record 0: is int, not a record object"),
    ("bad-row.csv", "phase,device,batch\ndecode,cpu,x\n", "row 2: batch='x' is not a number"),
    ("bad-id.json", _with(lambda d: d["machine"].update(id="../../etc")), "machine/id"),
]


def _write(folder: Path, name: str, content) -> Path:
    path = folder / name
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


@pytest.mark.parametrize("name, content, reason", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_each_kind_of_damage_is_named_with_its_reason(tmp_path, name, content, reason):
    path = _write(tmp_path, name, content)
    with pytest.raises(ValueError) as err:            # one file asked for by name: an error naming it
        records.load_records(path)
    assert str(path) in str(err.value) and reason in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_thirty_files_one_folder_good_ones_load_bad_ones_named_fast(tmp_path):
    ids = [f"{i:08x}" for i in range(0xA0, 0xA0 + 6)]
    for i, mid in enumerate(ids):                     # six laptops, all reporting device "cpu"
        _write(tmp_path, f"probe-{i}.json", json.dumps(probe_v2(mid, speed=1 + i / 10)))
    _write(tmp_path, "old-probe-alice.json", json.dumps(probe_v1()))          # schema 1 still reads
    _write(tmp_path, "old-probe-bob.json", json.dumps(probe_v1()))
    records.save_records(_records("0000beef"), tmp_path / "sweep.json")
    records.save_records(_records("0000cafe"), tmp_path / "sweep.csv")
    bad = [_write(tmp_path, name, content) for name, content, _ in DAMAGE]
    os.mkfifo(tmp_path / "fifo.json")                 # reading a FIFO would block forever
    (tmp_path / "folder.json").mkdir()
    big = tmp_path / "big.json"
    big.write_text(json.dumps(probe_v2()) + " " * probe_schema.MAX_FILE_BYTES)
    (tmp_path / "notes.txt").write_text("not a result")                      # not .json/.csv: ignored
    (tmp_path / "._probe-0.json").write_bytes(b"\x00\x05\x16\x07")           # macOS resource fork: ignored
    names = [p.name for p in tmp_path.iterdir() if p.suffix in (".json", ".csv") and not p.name.startswith(".")]
    assert len(names) == 30

    # Warm up once: importing jsonschema costs up to a second per process here (its optional
    # rfc3987_syntax builds a grammar on import), whatever the files hold; the bound below is
    # on reading the folder.
    records.load_records(tmp_path / "probe-0.json")
    done = {}

    def load():
        t0 = time.perf_counter()
        done["records"] = records.load_records(tmp_path)
        done["seconds"] = time.perf_counter() - t0

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "load_records hung on the folder"
    recs, seconds = done["records"], done["seconds"]
    assert seconds < 1.0, f"loading 30 files took {seconds:.2f} s"

    skipped = {p.name: reason for p, reason in recs.skipped}
    assert sorted(skipped) == sorted([p.name for p in bad] + ["fifo.json", "folder.json", "big.json"])
    for name, _, reason in DAMAGE:
        assert reason in skipped[name], (name, skipped[name])
    assert "not a regular file" in skipped["fifo.json"] and "bytes" in skipped["big.json"]
    # 10 good files: 6 + 2 probe files (3 records each) + 2 sweeps (2 each); 10 machines, each once
    assert len(recs) == 8 * 3 + 4
    summary = lesson.classroom_summary(recs)
    assert summary.startswith(f"{len(recs)} records from 10 machine(s)")
    assert all(f"skipped {name}: " in summary for name in skipped)
    fig = plots.classroom_plot(recs)
    assert len(fig.axes[1].get_lines()) == 10
    fig, text = lesson.classroom_view(recs, 8)
    assert "8 machine(s)" in text and f"{len(skipped)} file(s) skipped" in text


def test_missing_folder_still_raises(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        records.load_records(tmp_path / "nowhere")
    assert records.load_records(tmp_path).skipped == []


def test_a_huge_step_count_loads_as_fast_as_a_small_one(tmp_path):
    d = probe_v2()
    d["new_tokens"] = 2**20                          # the largest the schema allows
    path = _write(tmp_path, "p.json", json.dumps(d))
    t0 = time.perf_counter()
    recs = records.load_records(path)
    assert time.perf_counter() - t0 < 0.5
    small = copy.deepcopy(d)
    small["new_tokens"] = 2
    ref = records.load_records(_write(tmp_path, "q.json", json.dumps(small)))
    assert recs[1].flops_per_step > ref[1].flops_per_step > 0     # a longer average context


def test_two_cpu_machines_stay_two_machines(tmp_path, monkeypatch):
    """Two laptops (two cache folders, so two machine ids) probe into one folder: two files,
    two lines on the chart, two machines in the summary, although both report device 'cpu'."""
    folder = tmp_path / "classroom"
    folder.mkdir()
    made = []
    for laptop in ("laptop-a", "laptop-b"):
        monkeypatch.setenv("INFERENCE_LAB_CACHE", str(tmp_path / laptop))
        m = probe_args.machine()
        d = probe_v2(m["id"], processor=m["processor"])
        path = folder / probe_args.filename(m, "small", "reference")
        probe.write(path, d)
        made.append(path)
        assert probe_args.machine()["id"] == m["id"]      # kept: the same machine next time
    assert made[0] != made[1] and sorted(folder.iterdir()) == sorted(made)
    recs = records.load_records(folder)
    assert lesson.classroom_summary(recs).startswith("6 records from 2 machine(s)")
    assert len(plots.classroom_plot(recs).axes[0].get_lines()) == 2
    assert {r.device for r in recs} == {"cpu"}


def test_labels_are_plain_text(tmp_path):
    hostile = ["$\\frac{$", "cost $5 and $x^", "$$", "tab\there"]
    for i, name in enumerate(hostile):
        _write(tmp_path, f"p{i}.json", json.dumps(probe_v2(f"{i:08x}", name=name, device="$\\alpha$")))
    recs = records.load_records(tmp_path)
    assert recs.skipped == []
    fig = plots.classroom_plot(recs, title="class of $5")
    fig.savefig(tmp_path / "overlay.png")             # mathtext would raise here ("$\frac{$")
    shown = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(shown) == 4 and any(s.startswith("\\$\\frac{\\$ #") for s in shown), shown
    assert all(s.count("$") == s.count("\\$") for s in shown)  # every $ escaped: drawn as a $


# ----------------------------------------------------------------------------- saving whole or not at all
def fill_disk_midway(monkeypatch):
    """From now on every write through pallas_kernels.files writes half its data, then fails
    with ENOSPC (what a full disk does)."""
    real = os.fdopen

    class Full:
        def __init__(self, fh):
            self.fh = fh

        def write(self, data):
            self.fh.write(data[: len(data) // 2])
            self.fh.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.fh, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    monkeypatch.setattr(files.os, "fdopen", lambda *a, **k: Full(real(*a, **k)))


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_disk_full_during_save_records_keeps_the_old_file(tmp_path, suffix, monkeypatch):
    path = tmp_path / f"r{suffix}"
    records.save_records(_records("0000beef"), path)
    before = path.read_bytes()
    fill_disk_midway(monkeypatch)
    with pytest.raises(OSError) as err:
        records.save_records(_records("0000cafe") * 50, path)
    assert err.value.errno == errno.ENOSPC
    assert path.read_bytes() == before and records.load_records(path) == _records("0000beef")
    assert [p.name for p in tmp_path.iterdir()] == [path.name]          # no temporary file left behind


def test_disk_full_during_probe_save_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    probe.write(path, probe_v2())
    fill_disk_midway(monkeypatch)
    with pytest.raises(OSError):
        probe.write(path, probe_v2(speed=2.0))
    assert json.loads(path.read_text()) == probe_v2()
    assert len(records.load_records(path)) == 3


def test_save_refuses_nan_before_writing(tmp_path):
    recs = _records("0000beef")
    recs[1].mbu = float("nan")
    with pytest.raises(ValueError, match="NaN or infinite"):
        records.save_records(recs, tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()


def test_atomic_write_keeps_permissions_and_cleans_up_on_interrupt(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("old")
    path.chmod(0o640)
    files.atomic_write_text(path, "new")
    assert path.read_text() == "new" and path.stat().st_mode & 0o777 == 0o640

    def interrupted(fh):
        fh.write("partial")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        files.atomic_write(path, interrupted)
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["x.json"]
