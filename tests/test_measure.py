"""Measurement: records, MFU/MBU arithmetic, sweeps (skip, OOM), files, measured ceilings."""

import functools
import json
import os
import re
import sys
import threading
import time

import jax
import numpy as np
import pytest
from flax import nnx

from inference_lab.base import hardware, progress
from inference_lab.measure import records, timing
from inference_lab.analytic import costs, roofline
from pallas_kernels import ceilings
from inference_lab.base.config import ModelConfig
from inference_lab.base.hardware import HardwareSpec
from inference_lab.model.transformer import Transformer

TINY = ModelConfig.preset("tiny")
SPEC = HardwareSpec(name="test chip", flops={"fp32": 1e11}, bandwidth=2e10)


@pytest.fixture(scope="module")
def model():
    return Transformer(TINY, rngs=nnx.Rngs(0), kernels="reference")


def test_measure_prefill(model):
    r = timing.measure_prefill(model, batch=2, prompt_len=16, repeats=2, ceilings=SPEC)
    assert (r.phase, r.batch, r.prompt_len, r.preset, r.kernels) == ("prefill", 2, 16, "tiny", "reference")
    assert r.seconds > 0 and r.prefill_tokens_per_s == pytest.approx(32 / r.seconds)
    cost = costs.prefill_cost(TINY, 2, 16)
    assert (r.flops, r.bytes) == (cost.flops, cost.bytes)
    assert r.mfu == pytest.approx(cost.flops / r.seconds / 1e11)
    assert timing.measure_prefill(model, 1, 8, repeats=1, ceilings=None).mfu is None


def test_measure_decode(model):
    r = timing.measure_decode(model, batch=2, context=16, steps=4, repeats=2, ceilings=SPEC)
    assert (r.phase, r.batch, r.context, r.steps) == ("decode", 2, 16, 4)
    assert r.decode_tokens_per_s == pytest.approx(2 / r.step_seconds)
    mean = [costs.decode_cost(TINY, 2, 16 + i) for i in range(4)]
    assert r.bytes_per_step == pytest.approx(sum(c.bytes for c in mean) / 4)
    assert r.mbu == pytest.approx(r.bytes_per_step / r.step_seconds / 2e10)
    assert r.mfu == pytest.approx(r.flops_per_step / r.step_seconds / 1e11)


def test_random_cache_is_not_zeros():
    from inference_lab.model.kv_cache import KVCache

    c = KVCache.random(TINY, 2, 8, 5, seed=0)
    assert np.asarray(c.k[0]).std() > 0.5 and c.host_lengths.tolist() == [5, 5]
    assert timing.random_tokens(TINY, (4, 32), 0).any()
    again = c.rewound(2)   # the same buffers, shorter rows; the old cache is donated
    assert again.host_lengths.tolist() == [2, 2] and c.consumed and again.k[0] is not None
    with pytest.raises(ValueError, match="lengths"):
        again.rewound(9)


def test_sweep_skips_and_records_oom(model, monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV_VAR, "1")  # a bar even under pytest, to read it
    need = roofline.memory_needed(TINY, 2, 8 + 2)
    res = timing.sweep(model, batch_sizes=[1, 2], prompt_lengths=[8], steps=2, repeats=1,
                        ceilings=SPEC, memory_bytes=need - 1)
    # batch 2 decode needs `need` bytes: skipped with the reason; the rest measured
    assert [(r.phase, r.batch) for r in res] == [("prefill", 1), ("decode", 1), ("prefill", 2)]
    assert [(s[0], s[1]) for s in res.skipped] == [("decode", 2)] and "memory_needed" in res.skipped[0][3]
    captured = capsys.readouterr()
    assert "skipped decode batch 2" in captured.out
    # tqdm's text bar, on stderr: runs done (a warm-up and one repeat per point), elapsed<remaining
    assert re.search(r"sweep: 100%.*8/8 \[\d+:\d+<\d+:\d+", captured.err), captured.err[-500:]

    def oom(*a, **k):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1 bytes")

    monkeypatch.setattr(timing.DecodePoint, "run", oom)
    res = timing.sweep(model, [1], [8], steps=2, repeats=1, ceilings=SPEC, progress=False)
    assert [r.phase for r in res] == ["prefill"] and "out of memory" in res.skipped[0][3]

    def bug(*a, **k):
        raise RuntimeError("something else")

    monkeypatch.setattr(timing.DecodePoint, "run", bug)
    with pytest.raises(RuntimeError, match="something else"):
        timing.sweep(model, [1], [8], ceilings=SPEC, progress=False)
    with pytest.raises(ValueError, match="batch_sizes"):
        timing.sweep(model, [], [8], ceilings=SPEC)
    with pytest.raises(ValueError, match="phases"):
        timing.sweep(model, [1], [8], phases=("train",), ceilings=SPEC)


def test_progress_shows_only_where_someone_watches(monkeypatch):
    class Stream:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    for var in (progress.ENV_VAR, "CI", "PYTEST_CURRENT_TEST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(progress, "_in_jupyter_kernel", lambda: False)
    assert progress.enabled(Stream(True)) and not progress.enabled(Stream(False))  # terminal vs pipe
    monkeypatch.setattr(progress, "_in_jupyter_kernel", lambda: True)
    assert progress.enabled(Stream(False))  # JupyterLab: a widget bar
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "x")  # nbval's kernel, a test's subprocess
    assert not progress.enabled(Stream(True))
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    monkeypatch.setenv("CI", "true")
    assert not progress.enabled(Stream(True))
    monkeypatch.setenv(progress.ENV_VAR, "1")  # the variable wins both ways
    assert progress.enabled(Stream(False))
    monkeypatch.delenv("CI")
    monkeypatch.setenv(progress.ENV_VAR, "0")
    assert not progress.enabled(Stream(True))
    monkeypatch.setenv(progress.ENV_VAR, "1")
    assert progress.bar(total=2, show=False).disable  # a caller's False always silences


def test_progress_without_tqdm_is_silent(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # the GPU image has no tqdm
    monkeypatch.setenv(progress.ENV_VAR, "1")
    with progress.bar(total=3, desc="x") as bar:
        bar.set_postfix_str("point")
        bar.update(1)
    assert list(progress.bar([1, 2])) == [1, 2]
    progress.note("a line")
    captured = capsys.readouterr()
    assert captured.out == "a line\n" and captured.err == ""


def _records():
    m = dict(device="cpu", backend="cpu", kernels="reference", preset="tiny", dtype="float32")
    return [records.PrefillRecord(**m, batch=1, prompt_len=8, seconds=0.5, prefill_tokens_per_s=16.0,
                                  flops=1e9, bytes=2e6, mfu=None),
            records.DecodeRecord(**m, batch=4, context=8, step_seconds=0.01, decode_tokens_per_s=400.0,
                                 bytes_per_step=3e6, flops_per_step=5e6, mbu=0.5, mfu=0.1, steps=4)]


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_save_load_round_trip(tmp_path, suffix):
    recs = _records()
    path = records.save_records(recs, tmp_path / f"r{suffix}")
    assert records.load_records(path) == recs
    with pytest.raises(ValueError, match=".json or .csv"):
        records.save_records(recs, tmp_path / "r.txt")


def test_load_folder_with_probe_json(tmp_path):
    records.save_records(_records(), tmp_path / "a.csv")
    probe = {"schema_version": 1, "device": "NVIDIA H200", "backend": "gpu", "kernels": "pallas",
             "versions": {}, "model": {"preset": "base", "params": 1, "dtype": "bfloat16"},
             "ceilings": {}, "prompt_len": 512, "new_tokens": 2,
             "prefill": {"batch": 1, "prompt_len": 512, "seconds": 0.05, "prefill_tokens_per_s": 10240.0, "mfu": 0.4},
             "decode": [{"batch": 1, "context": 512, "step_seconds": 0.002, "decode_tokens_per_s": 500.0,
                         "bytes_per_step": 2.5e9, "mbu": 0.3, "mfu": 0.01}],
             "ratio": 20.48, "tp": 1, "weight_bytes_per_device": 1, "all_reduces_per_step": 0}
    (tmp_path / "b.json").write_text(json.dumps(probe))
    recs = records.load_records(tmp_path)
    assert [r.phase for r in recs] == ["prefill", "decode", "prefill", "decode"]
    pf, dc = recs[2], recs[3]
    assert pf.device == "NVIDIA H200" and pf.flops == costs.prefill_cost(ModelConfig.preset("base"), 1, 512).flops
    assert dc.decode_tokens_per_s == 500.0 and dc.mbu == 0.3
    with pytest.raises(ValueError, match="does not exist"):
        records.load_records(tmp_path / "missing")


def test_measure_ceilings_cached(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("INFERENCE_LAB_CACHE", str(tmp_path))
    monkeypatch.setattr(hardware, "ceiling_sizes", lambda backend, key: (256, 2**20))
    spec = hardware.measure_ceilings("float32", verbose=True)
    assert spec.flops["fp32"] > 0 and spec.bandwidth > 0 and "measured" in spec.sources["flops"]
    assert "ceilings of" in capsys.readouterr().out
    files = list((tmp_path / "ceilings").glob("*.json"))
    assert len(files) == 1

    def fail(*a, **k):
        raise AssertionError("measured again instead of reading the cache")

    monkeypatch.setattr(ceilings, "device_ceilings", fail)
    again = hardware.measure_ceilings("float32", verbose=True)
    assert again == spec and capsys.readouterr().out == ""     # cached, method printed once
    with pytest.raises(AssertionError, match="measured again"):
        hardware.measure_ceilings("float32", refresh=True)
    with pytest.raises(ValueError, match="dtype"):
        hardware.measure_ceilings("int8")


# ----------------------------------------------------------------------------- caches validated on read
FAKE = {"matmul_flops": 1.5e11, "bandwidth": 3.0e10, "copy_bandwidth": 4.5e10, "matmul_method": "fake matmul",
        "bandwidth_method": "fake stream", "copy_method": "fake copy"}


def _cache_file(tmp_path, monkeypatch, calls):
    monkeypatch.setenv("INFERENCE_LAB_CACHE", str(tmp_path))

    def fake(**k):
        calls.append(k)
        return dict(FAKE)

    monkeypatch.setattr(ceilings, "device_ceilings", fake)
    hardware.measure_ceilings("float32", verbose=False)
    (path,) = (tmp_path / "ceilings").glob("*.json")
    return path


def _edit(field, value):
    def change(d):
        d[field] = value
        return json.dumps(d)
    return change


CORRUPT = {
    "null": lambda d: "null",
    "empty list": lambda d: "[]",
    "string": lambda d: json.dumps("fast"),
    "missing field": lambda d: json.dumps({k: v for k, v in d.items() if k != "bandwidth"}),
    "negative bandwidth": _edit("bandwidth", -3e10),
    "NaN bandwidth": lambda d: json.dumps(dict(d, bandwidth=float("nan"))),      # Python writes NaN
    "infinite bandwidth": lambda d: json.dumps(dict(d, bandwidth=float("inf"))),
    "zero bandwidth": _edit("bandwidth", 0),
    "bandwidth as text": _edit("bandwidth", "30 GB/s"),
    "bandwidth true": _edit("bandwidth", True),
    "flops empty": _edit("flops", {}),
    "flops NaN": lambda d: json.dumps(dict(d, flops={"fp32": float("nan")})),
    "name a number": _edit("name", 7),
    "memory negative": _edit("memory_bytes", -1),
    "sources missing": _edit("sources", None),
    "another machine": _edit("ident", {"device": "elsewhere"}),
    "truncated": lambda d: json.dumps(d)[:40],
    "not UTF-8": lambda d: b"\xff\xfe\x00garbage",
}


@pytest.mark.parametrize("shape", list(CORRUPT))
def test_a_corrupt_ceilings_cache_is_measured_again_and_named(tmp_path, monkeypatch, capsys, shape):
    calls = []
    path = _cache_file(tmp_path, monkeypatch, calls)
    good = json.loads(path.read_text())
    bad = CORRUPT[shape](dict(good))
    (path.write_bytes if isinstance(bad, bytes) else path.write_text)(bad)
    capsys.readouterr()
    spec = hardware.measure_ceilings("float32", verbose=False)
    assert len(calls) == 2, "the damaged cache was used instead of measuring again"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"ceilings cache {path} is damaged" in err and "measuring again" in err
    assert spec.bandwidth == FAKE["bandwidth"] and json.loads(path.read_text())["bandwidth"] == FAKE["bandwidth"]
    hardware.measure_ceilings("float32", verbose=False)               # repaired: read, not measured
    assert len(calls) == 2 and capsys.readouterr().err == ""


def test_ceilings_older_than_max_age_are_measured_again(tmp_path, monkeypatch):
    calls = []
    path = _cache_file(tmp_path, monkeypatch, calls)
    hardware.measure_ceilings("float32", verbose=False, max_age_s=600)       # minutes old: this run's
    assert len(calls) == 1
    old = time.time() - 3600
    os.utime(path, (old, old))
    hardware.measure_ceilings("float32", verbose=False, max_age_s=600)       # an hour old: measured again
    assert len(calls) == 2 and path.stat().st_mtime > old


def test_two_processes_needing_ceilings_at_once_measure_them_once(tmp_path, monkeypatch):
    """Two notebooks on two workers ask for fresh ceilings together: the second waits for the
    first's measurement and reads it (measuring side by side, each would slow the other's)."""
    calls = []
    _cache_file(tmp_path, monkeypatch, calls)
    started = threading.Event()

    def slow(**k):
        calls.append(k)
        started.set()
        time.sleep(0.5)
        return dict(FAKE)

    monkeypatch.setattr(ceilings, "device_ceilings", slow)
    first = threading.Thread(target=hardware.measure_ceilings, args=("float32",), kwargs=dict(refresh=True, verbose=False))
    first.start()
    started.wait(10)
    spec = hardware.measure_ceilings("float32", refresh=True, verbose=False)   # asked while the first measured
    first.join()
    assert len(calls) == 2 and spec.bandwidth == FAKE["bandwidth"]           # the cache file's, then the first's
    hardware.measure_ceilings("float32", refresh=True, verbose=False)         # asked after it: measured again
    assert len(calls) == 3


def test_unoptimized_programs_read_the_lessons_ceilings_but_never_write_them(tmp_path, monkeypatch, capsys):
    """The unit tests compile without XLA's optimizations (tests/conftest.py), which reads memory
    more slowly: they read the ceilings a lesson measured, and what they measure themselves goes to
    a file of its own, which a lesson never reads."""
    import jax

    calls = []

    def measured(unoptimized: bool):
        before = jax.config.read("jax_disable_most_optimizations")
        jax.config.update("jax_disable_most_optimizations", unoptimized)
        try:
            return hardware.measure_ceilings("float32", verbose=False)
        finally:
            jax.config.update("jax_disable_most_optimizations", before)

    monkeypatch.setenv("INFERENCE_LAB_CACHE", str(tmp_path))
    monkeypatch.setattr(ceilings, "device_ceilings", lambda **k: calls.append(k) or dict(FAKE))
    measured(unoptimized=False)                                         # a lesson measures
    (lessons,) = (tmp_path / "ceilings").glob("*.json")
    measured(unoptimized=False)
    measured(unoptimized=True)
    assert len(calls) == 1                                              # the lesson's, read by both
    lessons.unlink()
    measured(unoptimized=True)
    (own,) = (tmp_path / "ceilings").glob("*.json")
    assert len(calls) == 2 and own != lessons and json.loads(own.read_text())["ident"]["xla_optimized"] is False
    measured(unoptimized=True)                                          # its own file, read
    assert len(calls) == 2
    measured(unoptimized=False)                                         # never read by a lesson
    assert len(calls) == 3 and lessons.exists()
    lessons.write_text("{not json")                                     # damaged: one line, measured again
    capsys.readouterr()
    measured(unoptimized=False)
    assert len(calls) == 4 and capsys.readouterr().err.count("is damaged") == 1


def test_hardware_spec_refuses_non_finite_figures():
    for bad in (float("nan"), float("inf"), -1.0, True):
        with pytest.raises(ValueError, match="bandwidth"):
            HardwareSpec(name="x", flops={"fp32": 1e9}, bandwidth=bad)
        with pytest.raises(ValueError, match="flops"):
            HardwareSpec(name="x", flops={"fp32": bad}, bandwidth=1e9)


@pytest.mark.parametrize("content", ["", "zz", "0123456789abcdef", "\x00\x01", "3F9A2C1B"])
def test_a_damaged_machine_id_is_replaced_and_named(tmp_path, monkeypatch, capsys, content):
    from inference_lab.base import disk_cache

    monkeypatch.setenv("INFERENCE_LAB_CACHE", str(tmp_path))
    first = disk_cache.machine_id()
    assert disk_cache.MACHINE_ID.fullmatch(first) and disk_cache.machine_id() == first
    path = disk_cache._id_file()
    path.write_text(content)
    new = disk_cache.machine_id()
    assert disk_cache.MACHINE_ID.fullmatch(new) and disk_cache.machine_id() == new
    assert f"machine id file {path} is damaged" in capsys.readouterr().err


# ----------------------------------------------------------------------------- what survives an interrupt
def _instant(monkeypatch, stop_at):
    """Instant measurements (every run takes a millisecond); preparing the point number
    ``stop_at`` (0-based) raises KeyboardInterrupt."""
    count = []

    def prepare(self):
        if len(count) == stop_at:
            raise KeyboardInterrupt
        count.append(1)

    for point in (timing.PrefillPoint, timing.DecodePoint):
        monkeypatch.setattr(point, "prepare", prepare)
        monkeypatch.setattr(point, "run", lambda self: 1e-3)


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_an_interrupted_sweep_keeps_its_finished_points(model, tmp_path, monkeypatch, suffix):
    _instant(monkeypatch, stop_at=3)
    path = tmp_path / f"sweep{suffix}"
    with pytest.raises(KeyboardInterrupt) as err:
        timing.sweep(model, [1, 2], [8], steps=2, ceilings=SPEC, progress=False, save_to=path)
    kept = records.load_records(path)
    assert [(r.phase, r.batch) for r in kept] == [("prefill", 1), ("decode", 1), ("prefill", 2)]
    assert list(err.value.sweep_result) == kept
    assert any(f"3 point(s) were measured before this, saved in {path}" in n for n in err.value.__notes__)


def test_sweep_refuses_bad_save_path_and_long_prompts_before_measuring(model, tmp_path, monkeypatch):
    _instant(monkeypatch, stop_at=0)            # any measurement would raise KeyboardInterrupt
    with pytest.raises(ValueError, match="save_to .*does not exist"):
        timing.sweep(model, [1], [8], ceilings=SPEC, save_to=tmp_path / "no" / "r.json")
    with pytest.raises(ValueError, match=".json or .csv"):
        timing.sweep(model, [1], [8], ceilings=SPEC, save_to=tmp_path / "r.txt")
    with pytest.raises(ValueError, match="max_seq_len=512"):
        timing.sweep(model, [1], [500], steps=16, ceilings=SPEC)


# ----------------------------------------------------------------------------- what the process may allocate
def test_memory_limit_is_the_smallest_the_process_may_use(tmp_path, monkeypatch):
    import resource

    cg = tmp_path / "cgroup"
    (cg / "user.slice" / "job").mkdir(parents=True)
    (cg / "user.slice" / "memory.max").write_text("3000000000\n")
    (cg / "user.slice" / "job" / "memory.max").write_text("max\n")          # no limit of its own
    me = tmp_path / "self-cgroup"
    me.write_text("0::/user.slice/job\n")
    assert hardware._cgroup_limits(cg, me) == [3_000_000_000]
    monkeypatch.setattr(hardware, "_cgroup_limits", lambda: [3_000_000_000])
    real = resource.getrlimit
    monkeypatch.setattr(resource, "getrlimit",
                        lambda which: (2_000_000_000, -1) if which == resource.RLIMIT_AS else real(which))
    assert hardware.process_memory_limit() == 2_000_000_000               # ulimit -v wins
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert hardware.process_memory_limit() == 3_000_000_000               # then the cgroup
    if jax.default_backend() == "cpu":
        assert timing.device_memory_bytes() == 3_000_000_000


def test_a_machine_id_that_cannot_be_kept_lasts_the_process_and_is_said_once(tmp_path, monkeypatch, capsys):
    from inference_lab.base import disk_cache

    monkeypatch.setenv("INFERENCE_LAB_CACHE", str(tmp_path))
    monkeypatch.setattr(disk_cache, "_UNKEPT", {})

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(disk_cache, "_create_exclusive", refuse)
    first = disk_cache.machine_id()
    assert disk_cache.machine_id() == first == disk_cache.machine_id()   # one machine, not three
    assert capsys.readouterr().err.count("cannot keep the machine id") == 1


def test_a_measurement_shows_its_bar_while_it_runs_and_leaves_none(monkeypatch, capsys):
    """Issue 26: lesson cells sat at [*] for a minute. The measuring core draws a bar by default
    (where someone watches: forced on here), with the time left, and removes it at the end; a
    measurement shorter than DELAY_S draws nothing; progress=False silences it."""
    from inference_lab.measure import matmuls

    monkeypatch.setenv(progress.ENV_VAR, "1")
    monkeypatch.setattr(progress, "DELAY_S", 0)
    # every update drawn: these runs end sooner than tqdm's default 0.1 s between redraws
    import tqdm.auto

    monkeypatch.setattr(tqdm.auto, "tqdm", functools.partial(tqdm.auto.tqdm, mininterval=0, miniters=1))
    matmuls.matmul_sweep((1, 2), k=64, n=64, repeats=2)
    drawn = capsys.readouterr().err
    assert re.search(r"matmul: +\d+%.*\d+/6 \[\d\d:\d\d<\d\d:\d\d", drawn), repr(drawn)
    assert drawn.split("\r")[-1].strip() == "", f"the bar was left behind: {drawn[-200:]!r}"
    timing.measure_points([matmuls.MatmulPoint(1, k=64, n=64)], repeats=1, ceilings=None, progress=False)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "DELAY_S", 60.0)
    matmuls.matmul_sweep((1,), k=64, n=64, repeats=1)
    assert capsys.readouterr().err == "", "a bar for a measurement shorter than its delay"
