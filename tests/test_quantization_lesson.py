"""Notebook 11's lesson module: its predictions follow the bytes per weight, and each of its
verdicts fails on realistic counter-data and says it cannot decide under noise."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from inference_lab.base import hardware
from inference_lab.base.config import ModelConfig
from inference_lab.lessons import quantization as lesson


def _step(ms, spread=1.0, batch=1):
    return SimpleNamespace(step_seconds=ms / 1e3, spread=spread, batch=batch)


def _time(ms, spread=1.0):
    return SimpleNamespace(seconds=ms / 1e3, spread=spread)


def test_predictions_follow_the_bytes_per_weight():
    cfg = ModelConfig.preset("small")
    spec = hardware.HardwareSpec("cpu", {"fp32": 400e9}, 50e9)
    rows = {r["format"]: r for r in lesson.predict(cfg, spec)}
    f32, int8, int4 = rows["float32"], rows["int8"], rows["int4 g32"]
    assert f32["decode_step_s"] / int8["decode_step_s"] == pytest.approx(3.8, rel=0.05)   # the KV cache is not quantized
    assert int4["decode_step_s"] < int8["decode_step_s"]
    assert f32["prefill_s"] == int8["prefill_s"] == int4["prefill_s"]   # weight-only: the arithmetic is unchanged
    assert f32["flip"] / int8["flip"] == pytest.approx(4, rel=0.2) and int4["flip"] <= int8["flip"]
    assert "flip (weights)" in lesson.prediction_table(list(rows.values()))


def test_gpu_table_names_the_dtype_and_prices_fall_with_the_bytes():
    rows = lesson.gpu_table()
    base = [r for r in rows if r["model"] == "base" and r["gpu"] == "H100_SXM"]
    assert [r["format"] for r in base] == ["bfloat16", "int8", "int4 g32", "int4 g128"]
    assert base[0]["flip"] == pytest.approx(296, abs=2) and base[1]["flip"] == pytest.approx(148, abs=2)
    prices = [r["output_price_b1"] for r in base]
    assert prices == sorted(prices, reverse=True)
    assert "llama3_8b" in lesson.gpu_text(rows)


def test_widening_verdict_holds_fails_and_cannot_decide():
    assert lesson.widening_costs_more(_step(7.4), _step(16.0)).holds is True            # x0.46: widened
    assert lesson.widening_costs_more(_step(7.4), _step(2.0)).holds is False            # read only the int8 bytes
    assert lesson.widening_costs_more(_step(7.4), _step(7.6)).holds is False            # no change
    assert lesson.widening_costs_more(_step(7.4, 1.6), _step(12.0, 1.6)).holds is None  # noisy


def test_matmul_verdict_holds_fails_and_cannot_decide():
    f32, q = _step(11.3, batch=8), _step(7.4, batch=8)
    mm_f32, mm_q = _time(10.0), _time(6.0)                    # predicted x1.53
    assert lesson.follows_its_matmuls("decode", f32, q, mm_f32, mm_q).holds is True
    lost = lesson.follows_its_matmuls("decode", f32, _step(11.0, batch=8), mm_f32, mm_q)
    assert lost.holds is False and "x1.03" in lost.evidence   # the matmuls gained, the step did not
    noisy = lesson.follows_its_matmuls("decode", _step(11.3, 1.5), _step(8.5, 1.5), mm_f32, mm_q)
    assert noisy.holds is None
    nothing = lesson.follows_its_matmuls("decode", f32, f32, mm_f32, _time(10.0))
    assert nothing.holds is None                               # no gain predicted: nothing to decide


def _quality(int8=0.0002, int4_32=0.003):
    return [{"format": name, "nats_per_byte": 1.42 * (1 + inc), "loss_increase": inc, "agreement": 0.95,
             "bytes_per_weight": 1.0}
            for name, inc in (("float32", 0.0), ("int8, weight-only", int8), ("int8 x int8", int8),
                              ("int4 g32", int4_32), ("int4 g64", 0.004), ("int4 g128", 0.006))]


def test_quality_verdict_fails_on_a_coarse_grid():
    assert lesson.quality_bounded(_quality()).holds is True
    assert lesson.quality_bounded(_quality(int8=0.02)).holds is False     # e.g. one scale per matrix
    assert lesson.quality_bounded(_quality(int4_32=0.09)).holds is False  # e.g. a 3-bit grid


def test_heldout_windows_are_bos_then_bytes_of_the_shipped_excerpt():
    from inference_lab.base import tokenizer
    from inference_lab.model import pretrained

    rows = lesson.heldout_windows(4, 64)
    text = pretrained.heldout_text()
    assert rows.shape == (4, 65) and (rows[:, 0] == tokenizer.BOS).all()
    assert bytes(rows[0, 1:].tolist()) == text[:64] and text.find(bytes(rows[-1, 1:].tolist())) > len(text) - 70
    assert len({bytes(r[1:].tolist()) for r in rows}) == 4


def test_view_draws_and_says_which_formats_are_compute_bound():
    cfg = ModelConfig.preset("small")
    spec = hardware.HardwareSpec("cpu", {"fp32": 400e9}, 50e9)
    fig, text = lesson.view(cfg, spec)(8, 128)
    assert "compute-bound here: int8, int4 g32, int4 g128" in text and "batch 8" in text   # float32 is not yet
    fig, text = lesson.view(cfg, spec)(1, 2048)
    assert "every format still bandwidth-bound" in text


def _kv_runs(float_ms, int8_ms, spread=1.0):
    """``{(cache, context): record}`` at the lesson's two contexts, batch KV_BATCH."""
    lo, hi = lesson.KV_CONTEXTS
    return {(name, c): _step(ms, spread, batch=lesson.KV_BATCH)
            for name, (a, b) in (("float", float_ms), ("int8", int8_ms)) for c, ms in ((lo, a), (hi, b))}


def test_int8_cache_verdict_holds_fails_and_cannot_decide():
    cfg = ModelConfig.preset("small")
    # this CPU (the stored run's shape): 12.7 ms more per 1,280 tokens in float, 12.0 in int8: x0.94
    assert lesson.cache_time_follows_its_bytes(_kv_runs((17.6, 30.3), (21.2, 33.2)), cfg).holds is True
    # a machine whose attention streams the cache: the int8 cache's extra time shrinks with its bytes (x0.27)
    streamed = lesson.cache_time_follows_its_bytes(_kv_runs((17.6, 30.3), (14.0, 17.4)), cfg)
    assert streamed.holds is False and "x0.27 the bytes" in streamed.evidence
    assert lesson.cache_time_follows_its_bytes(_kv_runs((17.6, 30.3), (15.0, 20.5), 1.8), cfg).holds is None
    assert lesson.cache_time_follows_its_bytes(_kv_runs((17.6, 17.0), (21.2, 33.2)), cfg).holds is None


def test_int8_cache_pays_with_the_caches_share_and_doubles_what_fits():
    per_token = lesson.cache_bytes_per_token(ModelConfig.preset("small"))      # read from real caches
    assert per_token["float"] == 2 * 8 * 4 * 64 * 4 and per_token["int8"] / per_token["float"] == pytest.approx(1.0625 / 4)
    rows = lesson.kv_cache_gpu_rows()
    for r in rows:
        assert 1.9 <= r["fits"]["int8"] / r["fits"]["bf16"] <= 2.0             # 2 bytes an element -> 1.03
        gains = [r["speedup"][b] for b in lesson.GPU_KV_BATCHES if b in r["speedup"]]
        assert gains == sorted(gains) and all(g >= 1 for g in gains)          # more rows, more cache, more gain
    h100 = {r["context"]: r for r in rows if r["gpu"] == "H100_SXM"}
    assert h100[1024]["speedup"][1] < 1.01 and h100[16384]["speedup"][16] > 1.45   # 1% of the bytes vs 70%
    assert 64 not in h100[16384]["speedup"]                                   # 64 x 16k does not fit: not priced
    text = lesson.kv_cache_gpu_text(rows)
    assert "does not fit" in text and "equal the weights' at batch x context = 114,516 tokens" in text
