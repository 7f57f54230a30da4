"""The analytic model every lesson predicts with: FLOPs and bytes per phase, and the roofline.

A forward pass does two things that take time: arithmetic (FLOPs, limited by the chip's peak
FLOP/s) and moving bytes between HBM and the chip (limited by memory bandwidth). The roofline
model says a kernel takes the *larger* of the two times::

    time = max(flops / peak_flops, bytes / bandwidth)

and the ratio ``intensity = flops / bytes`` (FLOP per byte) decides which one wins: below the
chip's ridge point ``peak_flops / bandwidth`` a phase is memory-bound, above it compute-bound.

A third term matters for small work: every call pays a fixed cost (dispatch, kernel launch,
synchronisation) however few bytes and FLOPs it has. With it (``overhead=True``)::

    time = overhead + max(flops / peak_flops, bytes / bandwidth)

and :func:`regime` names the largest of the three: overhead-, memory- or compute-bound.

The FLOPs and bytes of each phase are counted in :mod:`inference_lab.analytic.costs`; this module
turns them into time on a machine.
"""

from __future__ import annotations

import math
from typing import Iterable

from inference_lab.analytic.costs import Cost, decode_cost, kv_cache_bytes, prefill_cost, weight_bytes, without_kv
from inference_lab.base import checks
from inference_lab.base.hardware import dtype_key

__all__ = [
    "ridge_point", "predict_terms", "predict_time", "bound", "overhead_seconds", "regime",
    "predicted_prefill_tokens_per_s", "predicted_prefill_seconds", "predicted_decode_step_seconds",
    "predicted_decode_tokens_per_s", "single_stream_decode_tokens_per_s", "predicted_flip",
    "measured_knee", "predicted_knee", "CEILING_NOISE", "beats_ceiling", "memory_needed", "SERVER_PREFILL_TOKENS", "fits", "max_batch", "allreduce_bytes", "allreduce_time", "flop_dtype",
]


# A measured rate may sit this far above its ceiling from timing noise alone; past it, the ceiling
# is impossible (measured in a busy spell) and every share of it is wrong.
CEILING_NOISE = 0.05


def beats_ceiling(achieved: float, ceiling: float) -> bool:
    """Whether a measured rate is past what its ceiling allows (by more than
    :data:`CEILING_NOISE`): then the ceiling, not the measurement, is wrong. Same units for both."""
    if not (math.isfinite(ceiling) and ceiling > 0 and math.isfinite(achieved) and achieved > 0):
        raise ValueError(f"ceiling={ceiling!r} and achieved={achieved!r} must be positive finite rates")
    return achieved > ceiling * (1 + CEILING_NOISE)


def flop_dtype(cfg, dtype=None) -> str:
    """The datasheet key of the dtype a model's FLOPs run in: its own unless ``dtype`` is given
    (``"bfloat16"``, ``"bf16"``, ...)."""
    return dtype_key(cfg.dtype if dtype is None else dtype)



# ----------------------------------------------------------------------------- the roofline
def ridge_point(spec, dtype="bf16") -> float:
    """FLOP per byte where compute time equals memory time: ``peak_flops / bandwidth``."""
    checks.hardware_spec(spec)
    return spec.peak_flops(dtype) / spec.bandwidth


def predict_terms(cost: Cost, spec, dtype="bf16") -> tuple[float, float]:
    """``(compute_seconds, memory_seconds)`` = ``(flops / peak, bytes / bandwidth)``."""
    checks.hardware_spec(spec)
    if not isinstance(cost, Cost):
        raise ValueError(f"cost={cost!r} must be a roofline.Cost (from prefill_cost/decode_cost)")
    return cost.flops / spec.peak_flops(dtype), cost.bytes / spec.bandwidth


def overhead_seconds(spec, overhead=True) -> float:
    """The fixed cost of one call: ``overhead=True`` reads ``spec.overhead_s`` (measured by
    :func:`inference_lab.base.hardware.measure_ceilings`; 0 for a datasheet preset, which has none),
    ``False`` is 0, a number is that many seconds."""
    if overhead is True:
        return float(getattr(spec, "overhead_s", None) or 0.0)
    if overhead is False or overhead is None:
        return 0.0
    if not overhead >= 0:
        raise ValueError(f"overhead={overhead!r}: pass True (the spec's measured overhead), False, or seconds >= 0")
    return float(overhead)


def predict_time(cost: Cost, spec, dtype="bf16", *, overhead=False) -> float:
    """Roofline time in seconds: the larger of ``flops / peak`` and ``bytes / bandwidth``.

    ``overhead=True`` adds the third term, the fixed cost of a call (``spec.overhead_s``; a
    number adds that many seconds): ``overhead + max(compute, memory)``. Small work is then
    *overhead-bound*: its time no longer shrinks with its FLOPs or bytes.
    """
    return overhead_seconds(spec, overhead) + max(predict_terms(cost, spec, dtype))


def bound(cost: Cost, spec, dtype="bf16") -> str:
    """``"compute"`` or ``"memory"``: which roofline term is larger for this work."""
    compute, memory = predict_terms(cost, spec, dtype)
    return "compute" if compute >= memory else "memory"


def regime(cost: Cost, spec, dtype="bf16", *, overhead=True) -> str:
    """``"overhead"``, ``"memory"`` or ``"compute"``: the largest of the three terms.

    The three regimes of one piece of work on one machine: the fixed cost of a call (launch,
    dispatch), the bytes over the bandwidth, the FLOPs over the peak.
    """
    fixed = overhead_seconds(spec, overhead)
    compute, memory = predict_terms(cost, spec, dtype)
    if fixed >= max(compute, memory):
        return "overhead"
    return "compute" if compute >= memory else "memory"


def predicted_prefill_seconds(cfg, spec, batch: int, prompt_len: int, dtype=None, *, tp: int = 1) -> float:
    """Roofline time to prefill ``batch`` prompts of ``prompt_len`` tokens (time to first token)."""
    return predict_time(prefill_cost(cfg, batch, prompt_len, tp=tp), spec, flop_dtype(cfg, dtype))


def predicted_prefill_tokens_per_s(cfg, spec, batch: int, prompt_len: int, dtype=None, *, tp: int = 1) -> float:
    """Prompt tokens per second of a roofline prefill (``batch * prompt_len / time``)."""
    return batch * prompt_len / predicted_prefill_seconds(cfg, spec, batch, prompt_len, dtype, tp=tp)


def predicted_decode_step_seconds(cfg, spec, batch: int, context: int, dtype=None, *, tp: int = 1,
                                  include_kv: bool = True) -> float:
    """Roofline time of one decode step; ``include_kv=False`` drops KV bytes and attention FLOPs."""
    cost = decode_cost(cfg, batch, context, tp=tp)
    if not include_kv:
        cost = without_kv(cost)
    return predict_time(cost, spec, flop_dtype(cfg, dtype))


def predicted_decode_tokens_per_s(cfg, spec, batch: int, context: int, dtype=None, *, tp: int = 1,
                                  include_kv: bool = True) -> float:
    """Generated tokens per second over the whole batch: ``batch / step time``."""
    return batch / predicted_decode_step_seconds(cfg, spec, batch, context, dtype, tp=tp,
                                                 include_kv=include_kv)


def single_stream_decode_tokens_per_s(cfg, spec) -> float:
    """The rule of thumb: batch-1 decode ~ ``bandwidth / model bytes`` tokens/s."""
    checks.hardware_spec(spec)
    return spec.bandwidth / weight_bytes(cfg)

def predicted_flip(cfg, spec, dtype=None, context: int = 1, include_kv: bool = True):
    """Smallest decode batch whose compute term reaches its memory term (the flip).

    One step of batch ``B``: compute ``B * f / peak`` against memory ``(W + B * k) / bw`` with
    ``f`` FLOPs and ``k`` bytes per sequence and ``W`` the weight bytes. They cross at
    ``B = (W / bw) / (f / peak - k / bw)``: near the ridge point without the KV term
    (``include_kv=False``: only weights, ~2 FLOP per parameter against ``dtype_bytes``), later
    with it, because each extra sequence also brings its own KV bytes. Returns ``None`` when
    the compute term never catches up (each sequence's KV bytes take longer than its math:
    at long context decode stays memory-bound at every batch).
    """
    checks.model_config(cfg)
    checks.hardware_spec(spec)
    context = checks.count("context", context)
    peak, bw = spec.peak_flops(flop_dtype(cfg, dtype)), spec.bandwidth
    one = decode_cost(cfg, 1, context)
    if not include_kv:
        one = without_kv(one)
    W = one.parts["weights"]
    f = one.flops
    k = one.bytes - W  # per-sequence bytes (embedding row, and KV when included)
    slope = f / peak - k / bw
    if slope <= 0:
        return None
    return max(1, math.ceil((W / bw) / slope - 1e-9))


def measured_knee(records: Iterable, factor: float = 1.5):
    """Smallest batch in a decode sweep whose step time is >= ``factor`` x the batch-1 time.

    ``records``: decode records of ONE sweep (one device, preset, context), read by attribute
    (``batch``, ``step_seconds``; records without ``step_seconds`` such as prefill records are
    skipped). Repeats of a batch size use their median. Returns ``None`` when no batch in the
    sweep reaches the threshold (the knee lies beyond the sweep).
    """
    if not factor > 1:
        raise ValueError(f"factor={factor!r} must be > 1 (1.5 is the lessons' definition)")
    by_batch: dict[int, list[float]] = {}
    contexts = set()
    for rec in records:
        if getattr(rec, "step_seconds", None) is None:
            continue
        by_batch.setdefault(int(rec.batch), []).append(float(rec.step_seconds))
        contexts.add((getattr(rec, "device", None), getattr(rec, "preset", None),
                      getattr(rec, "context", None)))
    if not by_batch:
        raise ValueError("records contain no decode records (with step_seconds): pass a decode sweep")
    if len(contexts) > 1:
        raise ValueError(
            f"records mix {len(contexts)} (device, preset, context) groups: pass one sweep, "
            "e.g. [r for r in records if r.context == 512]"
        )
    if 1 not in by_batch:
        raise ValueError("records have no batch-1 decode record: the knee is relative to batch 1; sweep batch 1 too")

    def median(xs):
        xs = sorted(xs)
        n = len(xs)
        return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])

    base = median(by_batch[1])
    for b in sorted(by_batch):
        if median(by_batch[b]) >= factor * base:
            return b
    return None


def predicted_knee(cfg, spec, context: int, dtype=None, *, tp: int = 1, factor: float = 1.5, include_kv: bool = True,
                   largest: int = 1 << 16):
    """The knee the roofline predicts: the smallest batch whose roofline step takes ``factor`` x the
    batch-1 step (the lessons' definition of a measured knee, :func:`measured_knee`, applied to the
    prediction). It is not the flip (:func:`predicted_flip`): with the KV term, a step can grow by
    ``factor`` while still memory-bound, because every sequence reads its own cache. None if no
    batch up to ``largest`` gets there."""
    context = checks.count("context", context)
    one = predicted_decode_step_seconds(cfg, spec, 1, context, dtype, tp=tp, include_kv=include_kv)

    def grown(b):
        return predicted_decode_step_seconds(cfg, spec, b, context, dtype, tp=tp, include_kv=include_kv) >= factor * one

    if not grown(largest):
        return None
    lo, hi = 1, largest       # not grown(lo), grown(hi): the step time only grows with the batch
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if grown(mid) else (mid, hi)
    return hi


# ----------------------------------------------------------------------------- memory
# How many prompt tokens a server prefills in one iteration: vLLM's `max_num_batched_tokens` for its
# OpenAI-compatible server on a GPU of 70 GiB or more that is not an A100 (H100, H200, MI300X), 8192;
# 2048 on smaller GPUs (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults). A server never holds
# the activations of every sequence's whole prompt at once: it prefills this many tokens per step.
SERVER_PREFILL_TOKENS = 8192


def memory_needed(cfg, batch: int, context: int, *, tp: int = 1, attention_scores: bool = False,
                  prefill_tokens: int | None = None) -> int:
    """Bytes of device memory to run ``batch`` sequences of ``context`` tokens.

    Weights (all stored parameters, the embedding included) + the KV cache + a working set: the
    largest activations of one prefill call (residual, q/k/v and the two MLP intermediates of one
    layer, for the tokens in that call) and the float32 logits of the batch. ``prefill_tokens``
    bounds the tokens of one call: None prefills every sequence's whole context at once (what the
    lab's own measurements do: one call over ``batch x context``); a server prefills a bounded
    number per iteration (:data:`SERVER_PREFILL_TOKENS`, as vLLM sizes it), so its working set does
    not grow with the batch. ``attention_scores=True`` adds the float32 scores that a non-flash
    (reference) attention materialises for those tokens against ``context`` keys. Per device when
    ``tp > 1``. An estimate for skipping sweeps that will not fit, not an allocator trace.
    """
    checks.model_config(cfg)
    tp = checks.tensor_parallel(cfg, tp)
    batch = checks.count("batch", batch)
    context = checks.count("context", context)
    tokens = batch * context
    if prefill_tokens is not None:
        tokens = min(tokens, checks.count("prefill_tokens", prefill_tokens))
    b = cfg.dtype_bytes
    weights = ((cfg.num_params - cfg.matmul_params) * b + cfg.matmul_weight_bytes) / tp   # quantized: as stored
    kv = kv_cache_bytes(cfg, batch, context, tp=tp)
    per_token = (2 * cfg.d_model + (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim / tp
                 + 2 * cfg.d_ff / tp) * b
    working = tokens * per_token + batch * cfg.vocab_size * 4
    if attention_scores:
        working += tokens * (cfg.n_heads // tp) * context * 4
    return int(math.ceil(weights + kv + working))


def fits(cfg, batch: int, context: int, spec, *, tp: int = 1, headroom: float = 0.9,
         prefill_tokens: int | None = SERVER_PREFILL_TOKENS) -> bool:
    """Whether :func:`memory_needed` fits in ``headroom`` x ``spec.memory_bytes``, for a server that
    prefills ``prefill_tokens`` tokens per iteration (None: every sequence at once)."""
    checks.hardware_spec(spec)
    if spec.memory_bytes is None:
        raise ValueError(f"spec {spec.name!r} has no memory_bytes; set it to test the fit")
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 < headroom <= 1:
        raise ValueError(f"headroom={headroom!r} must be in (0, 1]: the share of memory the server may use")
    return memory_needed(cfg, batch, context, tp=tp, prefill_tokens=prefill_tokens) <= headroom * spec.memory_bytes


def max_batch(cfg, spec, context: int, *, tp: int = 1, headroom: float = 0.9,
              prefill_tokens: int | None = SERVER_PREFILL_TOKENS) -> int:
    """The largest batch of ``context``-token sequences that :func:`fits` (0: not even one).

    What bounds a decode batch on a real device: the weights stay, every sequence brings its own
    KV cache (``context x kv_bytes_per_token``), and one iteration's working set (a prefill of at
    most ``prefill_tokens`` tokens) must fit beside them. Found by bisection on :func:`fits`
    itself, so the two always agree.
    """
    checks.model_config(cfg)
    context = checks.count("context", context)
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom={headroom!r} must be in (0, 1]: the share of memory the server may use")
    kw = dict(tp=tp, headroom=headroom, prefill_tokens=prefill_tokens)
    if not fits(cfg, 1, context, spec, **kw):
        return 0
    lo, hi = 1, 2
    while fits(cfg, hi, context, spec, **kw):
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # fits(lo) and not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(cfg, mid, context, spec, **kw) else (lo, mid)
    return lo


# ----------------------------------------------------------------------------- tensor parallel
def allreduce_bytes(cfg, batch: int, tokens: int = 1) -> float:
    """Bytes all-reduced per forward under tensor parallelism: 2 per layer of ``batch*tokens x d_model``.

    (After the attention output projection and after the MLP down projection.) ``tokens`` is
    1 for a decode step, the prompt length for a prefill.
    """
    checks.model_config(cfg)
    batch = checks.count("batch", batch)
    tokens = checks.count("tokens", tokens)
    return 2 * cfg.n_layers * batch * tokens * cfg.d_model * cfg.dtype_bytes


def allreduce_time(cfg, spec, batch: int, tokens: int = 1, *, tp: int = 2) -> float:
    """Seconds of those all-reduces: a latency per all-reduce plus the bytes over the interconnect.

    A ring all-reduce of ``n`` bytes sends ``2 (tp - 1) / tp * n`` bytes out of each device
    (a reduce-scatter then an all-gather) while receiving as many: the sends and receives
    run at the same time, in opposite directions. ``spec.interconnect_bandwidth`` is the
    datasheet figure, which counts BOTH directions (NVLink 900 GB/s on H100/H200 is
    450 GB/s each way), so the ring runs at half of it. Every all-reduce also pays a fixed
    latency (``spec.allreduce_latency_s``: launching it and the devices' handshakes), whatever
    its size, ``2 * n_layers`` of them per forward::

        time = 2 n_layers * latency + 2 (tp - 1) / tp * allreduce_bytes / (interconnect_bandwidth / 2)

    A decode step's messages are small (``batch x d_model`` values), so the latency term is
    usually the larger: it is what makes a small model's step *slower* with more devices.
    A spec without a latency figure counts bandwidth only.
    """
    checks.hardware_spec(spec)
    tp = checks.tensor_parallel(cfg, tp)
    if tp == 1:
        return 0.0
    if not spec.interconnect_bandwidth:
        raise ValueError(f"spec {spec.name!r} has no interconnect_bandwidth: set it to model tp > 1")
    one_direction = spec.interconnect_bandwidth / 2
    latency = 2 * cfg.n_layers * (spec.allreduce_latency_s or 0.0)
    return latency + 2 * (tp - 1) / tp * allreduce_bytes(cfg, batch, tokens) / one_direction
