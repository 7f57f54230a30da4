"""The measuring core: the one timer, points timed side by side or one by one, skips, the model's
matmuls alone, and the ceilings (a read, with a copy beside it)."""

from __future__ import annotations

import json

import pytest
from flax import nnx

from inference_lab.analytic import costs
from inference_lab.base import hardware
from inference_lab.base.config import ModelConfig
from inference_lab.measure import matmuls, timing
from inference_lab.model.transformer import Transformer
from pallas_kernels import ceilings
from pallas_kernels.timing import Samples, round_robin

CPU = hardware.HardwareSpec("cpu", {"fp32": 100e9}, 20e9, overhead_s=5e-6)


@pytest.fixture(scope="module")
def model():
    return Transformer(ModelConfig.preset("tiny"), rngs=nnx.Rngs(0), kernels="reference")


# ----------------------------------------------------------------------------- the timer
def test_round_robin_takes_turns_after_the_warmups():
    order = []
    runs = [lambda name=name: order.append(name) or 1.0 for name in "ab"]
    samples = round_robin(runs, 3, warmups=1)
    assert order == ["a", "b"] + ["a", "b"] * 3       # each warmed once, then one repeat each in turn
    assert [s.seconds for s in samples] == [(1.0,) * 3] * 2
    with pytest.raises(ValueError, match="repeats"):
        round_robin(runs, 0)


def test_samples_summarise_a_run():
    s = Samples((1.0, 2.0, 3.0, 4.0, 100.0))
    assert s.median == 3.0 and s.best == 1.0
    assert 1.0 < s.spread < 100.0                    # quartiles: one outlier does not make it 100x
    assert Samples((2.0, 2.0, 2.0, 2.0)).spread == 1.0
    with pytest.raises(ValueError):
        Samples(())


# ----------------------------------------------------------------------------- points
def test_decode_points_are_records_of_every_point(model):
    recs = timing.decode_points(model, [(1, 16), (4, 16), (1, 48)], steps=2, repeats=2, ceilings=CPU)
    assert [(r.batch, r.context) for r in recs] == [(1, 16), (4, 16), (1, 48)]
    for r in recs:
        cost = costs.decode_cost(model.cfg, r.batch, r.context + 1)  # the mean of contexts c, c + 1
        assert r.step_seconds > 0 and r.decode_tokens_per_s == pytest.approx(r.batch / r.step_seconds)
        assert r.bytes_per_step == pytest.approx(cost.bytes, rel=0.01) and r.repeats == 2 and r.steps == 2
        assert r.mbu == pytest.approx(r.bytes_per_step / r.step_seconds / CPU.bandwidth)
        assert r.spread >= 1.0 and r.machine_id
    with pytest.raises(ValueError, match="points is empty"):
        timing.decode_points(model, [], steps=2)
    with pytest.raises(ValueError, match="batch"):
        timing.decode_points(model, [(0, 16)], steps=2)
    with pytest.raises(ValueError, match="max_seq_len"):   # checked for every point, before any runs
        timing.decode_points(model, [(1, 16), (1, 510)], steps=8)


def test_each_point_says_what_making_its_programs_cost(model):
    """The warm-up's compile (jax's own events: trace, lower, compile) is kept per point, in either
    mode; measured again, the same shape finds its programs made and costs nothing there."""
    for side_by_side in (True, False):
        key = ("decode", 3, 29 + side_by_side)           # a shape no other test compiles
        runs = [timing.measure_points([timing.DecodePoint(model, 3, key[2], 2)], repeats=1, ceilings=None,
                                      side_by_side=side_by_side).compile_seconds for _ in range(2)]
        assert all(set(made) == {key} for made in runs)
        first, again = (made[key] for made in runs)
        assert first["trace"] > 0 and first["lower"] > 0 and first["compile"] > 0 and first["programs"] >= 1
        assert again["trace"] + again["lower"] + again["compile"] == 0 and again["programs"] == 0


def test_prefill_points(model):
    recs = timing.prefill_points(model, [(1, 1), (1, 16)], repeats=2, ceilings=None)
    assert [r.prompt_len for r in recs] == [1, 16] and all(r.mfu is None and r.seconds > 0 for r in recs)
    assert recs[1].flops == costs.prefill_cost(model.cfg, 1, 16).flops


def test_points_of_two_models_and_phases_time_side_by_side(model):
    other = Transformer(ModelConfig.preset("tiny").replace(n_layers=1), rngs=nnx.Rngs(1), kernels="reference")
    pre, a, b = timing.measure_points([timing.PrefillPoint(model, 1, 8), timing.DecodePoint(model, 1, 8, 2),
                                       timing.DecodePoint(other, 1, 8, 2)], repeats=2, ceilings=None)
    assert (pre.phase, a.phase, b.phase) == ("prefill", "decode", "decode")
    assert a.bytes_per_step > b.bytes_per_step            # one layer reads less than two


class _Fake:
    """A point that takes no time: the core's bookkeeping is under test."""

    phase, dtype, size = "decode", None, 8

    def __init__(self, batch, fail=None):
        self.batch, self.fail, self.label = batch, fail, f"fake batch {batch}"
        self.runs = 0

    def memory_needed(self):
        return self.batch * 1000

    def prepare(self):
        pass

    def run(self):
        if self.fail is not None:
            raise self.fail
        self.runs += 1
        return 1e-3

    def release(self):
        pass

    def record(self, samples, spec):
        return ("record", self.batch, samples.median)


@pytest.mark.parametrize("side_by_side", [True, False])
def test_memory_and_out_of_memory_are_skipped_with_their_reason(side_by_side):
    oom = RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1 bytes")
    points = [_Fake(1), _Fake(4, fail=oom), _Fake(2), _Fake(8), _Fake(64)]
    seen = []
    res = timing.measure_points(points, repeats=2, ceilings=None, side_by_side=side_by_side,
                                memory_bytes=32_000, on_record=lambda r: seen.append(len(r) + len(r.skipped)))
    assert [r[1] for r in res] == [1, 2]
    skipped = {b: reason for _, b, _, reason in res.skipped}
    assert "out of memory" in skipped[4]
    assert skipped[8] == "not tried: fake batch 4 ran out of memory"     # needs more than the one that failed
    assert "memory_needed" in skipped[64]                                # would not fit: never prepared
    assert points[2].runs == 3 and points[4].runs == 0                    # warm-up + 2 repeats; never ran
    assert seen[-1] == 5                                                 # told of every point, saved as it went


def test_other_errors_and_interrupts_carry_what_was_measured():
    with pytest.raises(RuntimeError, match="a bug") as err:
        timing.measure_points([_Fake(1), _Fake(2, fail=RuntimeError("a bug"))], repeats=1, ceilings=None,
                              side_by_side=False)
    assert [r[1] for r in err.value.sweep_result] == [1]
    assert any("1 point(s) were measured before this" in n for n in err.value.__notes__)
    with pytest.raises(KeyboardInterrupt):
        timing.measure_points([_Fake(1, fail=KeyboardInterrupt())], repeats=1, ceilings=None)


def test_one_point_that_does_not_fit_is_a_clear_error(model, monkeypatch):
    monkeypatch.setattr(timing, "device_memory_bytes", lambda: 1000)
    with pytest.raises(ValueError, match="decode batch 2 context 8 was not measured: needs"):
        timing.measure_decode(model, 2, 8, 2, ceilings=None)


def test_streamed_decode_pays_a_host_copy_per_token(model):
    loop, streamed = timing.measure_points([timing.DecodePoint(model, 1, 16, 8),
                                            timing.StreamedDecodePoint(model, 16, 8)], repeats=3, ceilings=None)
    assert streamed.batch == 1 and streamed.steps == 8 and streamed.bytes_per_step == loop.bytes_per_step
    assert streamed.step_seconds > loop.step_seconds   # a dispatch and a round trip per token, on top


# ----------------------------------------------------------------------------- the kernels alone
def test_matmul_sweep_times_the_models_entry_point_in_its_mode():
    pts = matmuls.matmul_sweep((1, 4), k=256, n=128, kernels="reference", repeats=2)
    assert [p.m for p in pts] == [1, 4] and all(p.seconds > 0 for p in pts)
    p = pts[1]
    assert p.weight_bytes == 256 * 128 * 4 and p.flops == 2 * 4 * 256 * 128 and p.kernels == "reference"
    assert p.weight_bytes_per_s == pytest.approx(p.weight_bytes / p.seconds)
    assert p.flops_per_s == pytest.approx(p.flops / p.seconds)
    assert "XLA's kernel" in p.describe()
    (pallas,) = matmuls.matmul_sweep((2,), k=64, n=32, kernels="interpret", repeats=1)   # the Pallas kernel
    assert pallas.kernels == "interpret" and "the Pallas kernel, mode 'interpret'" in pallas.describe()
    with pytest.raises(ValueError, match="empty"):
        matmuls.matmul_sweep(())


def test_model_matmuls_are_the_models_weights_alone(model):
    pts = matmuls.model_matmuls_sweep(model, (1, 2), repeats=2)
    cfg = model.cfg
    assert [p.m for p in pts] == [1, 2] and all(p.seconds > 0 for p in pts)
    assert pts[0].k == cfg.matmul_params and pts[0].n == 1     # every matmul weight, the embedding left out
    assert pts[0].weight_bytes == costs.weight_bytes(cfg) - 2 * cfg.n_layers * cfg.d_model * 4 - cfg.d_model * 4
    assert "weight matrices alone" in pts[0].describe() and "XLA's kernel" in pts[0].describe()


# ----------------------------------------------------------------------------- ceilings
def test_call_overhead_is_small_and_positive():
    got = ceilings.call_overhead(calls=20)
    assert 0 < got["seconds"] < 0.05 and "median" in got["method"]


def test_the_bandwidth_ceiling_is_a_read_and_the_copy_is_reported_beside_it(monkeypatch):
    read = ceilings.read_bandwidth(2**20, repeats=2)
    assert set(read["by_kernel"]) == {"sum", "row sums", "matrix-vector"}
    assert read["bytes_per_s"] == max(read["by_kernel"].values()) and "read-only" in read["method"]
    assert "read 64 times per call" in read["method"]          # a small buffer is re-read within one call
    monkeypatch.setattr(ceilings, "copy_bandwidth", lambda nbytes, repeats: {"bytes_per_s": 1e15, "method": "copy"})
    got = ceilings.device_ceilings(n=64, nbytes=2**20, dtype="float32", repeats=1, spells=1)
    assert got["copy_bandwidth"] == 1e15 and got["bandwidth"] < 1e15   # a fast copy does not raise the ceiling


def test_cpu_ceilings_are_the_best_of_spells_seconds_apart(monkeypatch):
    """A shared host's read rate moved between ~35 and ~55 GB/s every few seconds (2026-12-05): a
    ceiling read once, in a slow spell, was 33.7 GB/s and every MBU against it 1.6x too high. The
    best of reads spread over seconds is the ceiling, and the method says so."""
    spells = iter([34e9, 35e9, 55e9, 36e9])
    monkeypatch.setattr(ceilings, "SPELL_PAUSE_S", 0.0)
    monkeypatch.setattr(ceilings, "READ_SPELLS", 4)                 # conftest reads once elsewhere
    monkeypatch.setattr(ceilings, "read_bandwidth",
                        lambda nbytes, repeats: {"bytes_per_s": next(spells), "method": "read-only kernels"})
    monkeypatch.setattr(ceilings, "copy_bandwidth", lambda nbytes, repeats: {"bytes_per_s": 50e9, "method": "copy"})
    # the matmul too: beside another busy process (CI, 2026-12-05) a two-thread matmul ran at 58.5
    # GFLOP/s where the same CPU's model prefill reached 176
    matmuls = iter([58.5e9, 61e9, 150e9, 208e9])
    monkeypatch.setattr(ceilings, "matmul_flops",
                        lambda n, dtype, repeats: {"flops_per_s": next(matmuls), "method": "matmul"})
    got = ceilings.device_ceilings(n=64, nbytes=2**20, dtype="float32", repeats=1)
    assert got["bandwidth"] == 55e9 and "best of 4 such reads" in got["bandwidth_method"]
    assert "34.0, 35.0, 55.0, 36.0 GB/s" in got["bandwidth_method"]
    assert got["matmul_flops"] == 208e9 and "58.5, 61.0, 150.0, 208.0 GFLOP/s" in got["matmul_method"]


def test_spaced_measures_until_enough():
    taken = iter([1, 2, 3, 4, 5])
    assert ceilings.spaced(lambda: next(taken), times=4, pause_s=0.0) == [1, 2, 3, 4]
    assert ceilings.spaced(lambda: next(taken), times=4, pause_s=0.0, enough=lambda got: max(got) >= 5) == [5]


def test_a_gpu_read_ceiling_is_never_below_the_copy():
    """On a GPU a read kernel slower than a copy's read + write rate is a poor kernel, not the
    memory (the first H200 run: reads 2.7-3.0 TB/s, a copy 4.3): the copy sets the ceiling and the
    method says so. A faster read stands, and on a CPU (where one core's copy can outrun its read)
    the read stands either way."""
    read = {"bytes_per_s": 2.9e12, "method": "reads"}
    copy = {"bytes_per_s": 4.3e12, "method": "copy"}
    rate, method = ceilings.read_ceiling(read, copy, gpu=True)
    assert rate == 4.3e12 and "copy" in method and "2,900 GB/s" in method
    assert ceilings.read_ceiling(dict(read, bytes_per_s=4.5e12), copy, gpu=True) == (4.5e12, "reads")
    assert ceilings.read_ceiling(read, copy, gpu=False) == (2.9e12, "reads")


def test_the_matmul_ceiling_is_xla_at_the_kernels_dtype():
    got = ceilings.matmul_flops(128, "float32", repeats=2)
    assert got["n"] == 128 and got["flops_per_s"] > 0 and "a @ b 128x128x128 float32" in got["method"]


def test_ceilings_cache_keeps_read_and_copy_and_is_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERENCE_LAB_CACHE", str(tmp_path))
    monkeypatch.setattr(hardware, "ceiling_sizes", lambda backend, key: (128, 2**20))
    first = hardware.measure_ceilings("float32", verbose=False)
    assert first.overhead_s > 0 and "x + 1" in first.sources["overhead"]
    assert first.copy_bandwidth > 0 and "read + write" in first.sources["copy_bandwidth"]
    assert "read-only" in first.sources["bandwidth"]
    (path,) = (tmp_path / "ceilings").glob("*.json")

    def fail(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(ceilings, "device_ceilings", fail)
    assert hardware.measure_ceilings("float32", verbose=False) == first   # read from the cache
    old = json.loads(path.read_text())
    del old["overhead_s"]                       # a file written before the overhead was measured: re-measured
    path.write_text(json.dumps(old))
    with pytest.raises(AssertionError, match="measured again"):
        hardware.measure_ceilings("float32", verbose=False)


def test_the_stream_is_sized_past_the_last_level_cache(monkeypatch):
    monkeypatch.setattr(hardware, "last_level_cache_bytes", lambda: 32 * 2**20)
    assert hardware.ceiling_sizes("cpu", "fp32")[1] == 256 * 2**20
    monkeypatch.setattr(hardware, "last_level_cache_bytes", lambda: 260 * 2**20)   # the Xeon host
    assert hardware.ceiling_sizes("cpu", "fp32")[1] == 2**30 * 2 >= 4 * 260 * 2**20
