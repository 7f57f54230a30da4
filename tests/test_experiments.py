"""Side-by-side measurements, the lone matmul kernel, and the per-call overhead ceiling."""

from __future__ import annotations

import json

import pytest
from flax import nnx

from inference_lab.measure import kernels as experiments
from inference_lab.base import hardware
from inference_lab.analytic import roofline
from inference_lab.base.config import ModelConfig
from inference_lab.model.transformer import Transformer
from pallas_kernels import ceilings

CPU = hardware.HardwareSpec("cpu", {"fp32": 100e9}, 20e9, overhead_s=5e-6)


@pytest.fixture(scope="module")
def model():
    return Transformer(ModelConfig.preset("tiny"), rngs=nnx.Rngs(0), kernels="reference")


def test_decode_points_are_records_of_every_point(model):
    recs = experiments.measure_decode_points(model, [(1, 16), (4, 16), (1, 48)], steps=2, repeats=2, ceilings=CPU)
    assert [(r.batch, r.context) for r in recs] == [(1, 16), (4, 16), (1, 48)]
    for r in recs:
        cost = roofline.decode_cost(model.cfg, r.batch, r.context + 1)  # the mean of contexts c, c + 1
        assert r.step_seconds > 0 and r.decode_tokens_per_s == pytest.approx(r.batch / r.step_seconds)
        assert r.bytes_per_step == pytest.approx(cost.bytes, rel=0.01) and r.repeats == 2 and r.steps == 2
        assert r.mbu == pytest.approx(r.bytes_per_step / r.step_seconds / CPU.bandwidth)
    with pytest.raises(ValueError, match="points is empty"):
        experiments.measure_decode_points(model, [], steps=2)
    with pytest.raises(ValueError, match="batch"):
        experiments.measure_decode_points(model, [(0, 16)], steps=2)


def test_prefill_points(model):
    recs = experiments.measure_prefill_points(model, [1, 16], repeats=2, ceilings=None)
    assert [r.prompt_len for r in recs] == [1, 16] and all(r.mfu is None and r.seconds > 0 for r in recs)
    assert recs[1].flops == roofline.prefill_cost(model.cfg, 1, 16).flops


def test_matmul_sweep_times_the_kernel_alone():
    pts = experiments.matmul_sweep((1, 4), k=256, n=128, repeats=2)
    assert [p.m for p in pts] == [1, 4] and all(p.seconds > 0 for p in pts)
    p = pts[1]
    assert p.weight_bytes == 256 * 128 * 4 and p.flops == 2 * 4 * 256 * 128
    assert p.weight_bytes_per_s == pytest.approx(p.weight_bytes / p.seconds)
    assert p.flops_per_s == pytest.approx(p.flops / p.seconds)
    with pytest.raises(ValueError, match="empty"):
        experiments.matmul_sweep(())


def test_call_overhead_is_small_and_positive():
    got = ceilings.call_overhead(calls=20)
    assert 0 < got["seconds"] < 0.05 and "median" in got["method"]


def test_ceilings_cache_gains_the_overhead_without_measuring_again(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERENCE_LAB_CACHE", str(tmp_path))
    monkeypatch.setattr(hardware, "_ceiling_sizes", lambda backend, key: (128, 2**20))
    first = hardware.measure_ceilings("float32", verbose=False)
    assert first.overhead_s > 0 and "x + 1" in first.sources["overhead"]
    (path,) = (tmp_path / "ceilings").glob("*.json")
    # a cache file written before the overhead was measured: keep its ceilings, add the overhead
    old = json.loads(path.read_text())
    del old["overhead_s"], old["sources"]["overhead"]
    old["bandwidth"] = 12.5e9
    path.write_text(json.dumps(old))

    def fail(*a, **k):
        raise AssertionError("the matmul and the stream were measured again")

    monkeypatch.setattr(ceilings, "device_ceilings", fail)
    spec = hardware.measure_ceilings("float32", verbose=False)
    assert spec.bandwidth == 12.5e9 and spec.overhead_s > 0
    assert "overhead_s" in json.loads(path.read_text())          # written back: measured once


def test_model_matmuls_are_the_models_weights_alone(model):
    pts = experiments.model_matmuls_sweep(model, (1, 2), repeats=2)
    cfg = model.cfg
    assert [p.m for p in pts] == [1, 2] and all(p.seconds > 0 for p in pts)
    assert pts[0].k == cfg.matmul_params and pts[0].n == 1     # every matmul weight, the embedding left out
    assert pts[0].weight_bytes == roofline.weight_bytes(cfg) - 2 * cfg.n_layers * cfg.d_model * 4 - cfg.d_model * 4
    assert "weight matrices alone" in pts[0].describe()
    assert experiments.matmul_sweep((1,), k=64, n=32, repeats=1)[0].describe() == "[m, 64] @ [64, 32] float32"
