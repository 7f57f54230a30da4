"""The roofline model: the reference figures, the byte/FLOP bookkeeping, monotonicity, errors."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from inference_lab.base import hardware
from inference_lab.analytic import costs, roofline
from inference_lab.base.config import ModelConfig

H100 = hardware.PRESETS["H100_SXM"]
H200 = hardware.PRESETS["H200"]
PRESET_NAMES = ["tiny", "small", "base", "llama3_8b"]


def _kv_per_token(cfg):
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * cfg.dtype_bytes


# ----------------------------------------------------------------------------- brief figures
def test_ridge_points_match_the_brief():
    assert roofline.ridge_point(H100, "bf16") == pytest.approx(295, rel=0.01)
    assert roofline.ridge_point(H200, "bfloat16") == pytest.approx(206, rel=0.01)
    # More FLOPs, same bandwidth: the ridge moves, decode does not (fp8 doubles the ridge).
    assert roofline.ridge_point(H100, "fp8") == pytest.approx(2 * roofline.ridge_point(H100, "bf16"), rel=1e-3)


@pytest.mark.parametrize("name", ["base", "llama3_8b"])
@pytest.mark.parametrize("n", [1, 8, 256, 4000])
def test_forward_intensity_is_about_n_in_bf16(name, n):
    cfg = ModelConfig.preset(name)
    assert cfg.dtype_bytes == 2
    # 2*N*P FLOPs over 2*P bytes; the norm scales make the bytes a hair larger.
    assert costs.forward_intensity(cfg, n) == pytest.approx(n, rel=1e-3)


def test_forward_intensity_halves_in_float32():
    cfg = ModelConfig.preset("small")
    assert costs.forward_intensity(cfg, 1000) == pytest.approx(500, rel=1e-3)


@pytest.mark.parametrize("spec", [H100, H200, hardware.PRESETS["L4"]])
@pytest.mark.parametrize("name", ["base", "llama3_8b"])
def test_single_stream_decode_is_bandwidth_over_model_bytes(spec, name):
    cfg = ModelConfig.preset(name)
    model_bytes = cfg.num_params * cfg.dtype_bytes
    rule = spec.bandwidth / model_bytes
    # Batch 1 at a short context: the weights dominate, the tied/untied embedding is the
    # difference between stored and read bytes (a few percent on these vocabularies).
    tps = roofline.predicted_decode_tokens_per_s(cfg, spec, batch=1, context=16)
    assert tps == pytest.approx(rule, rel=0.1)
    assert roofline.single_stream_decode_tokens_per_s(cfg, spec) == pytest.approx(
        spec.bandwidth / costs.weight_bytes(cfg))
    assert roofline.bound(costs.decode_cost(cfg, 1, 16), spec, "bf16") == "memory"
    assert roofline.bound(costs.prefill_cost(cfg, 1, 4000), spec, "bf16") == "compute"


# ----------------------------------------------------------------------------- bookkeeping
@pytest.mark.parametrize("name", PRESET_NAMES)
def test_decode_bytes_follow_the_one_definition(name):
    cfg = ModelConfig.preset(name)
    b, B, C = cfg.dtype_bytes, 3, 77
    cost = costs.decode_cost(cfg, batch=B, context=C)
    weights = (cfg.matmul_params + (2 * cfg.n_layers + 1) * cfg.d_model) * b
    expected = (weights + B * cfg.d_model * b              # B gathered embedding rows
                + B * C * _kv_per_token(cfg)                # KV read
                + B * _kv_per_token(cfg))                    # new K/V written
    assert cost.bytes == pytest.approx(expected, rel=1e-12)
    assert cost.parts["kv_read"] == B * C * _kv_per_token(cfg)
    assert cost.bytes == pytest.approx(sum(cost.parts[k] for k in costs.Cost.BYTE_PARTS if k in cost.parts))
    flops = 2 * cfg.matmul_params * B + 4 * cfg.n_heads * cfg.head_dim * (C + 1) * cfg.n_layers * B
    assert cost.flops == pytest.approx(flops, rel=1e-12)
    assert cost.intensity == pytest.approx(cost.flops / cost.bytes)


def test_prefill_attention_flops_count_causal_pairs_exactly():
    cfg = ModelConfig.preset("tiny")
    T, B = 37, 2
    # Brute force: query i (1-based) attends to i keys.
    pairs = sum(range(1, T + 1))
    cost = costs.prefill_cost(cfg, batch=B, prompt_len=T)
    assert cost.parts["attention"] == 4 * cfg.n_heads * cfg.head_dim * cfg.n_layers * B * pairs
    assert cost.parts["kv_write"] == B * T * _kv_per_token(cfg)
    assert "kv_read" not in cost.parts
    head = cfg.vocab_size * cfg.d_model
    all_logits = costs.prefill_cost(cfg, B, T, logits="all")
    assert all_logits.flops - cost.flops == pytest.approx(2 * head * B * (T - 1))


def test_cost_addition_and_scaling_keep_parts_consistent():
    cfg = ModelConfig.preset("tiny")
    a, d = costs.prefill_cost(cfg, 1, 10), costs.decode_cost(cfg, 1, 10)
    total = a + 5 * d
    assert total.flops == pytest.approx(a.flops + 5 * d.flops)
    assert total.bytes == pytest.approx(a.bytes + 5 * d.bytes)
    assert total.parts["kv_read"] == pytest.approx(5 * d.parts["kv_read"])


def test_predict_time_is_the_larger_term():
    cfg = ModelConfig.preset("base")
    for cost in (costs.decode_cost(cfg, 1, 128), costs.prefill_cost(cfg, 4, 2048)):
        compute, memory = roofline.predict_terms(cost, H100, "bf16")
        assert compute == pytest.approx(cost.flops / 989.4e12)
        assert memory == pytest.approx(cost.bytes / 3.35e12)
        assert roofline.predict_time(cost, H100, "bf16") == max(compute, memory)


# ----------------------------------------------------------------------------- monotonicity
@pytest.mark.parametrize("name", ["small", "base", "llama3_8b"])
@pytest.mark.parametrize("context", [16, 512, 4096])
def test_more_batch_never_fewer_tokens_per_s(name, context):
    cfg = ModelConfig.preset(name)
    batches = [1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    tps = [roofline.predicted_decode_tokens_per_s(cfg, H100, b, context, "bf16") for b in batches]
    assert all(np.diff(tps) >= -1e-9 * max(tps))
    # ... and strictly more while memory-bound (the weight read is shared).
    cost1 = costs.decode_cost(cfg, 1, context)
    assert roofline.bound(cost1, H100, "bf16") == "memory"
    assert tps[1] > tps[0]


def test_longer_context_never_faster_decode():
    cfg = ModelConfig.preset("llama3_8b")
    tps = [roofline.predicted_decode_tokens_per_s(cfg, H200, 32, c) for c in (1, 128, 1024, 8192, 32768)]
    assert all(np.diff(tps) < 0)


# ----------------------------------------------------------------------------- the two knees
def _brute_flip(cfg, spec, context, include_kv, limit=100_000):
    for b in range(1, limit):
        cost = costs.decode_cost(cfg, b, context)
        if not include_kv:
            cost = costs.without_kv(cost)
        compute, memory = roofline.predict_terms(cost, spec, "bf16")
        if compute >= memory:
            return b
    return None


@pytest.mark.parametrize("name", ["base", "llama3_8b"])
@pytest.mark.parametrize("spec", [H100, H200])
def test_flip_without_kv_sits_at_the_ridge(name, spec):
    cfg = ModelConfig.preset(name)
    flip = roofline.predicted_flip(cfg, spec, "bf16", context=512, include_kv=False)
    assert flip == _brute_flip(cfg, spec, 512, include_kv=False)
    assert flip == pytest.approx(roofline.ridge_point(spec, "bf16"), rel=0.02)


def test_flip_with_kv_comes_later_or_never():
    cfg = ModelConfig.preset("llama3_8b")
    no_kv = roofline.predicted_flip(cfg, H200, "bf16", context=512, include_kv=False)
    for context in (64, 256, 512):
        flip = roofline.predicted_flip(cfg, H200, "bf16", context=context)
        assert flip == _brute_flip(cfg, H200, context, include_kv=True)
        assert flip is not None and flip > no_kv
    # At long context each sequence's KV read outlasts its math: decode never turns compute-bound.
    assert roofline.predicted_flip(cfg, H200, "bf16", context=8192) is None


@dataclasses.dataclass
class _Dec:
    batch: int
    step_seconds: float
    context: int = 512
    device: str = "cpu"
    preset: str = "small"


def test_measured_knee_is_first_batch_at_1_5x_batch_1():
    times = {1: 0.010, 2: 0.0102, 4: 0.011, 8: 0.014, 16: 0.016, 32: 0.030}
    recs = [_Dec(b, t) for b, t in times.items()]
    assert roofline.measured_knee(recs) == 16
    assert roofline.measured_knee(recs, factor=1.3) == 8
    assert roofline.measured_knee([_Dec(1, 0.01), _Dec(8, 0.012)]) is None
    # Repeats use the median; the order of records does not matter.
    noisy = recs[::-1] + [_Dec(16, 0.5), _Dec(16, 0.012), _Dec(16, 0.013)]
    assert roofline.measured_knee(noisy) == 32


def test_measured_knee_rejects_bad_sweeps():
    with pytest.raises(ValueError, match="batch-1"):
        roofline.measured_knee([_Dec(2, 0.01), _Dec(4, 0.02)])
    with pytest.raises(ValueError, match="groups"):
        roofline.measured_knee([_Dec(1, 0.01), _Dec(1, 0.01, context=64)])
    with pytest.raises(ValueError, match="no decode records"):
        roofline.measured_knee([])
    with pytest.raises(ValueError, match="factor"):
        roofline.measured_knee([_Dec(1, 0.01)], factor=1.0)


def test_predicted_knee_is_the_measured_knee_of_the_prediction():
    cfg = ModelConfig.preset("llama3_8b")
    knee = roofline.predicted_knee(cfg, H100, 4096)
    step = lambda b: roofline.predicted_decode_step_seconds(cfg, H100, b, 4096)
    assert step(knee) >= 1.5 * step(1) > step(knee - 1)
    # At 4,096 tokens the KV reads alone grow the step by half long before the compute flips it:
    # the knee is memory-bound, well below the weights-only flip near the ridge.
    assert knee < roofline.predicted_flip(cfg, H100, context=4096, include_kv=False) / 4
    assert roofline.predicted_flip(cfg, H100, context=4096) is None
    assert roofline.predicted_knee(cfg, H100, 4096, include_kv=False) > knee
    assert roofline.predicted_knee(cfg, H100, 4096, largest=2) is None


# ----------------------------------------------------------------------------- memory and tp
def test_memory_needed_counts_weights_and_kv():
    cfg = ModelConfig.preset("llama3_8b")
    m1 = roofline.memory_needed(cfg, 1, 1)
    assert m1 >= cfg.num_params * 2
    kv = costs.kv_cache_bytes(cfg, 64, 8192)
    assert roofline.memory_needed(cfg, 64, 8192) >= cfg.num_params * 2 + kv
    assert isinstance(m1, int)
    # 8B in bf16 with a small cache fits an H200; 64 x 8192 tokens of cache (68 GB) does not fit an H100.
    assert roofline.fits(cfg, 8, 1024, H200)
    assert not roofline.fits(cfg, 64, 8192, H100)
    assert roofline.memory_needed(cfg, 4, 4096, attention_scores=True) > roofline.memory_needed(cfg, 4, 4096)


def test_a_server_prefills_a_bounded_number_of_tokens():
    cfg = ModelConfig.preset("llama3_8b")
    at_once = roofline.memory_needed(cfg, 64, 4096)                       # every prompt prefilled in one call
    budget = roofline.memory_needed(cfg, 64, 4096, prefill_tokens=8192)  # a server's per-iteration budget
    per_token = (2 * 4096 + (32 + 16) * 128 + 2 * 14336) * 2
    assert at_once - budget == (64 * 4096 - 8192) * per_token
    assert roofline.memory_needed(cfg, 1, 100, prefill_tokens=8192) == roofline.memory_needed(cfg, 1, 100)
    # The KV cache alone leaves room for (72 GB - weights) / 0.54 GB = 104 sequences at 4,096 tokens; with a
    # bounded prefill the server fits nearly that many, where prefilling all at once would fit ~60.
    kv_only = (0.9 * H100.memory_bytes - cfg.num_params * 2) // (costs.kv_bytes_per_token(cfg) * 4096)
    assert kv_only == 104
    assert 95 <= roofline.max_batch(cfg, H100, 4096) <= kv_only
    assert roofline.max_batch(cfg, H100, 4096, prefill_tokens=None) < 0.7 * kv_only


def test_context_beyond_max_seq_len_is_allowed():
    cfg = ModelConfig.preset("tiny")
    assert costs.decode_cost(cfg, 1, cfg.max_seq_len * 4).bytes > 0


def test_tensor_parallel_splits_bytes_and_flops():
    cfg = ModelConfig.preset("llama3_8b")
    one, four = costs.decode_cost(cfg, 8, 1024), costs.decode_cost(cfg, 8, 1024, tp=4)
    assert four.parts["kv_read"] == pytest.approx(one.parts["kv_read"] / 4)
    assert four.flops == pytest.approx(one.flops / 4)
    assert four.parts["weights"] == pytest.approx(one.parts["weights"] / 4, rel=1e-3)
    assert roofline.allreduce_bytes(cfg, 8) == 2 * 32 * 8 * 4096 * 2
    no_latency = dataclasses.replace(H100, allreduce_latency_s=None)
    t = roofline.allreduce_time(cfg, no_latency, 8, tp=4)
    # Ring: 2 (tp-1)/tp = 1.5 x the bytes through each link, at one direction = half of NVLink's 900 GB/s.
    assert t == pytest.approx(1.5 * roofline.allreduce_bytes(cfg, 8) / (H100.interconnect_bandwidth / 2))
    assert t == pytest.approx(1.5 * 2 * 32 * 8 * 4096 * 2 / 450e9)
    # Each of the 2 x 32 all-reduces also pays the spec's fixed latency: at decode sizes it is most of the cost.
    assert roofline.allreduce_time(cfg, H100, 8, tp=4) == pytest.approx(t + 64 * H100.allreduce_latency_s)
    assert 64 * H100.allreduce_latency_s > 10 * t
    assert roofline.allreduce_time(cfg, H100, 8, tp=1) == 0.0
    with pytest.raises(ValueError, match="tp=3"):
        costs.decode_cost(cfg, 1, 1, tp=3)


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs, match", [
    (dict(batch=0, context=8), "batch"),
    (dict(batch=-1, context=8), "batch"),
    (dict(batch=2.5, context=8), "batch"),
    (dict(batch=True, context=8), "batch"),
    (dict(batch=1, context=0), "context"),
])
def test_decode_cost_rejects_bad_sizes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        costs.decode_cost(ModelConfig.preset("tiny"), **kwargs)


def test_other_errors_are_clear():
    cfg = ModelConfig.preset("tiny")
    with pytest.raises(ValueError, match="prompt_len"):
        costs.prefill_cost(cfg, 1, 0)
    with pytest.raises(ValueError, match="logits"):
        costs.prefill_cost(cfg, 1, 4, logits="some")
    with pytest.raises(ValueError, match="dtype"):
        roofline.ridge_point(H100, "float64")
    with pytest.raises(ValueError, match="fp8"):
        roofline.ridge_point(hardware.PRESETS["A100_80GB"], "fp8")
    with pytest.raises(ValueError, match="HardwareSpec"):
        roofline.ridge_point("H100", "bf16")
    with pytest.raises(ValueError, match="ModelConfig"):
        costs.decode_cost("tiny", 1, 1)
    with pytest.raises(ValueError, match="Cost"):
        roofline.predict_time((1.0, 2.0), H100, "bf16")
    with pytest.raises(ValueError, match="bandwidth"):
        hardware.HardwareSpec(name="x", flops={"bf16": 1e12}, bandwidth=0)
    with pytest.raises(ValueError, match="n_kv_heads"):
        ModelConfig.preset("tiny", n_kv_heads=3)
    nonet = dataclasses.replace(H100, interconnect_bandwidth=None)
    with pytest.raises(ValueError, match="interconnect"):
        roofline.allreduce_time(ModelConfig.preset("base"), nonet, 1, tp=2)
    assert math.isfinite(roofline.predicted_prefill_tokens_per_s(cfg, H100, 1, 16))


def test_overhead_is_the_third_term():
    cfg = ModelConfig.preset("small")
    spec = dataclasses.replace(H100, overhead_s=5e-6)
    cost = costs.decode_cost(cfg, 1, 256)
    two = roofline.predict_time(cost, spec, "fp32")
    assert roofline.predict_time(cost, spec, "fp32", overhead=True) == pytest.approx(two + 5e-6)
    assert roofline.predict_time(cost, spec, "fp32", overhead=1e-3) == pytest.approx(two + 1e-3)
    assert roofline.predict_time(cost, H100, "fp32", overhead=True) == two      # a datasheet preset has none
    assert roofline.regime(cost, spec, "bf16") == "memory"
    assert roofline.regime(costs.prefill_cost(cfg, 1, 4096), spec, "bf16") == "compute"
    tiny = costs.Cost(2.0, 8.0, {})
    assert roofline.regime(tiny, spec) == "overhead" and roofline.regime(tiny, spec, overhead=False) == "memory"
    with pytest.raises(ValueError, match="overhead"):
        roofline.predict_time(cost, spec, overhead=-1.0)
    with pytest.raises(ValueError, match="overhead_s"):
        dataclasses.replace(H100, overhead_s=-1e-6)


@pytest.mark.parametrize("context", [1, 1024, 4096, 16384])
def test_max_batch_is_the_edge_of_fits(context):
    cfg = ModelConfig.preset("llama3_8b")
    for spec, tp in ((H100, 1), (H200, 1), (H100, 4)):
        b = roofline.max_batch(cfg, spec, context, tp=tp)
        assert b >= 1 and roofline.fits(cfg, b, context, spec, tp=tp)
        assert not roofline.fits(cfg, b + 1, context, spec, tp=tp)
    assert roofline.max_batch(cfg, H100, context, headroom=0.5) < roofline.max_batch(cfg, H100, context)


def test_max_batch_follows_the_kv_cache():
    cfg = ModelConfig.preset("llama3_8b")
    assert costs.kv_bytes_per_token(cfg) == 128 * 1024                      # 2 x 32 x 8 x 128 x 2 bytes
    mha = cfg.replace(n_kv_heads=cfg.n_heads)
    assert roofline.max_batch(mha, H100, 4096) < roofline.max_batch(cfg, H100, 4096)   # GQA fits more
    assert roofline.max_batch(cfg, H100, 16384) < roofline.max_batch(cfg, H100, 4096)
    huge = cfg.replace(n_layers=400)                                            # weights alone > 72 GB
    assert roofline.max_batch(huge, H100, 1024) == 0
    with pytest.raises(ValueError, match="headroom"):
        roofline.max_batch(cfg, H100, 1024, headroom=1.5)
    with pytest.raises(ValueError, match="memory_bytes"):
        roofline.max_batch(cfg, dataclasses.replace(H100, memory_bytes=None), 1024)
