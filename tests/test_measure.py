"""Measurement: records, MFU/MBU arithmetic, sweeps (skip, OOM), files, measured ceilings."""

import json
import re
import sys

import numpy as np
import pytest
from flax import nnx

from inference_lab import hardware, measure, progress, roofline
from pallas_kernels import ceilings
from inference_lab.config import ModelConfig
from inference_lab.hardware import HardwareSpec
from inference_lab.model import Transformer

TINY = ModelConfig.preset("tiny")
SPEC = HardwareSpec(name="test chip", flops={"fp32": 1e11}, bandwidth=2e10)


@pytest.fixture(scope="module")
def model():
    return Transformer(TINY, rngs=nnx.Rngs(0), kernels="reference")


def test_measure_prefill(model):
    r = measure.measure_prefill(model, batch=2, prompt_len=16, repeats=2, ceilings=SPEC)
    assert (r.phase, r.batch, r.prompt_len, r.preset, r.kernels) == ("prefill", 2, 16, "tiny", "reference")
    assert r.seconds > 0 and r.prefill_tokens_per_s == pytest.approx(32 / r.seconds)
    cost = roofline.prefill_cost(TINY, 2, 16)
    assert (r.flops, r.bytes) == (cost.flops, cost.bytes)
    assert r.mfu == pytest.approx(cost.flops / r.seconds / 1e11)
    assert measure.measure_prefill(model, 1, 8, repeats=1, ceilings=None).mfu is None


def test_measure_decode(model):
    r = measure.measure_decode(model, batch=2, context=16, steps=4, repeats=2, ceilings=SPEC)
    assert (r.phase, r.batch, r.context, r.steps) == ("decode", 2, 16, 4)
    assert r.decode_tokens_per_s == pytest.approx(2 / r.step_seconds)
    mean = [roofline.decode_cost(TINY, 2, 16 + i) for i in range(4)]
    assert r.bytes_per_step == pytest.approx(sum(c.bytes for c in mean) / 4)
    assert r.mbu == pytest.approx(r.bytes_per_step / r.step_seconds / 2e10)
    assert r.mfu == pytest.approx(r.flops_per_step / r.step_seconds / 1e11)


def test_random_cache_is_not_zeros():
    c = measure._random_cache(TINY, 2, 8, 5, seed=0)
    assert np.asarray(c.k[0]).std() > 0.5 and c.host_lengths.tolist() == [5, 5]
    assert measure._random_tokens(TINY, (4, 32), 0).any()


def test_sweep_skips_and_records_oom(model, monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV_VAR, "1")  # a bar even under pytest, to read it
    need = roofline.memory_needed(TINY, 2, 8 + 2)
    res = measure.sweep(model, batch_sizes=[1, 2], prompt_lengths=[8], steps=2, repeats=1,
                        ceilings=SPEC, memory_bytes=need - 1)
    # batch 2 decode needs `need` bytes: skipped with the reason; the rest measured
    assert [(r.phase, r.batch) for r in res] == [("prefill", 1), ("decode", 1), ("prefill", 2)]
    assert [(s[0], s[1]) for s in res.skipped] == [("decode", 2)] and "memory_needed" in res.skipped[0][3]
    captured = capsys.readouterr()
    assert "skipped decode batch 2" in captured.out
    # tqdm's text bar, on stderr: points done, elapsed<remaining (the time estimate)
    assert re.search(r"sweep: 100%.*4/4 \[\d+:\d+<\d+:\d+", captured.err), captured.err[-500:]

    def oom(*a, **k):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1 bytes")

    monkeypatch.setattr(measure, "measure_decode", oom)
    res = measure.sweep(model, [1], [8], steps=2, repeats=1, ceilings=SPEC, progress=False)
    assert [r.phase for r in res] == ["prefill"] and "out of memory" in res.skipped[0][3]

    def bug(*a, **k):
        raise RuntimeError("something else")

    monkeypatch.setattr(measure, "measure_decode", bug)
    with pytest.raises(RuntimeError, match="something else"):
        measure.sweep(model, [1], [8], ceilings=SPEC, progress=False)
    with pytest.raises(ValueError, match="batch_sizes"):
        measure.sweep(model, [], [8], ceilings=SPEC)
    with pytest.raises(ValueError, match="phases"):
        measure.sweep(model, [1], [8], phases=("train",), ceilings=SPEC)


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
    return [measure.PrefillRecord(**m, batch=1, prompt_len=8, seconds=0.5, prefill_tokens_per_s=16.0,
                                  flops=1e9, bytes=2e6, mfu=None),
            measure.DecodeRecord(**m, batch=4, context=8, step_seconds=0.01, decode_tokens_per_s=400.0,
                                 bytes_per_step=3e6, flops_per_step=5e6, mbu=0.5, mfu=0.1, steps=4)]


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_save_load_round_trip(tmp_path, suffix):
    recs = _records()
    path = measure.save_records(recs, tmp_path / f"r{suffix}")
    assert measure.load_records(path) == recs
    with pytest.raises(ValueError, match=".json or .csv"):
        measure.save_records(recs, tmp_path / "r.txt")


def test_load_folder_with_probe_json(tmp_path):
    measure.save_records(_records(), tmp_path / "a.csv")
    probe = {"schema_version": 1, "device": "NVIDIA H200", "backend": "gpu", "kernels": "pallas",
             "versions": {}, "model": {"preset": "base", "params": 1, "dtype": "bfloat16"},
             "ceilings": {}, "prompt_len": 512, "new_tokens": 2,
             "prefill": {"batch": 1, "prompt_len": 512, "seconds": 0.05, "prefill_tokens_per_s": 10240.0, "mfu": 0.4},
             "decode": [{"batch": 1, "context": 512, "step_seconds": 0.002, "decode_tokens_per_s": 500.0,
                         "bytes_per_step": 2.5e9, "mbu": 0.3, "mfu": 0.01}],
             "ratio": 20.48, "tp": 1, "weight_bytes_per_device": 1, "all_reduces_per_step": 0}
    (tmp_path / "b.json").write_text(json.dumps(probe))
    recs = measure.load_records(tmp_path)
    assert [r.phase for r in recs] == ["prefill", "decode", "prefill", "decode"]
    pf, dc = recs[2], recs[3]
    assert pf.device == "NVIDIA H200" and pf.flops == roofline.prefill_cost(ModelConfig.preset("base"), 1, 512).flops
    assert dc.decode_tokens_per_s == 500.0 and dc.mbu == 0.3
    with pytest.raises(ValueError, match="does not exist"):
        measure.load_records(tmp_path / "missing")


def test_measure_ceilings_cached(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("INFERENCE_LAB_CACHE", str(tmp_path))
    monkeypatch.setattr(hardware, "_ceiling_sizes", lambda backend, key: (256, 2**20))
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
