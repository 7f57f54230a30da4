"""The analytic model every lesson predicts with: FLOPs and bytes per phase, and the roofline.

A forward pass does two things that take time: arithmetic (FLOPs, limited by the chip's peak
FLOP/s) and moving bytes between HBM and the chip (limited by memory bandwidth). The roofline
model says a kernel takes the *larger* of the two times::

    time = max(flops / peak_flops, bytes / bandwidth)

and the ratio ``intensity = flops / bytes`` (FLOP per byte) decides which one wins: below the
chip's ridge point ``peak_flops / bandwidth`` a phase is memory-bound, above it compute-bound.

What is counted (``cfg`` is a :class:`~inference_lab.config.ModelConfig`, ``b`` its
``dtype_bytes``, ``L`` layers, ``Hq``/``Hkv`` query/KV heads of ``head_dim`` ``D``):

* **Matmul FLOPs**: 2 per matmul parameter per token (one multiply, one add). The matmul
  parameters are every block's q, k, v, o and three MLP matrices plus the output head
  (``cfg.matmul_params``). The input embedding is a gather, not a matmul: no FLOPs.
* **Attention FLOPs**: ``QK^T`` and ``PV`` each cost ``2 * Hq * D`` per (query, key) pair, so
  ``4 * Hq * D * keys`` per query token per layer. A decode step's query attends to
  ``context + 1`` keys (the cache plus itself); a causal prefill of ``T`` tokens attends to
  ``1 + 2 + ... + T = T (T + 1) / 2`` keys in all, ``(T + 1) / 2`` per token on average.
* **Weight bytes**: every weight matrix read once per forward, whatever the batch (the
  output head included, and the RMSNorm scales, which are tiny); of the input embedding only
  the rows gathered for the tokens in flight.
* **KV bytes**: ``2 * L * Hkv * D * b`` per token of cache (K and V, every layer). A decode
  step reads ``context`` tokens of cache per sequence and writes one new token's K/V; a
  prefill writes ``T`` tokens per sequence and reads nothing from HBM (its keys are computed
  in the same pass; a flash kernel keeps them on chip).
* **Not counted**: activations (the residual stream, MLP intermediates, logits) that pass
  between kernels. They are small in decode, and in prefill they do not move the verdict
  (prefill of a few hundred tokens is far above any ridge). Softmax, norms, RoPE and the
  SwiGLU gate cost O(d) per token against O(d^2): dropped.

:func:`decode_cost` is the ONE definition of the bytes of a decode step, the numerator of MBU
everywhere (MBU = ``decode_cost(...).bytes / measured step time / measured bandwidth``).

Tensor parallelism (``tp`` arguments, default 1): with a Megatron split every matrix, the KV
cache (by KV heads), the embedding and head (by vocabulary) are divided by ``tp``, so the
per-device FLOPs and bytes are the totals over ``tp``; each block then adds two all-reduces
of ``batch x tokens x d_model`` activations (:func:`allreduce_bytes`, :func:`allreduce_time`,
which runs the ring at half the datasheet interconnect figure: that figure counts both
directions).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable

from inference_lab.hardware import dtype_key

__all__ = [
    "Cost", "weight_bytes", "kv_bytes_per_token", "kv_cache_bytes", "prefill_cost",
    "decode_cost", "forward_cost_no_attention", "forward_intensity", "ridge_point",
    "predict_terms", "predict_time", "bound", "predicted_prefill_tokens_per_s",
    "predicted_prefill_seconds", "predicted_decode_step_seconds",
    "predicted_decode_tokens_per_s", "single_stream_decode_tokens_per_s", "predicted_flip",
    "measured_knee", "memory_needed", "fits", "allreduce_bytes", "allreduce_time",
]


# ----------------------------------------------------------------------------- the Cost type
@dataclasses.dataclass(frozen=True)
class Cost:
    """FLOPs and HBM bytes of one piece of work, with where they come from.

    ``parts`` breaks both down: byte keys ``"weights"``, ``"embedding_rows"``, ``"kv_read"``,
    ``"kv_write"`` and FLOP keys ``"matmul"``, ``"attention"`` (absent keys are zero).
    ``flops`` equals the sum of the FLOP parts and ``bytes`` the sum of the byte parts.
    """

    flops: float
    bytes: float
    parts: dict = dataclasses.field(default_factory=dict, hash=False)

    BYTE_PARTS = ("weights", "embedding_rows", "kv_read", "kv_write", "activations")
    FLOP_PARTS = ("matmul", "attention")

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte moved."""
        return self.flops / self.bytes if self.bytes else math.inf

    def __add__(self, other: "Cost") -> "Cost":
        if not isinstance(other, Cost):
            return NotImplemented
        parts = dict(self.parts)
        for key, value in other.parts.items():
            parts[key] = parts.get(key, 0.0) + value
        return Cost(self.flops + other.flops, self.bytes + other.bytes, parts)

    def __mul__(self, k: float) -> "Cost":
        """``k`` repetitions of the same work (e.g. the steps of a generation)."""
        return Cost(self.flops * k, self.bytes * k, {n: v * k for n, v in self.parts.items()})

    __rmul__ = __mul__


def _cost(**parts: float) -> Cost:
    flops = sum(v for k, v in parts.items() if k in Cost.FLOP_PARTS)
    nbytes = sum(v for k, v in parts.items() if k in Cost.BYTE_PARTS)
    return Cost(float(flops), float(nbytes), {k: float(v) for k, v in parts.items()})


# ----------------------------------------------------------------------------- validation
def _check_count(name: str, value, minimum: int = 1) -> int:
    # ints and numpy integers pass; floats, bools and strings do not (a batch of 2.5 is a bug)
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")
    value = value.__index__()
    if value < minimum:
        raise ValueError(f"{name}={value} must be an integer >= {minimum}")
    return value


def _check_cfg(cfg) -> None:
    for field in ("n_layers", "n_heads", "n_kv_heads", "head_dim", "d_model", "vocab_size",
                  "matmul_params", "dtype_bytes"):
        if not hasattr(cfg, field):
            raise ValueError(
                f"cfg={cfg!r} is not a ModelConfig (it lacks {field!r}); "
                "pass inference_lab.ModelConfig.preset(name)"
            )


def _check_tp(cfg, tp) -> int:
    tp = _check_count("tp", tp)
    if cfg.n_kv_heads % tp or cfg.n_heads % tp:
        raise ValueError(
            f"tp={tp} must divide n_heads={cfg.n_heads} and n_kv_heads={cfg.n_kv_heads} "
            "(the tensor-parallel split gives each device whole heads)"
        )
    return tp


def _check_spec(spec) -> None:
    if not (hasattr(spec, "peak_flops") and hasattr(spec, "bandwidth")):
        raise ValueError(
            f"spec={spec!r} is not a HardwareSpec; pass hardware.PRESETS[name] or "
            "hardware.measure_ceilings()"
        )


def _dtype(cfg, dtype):
    """The FLOP dtype: the model's own unless given (``"bfloat16"``, ``"bf16"``, ...)."""
    return dtype_key(cfg.dtype if dtype is None else dtype)


# ----------------------------------------------------------------------------- sizes
def weight_bytes(cfg, *, tp: int = 1) -> float:
    """Bytes of weights one forward reads: every matrix once (layers + output head) + norms.

    The input embedding is not included (a forward reads only the rows it gathers). With
    ``tp`` devices each holds and reads ``1/tp`` of the matrices; norms are replicated.
    """
    _check_cfg(cfg)
    tp = _check_tp(cfg, tp)
    norms = (2 * cfg.n_layers + 1) * cfg.d_model
    return (cfg.matmul_params / tp + norms) * cfg.dtype_bytes


def kv_bytes_per_token(cfg, *, tp: int = 1) -> float:
    """Bytes of K and V for one token across all layers: ``2 * L * Hkv * D * dtype_bytes``."""
    _check_cfg(cfg)
    tp = _check_tp(cfg, tp)
    return 2 * cfg.n_layers * (cfg.n_kv_heads // tp) * cfg.head_dim * cfg.dtype_bytes


def kv_cache_bytes(cfg, batch: int, context: int, *, tp: int = 1) -> float:
    """Bytes of a KV cache holding ``context`` tokens for each of ``batch`` sequences."""
    batch = _check_count("batch", batch)
    context = _check_count("context", context)
    return batch * context * kv_bytes_per_token(cfg, tp=tp)


# ----------------------------------------------------------------------------- phase costs
def prefill_cost(cfg, batch: int, prompt_len: int, *, logits: str = "last", tp: int = 1) -> Cost:
    """FLOPs and bytes of prefilling ``batch`` prompts of ``prompt_len`` tokens (one pass).

    Bytes: weights once + the gathered embedding rows + the KV cache written.
    FLOPs: 2 per matmul parameter per token + causal attention (``T (T + 1) / 2`` keys).
    ``logits="last"`` (default, as ``engine.prefill`` returns only each row's last logits)
    applies the output head to one token per row; ``"all"`` to every prompt token.
    Per device when ``tp > 1``.
    """
    _check_cfg(cfg)
    tp = _check_tp(cfg, tp)
    batch = _check_count("batch", batch)
    prompt_len = _check_count("prompt_len", prompt_len)
    if logits not in ("last", "all"):
        raise ValueError(f"logits={logits!r}: use 'last' (head on each row's last token) or 'all'")
    tokens = batch * prompt_len
    head = cfg.vocab_size * cfg.d_model
    body = cfg.matmul_params - head  # the L blocks' matrices
    head_tokens = batch if logits == "last" else tokens
    matmul = 2 * (body * tokens + head * head_tokens) / tp
    keys = batch * prompt_len * (prompt_len + 1) / 2  # causal: query i sees keys 1..i
    attention = 4 * cfg.n_layers * (cfg.n_heads // tp) * cfg.head_dim * keys
    return _cost(
        matmul=matmul,
        attention=attention,
        weights=weight_bytes(cfg, tp=tp),
        embedding_rows=tokens * cfg.d_model * cfg.dtype_bytes / tp,
        kv_write=tokens * kv_bytes_per_token(cfg, tp=tp),
    )


def decode_cost(cfg, batch: int, context: int, *, tp: int = 1) -> Cost:
    """FLOPs and bytes of ONE decode step: ``batch`` sequences, ``context`` tokens cached each.

    This is the definition of a decode step's bytes (the MBU numerator): every weight matrix
    once (output head included) + ``batch`` gathered embedding rows + the KV cache read
    (``context`` tokens per sequence) + the new token's K/V written. FLOPs: 2 per matmul
    parameter per sequence + attention over ``context + 1`` keys (the cache and the new token).
    """
    _check_cfg(cfg)
    tp = _check_tp(cfg, tp)
    batch = _check_count("batch", batch)
    context = _check_count("context", context)
    kv_tok = kv_bytes_per_token(cfg, tp=tp)
    return _cost(
        matmul=2 * cfg.matmul_params * batch / tp,
        attention=4 * cfg.n_layers * (cfg.n_heads // tp) * cfg.head_dim * (context + 1) * batch,
        weights=weight_bytes(cfg, tp=tp),
        embedding_rows=batch * cfg.d_model * cfg.dtype_bytes / tp,
        kv_read=batch * context * kv_tok,
        kv_write=batch * kv_tok,
    )


def forward_cost_no_attention(cfg, n_tokens: int) -> Cost:
    """The brief's approximation: a forward over ``n_tokens`` with attention and KV dropped.

    FLOPs ``2 * N * P`` (``P`` matmul parameters) over the weight bytes ``P * dtype_bytes``:
    intensity ~ ``N`` FLOP/byte in 2-byte precision (``N / 2`` in float32).
    """
    _check_cfg(cfg)
    n_tokens = _check_count("n_tokens", n_tokens)
    return _cost(matmul=2 * cfg.matmul_params * n_tokens, weights=weight_bytes(cfg))


def forward_intensity(cfg, n_tokens: int) -> float:
    """FLOP per byte of :func:`forward_cost_no_attention` (about ``n_tokens`` in bf16)."""
    return forward_cost_no_attention(cfg, n_tokens).intensity


# ----------------------------------------------------------------------------- the roofline
def ridge_point(spec, dtype="bf16") -> float:
    """FLOP per byte where compute time equals memory time: ``peak_flops / bandwidth``."""
    _check_spec(spec)
    return spec.peak_flops(dtype) / spec.bandwidth


def predict_terms(cost: Cost, spec, dtype="bf16") -> tuple[float, float]:
    """``(compute_seconds, memory_seconds)`` = ``(flops / peak, bytes / bandwidth)``."""
    _check_spec(spec)
    if not isinstance(cost, Cost):
        raise ValueError(f"cost={cost!r} must be a roofline.Cost (from prefill_cost/decode_cost)")
    return cost.flops / spec.peak_flops(dtype), cost.bytes / spec.bandwidth


def predict_time(cost: Cost, spec, dtype="bf16") -> float:
    """Roofline time in seconds: the larger of ``flops / peak`` and ``bytes / bandwidth``."""
    return max(predict_terms(cost, spec, dtype))


def bound(cost: Cost, spec, dtype="bf16") -> str:
    """``"compute"`` or ``"memory"``: which roofline term is larger for this work."""
    compute, memory = predict_terms(cost, spec, dtype)
    return "compute" if compute >= memory else "memory"


def predicted_prefill_seconds(cfg, spec, batch: int, prompt_len: int, dtype=None, *, tp: int = 1) -> float:
    """Roofline time to prefill ``batch`` prompts of ``prompt_len`` tokens (time to first token)."""
    return predict_time(prefill_cost(cfg, batch, prompt_len, tp=tp), spec, _dtype(cfg, dtype))


def predicted_prefill_tokens_per_s(cfg, spec, batch: int, prompt_len: int, dtype=None, *, tp: int = 1) -> float:
    """Prompt tokens per second of a roofline prefill (``batch * prompt_len / time``)."""
    return batch * prompt_len / predicted_prefill_seconds(cfg, spec, batch, prompt_len, dtype, tp=tp)


def predicted_decode_step_seconds(cfg, spec, batch: int, context: int, dtype=None, *, tp: int = 1,
                                  include_kv: bool = True) -> float:
    """Roofline time of one decode step; ``include_kv=False`` drops KV bytes and attention FLOPs."""
    cost = decode_cost(cfg, batch, context, tp=tp)
    if not include_kv:
        cost = _without_kv(cost)
    return predict_time(cost, spec, _dtype(cfg, dtype))


def predicted_decode_tokens_per_s(cfg, spec, batch: int, context: int, dtype=None, *, tp: int = 1,
                                  include_kv: bool = True) -> float:
    """Generated tokens per second over the whole batch: ``batch / step time``."""
    return batch / predicted_decode_step_seconds(cfg, spec, batch, context, dtype, tp=tp,
                                                 include_kv=include_kv)


def single_stream_decode_tokens_per_s(cfg, spec) -> float:
    """The brief's rule of thumb: batch-1 decode ~ ``bandwidth / model bytes`` tokens/s."""
    _check_spec(spec)
    return spec.bandwidth / weight_bytes(cfg)


def _without_kv(cost: Cost) -> Cost:
    parts = {k: v for k, v in cost.parts.items() if k not in ("kv_read", "kv_write", "attention")}
    return _cost(**parts)


def predicted_flip(cfg, spec, dtype=None, context: int = 1, include_kv: bool = True):
    """Smallest decode batch whose compute term reaches its memory term (ARCHITECTURE's flip).

    One step of batch ``B``: compute ``B * f / peak`` against memory ``(W + B * k) / bw`` with
    ``f`` FLOPs and ``k`` bytes per sequence and ``W`` the weight bytes. They cross at
    ``B = (W / bw) / (f / peak - k / bw)``: near the ridge point without the KV term
    (``include_kv=False``: only weights, ~2 FLOP per parameter against ``dtype_bytes``), later
    with it, because each extra sequence also brings its own KV bytes. Returns ``None`` when
    the compute term never catches up (each sequence's KV bytes take longer than its math:
    at long context decode stays memory-bound at every batch).
    """
    _check_cfg(cfg)
    _check_spec(spec)
    context = _check_count("context", context)
    peak, bw = spec.peak_flops(_dtype(cfg, dtype)), spec.bandwidth
    one = decode_cost(cfg, 1, context)
    if not include_kv:
        one = _without_kv(one)
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


# ----------------------------------------------------------------------------- memory
def memory_needed(cfg, batch: int, context: int, *, tp: int = 1, attention_scores: bool = False) -> int:
    """Bytes of device memory to run ``batch`` sequences of ``context`` tokens.

    Weights (all stored parameters, the embedding included) + the KV cache + a working set:
    the largest activations of a prefill of ``context`` tokens (residual, q/k/v and the two
    MLP intermediates of one layer) and the float32 logits. ``attention_scores=True`` adds the
    ``batch x Hq x context x context`` float32 scores that a non-flash (reference) attention
    materialises. Per device when ``tp > 1``. An estimate for skipping sweeps that will not
    fit, not an allocator trace.
    """
    _check_cfg(cfg)
    tp = _check_tp(cfg, tp)
    batch = _check_count("batch", batch)
    context = _check_count("context", context)
    b = cfg.dtype_bytes
    weights = cfg.num_params * b / tp
    kv = kv_cache_bytes(cfg, batch, context, tp=tp)
    tokens = batch * context
    per_token = (2 * cfg.d_model + (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim / tp
                 + 2 * cfg.d_ff / tp) * b
    working = tokens * per_token + batch * cfg.vocab_size * 4
    if attention_scores:
        working += batch * (cfg.n_heads // tp) * context * context * 4
    return int(math.ceil(weights + kv + working))


def fits(cfg, batch: int, context: int, spec, *, tp: int = 1, headroom: float = 0.9) -> bool:
    """Whether :func:`memory_needed` fits in ``headroom`` x ``spec.memory_bytes``."""
    _check_spec(spec)
    if spec.memory_bytes is None:
        raise ValueError(f"spec {spec.name!r} has no memory_bytes; set it to test the fit")
    return memory_needed(cfg, batch, context, tp=tp) <= headroom * spec.memory_bytes


# ----------------------------------------------------------------------------- tensor parallel
def allreduce_bytes(cfg, batch: int, tokens: int = 1) -> float:
    """Bytes all-reduced per forward under tensor parallelism: 2 per layer of ``batch*tokens x d_model``.

    (After the attention output projection and after the MLP down projection.) ``tokens`` is
    1 for a decode step, the prompt length for a prefill.
    """
    _check_cfg(cfg)
    batch = _check_count("batch", batch)
    tokens = _check_count("tokens", tokens)
    return 2 * cfg.n_layers * batch * tokens * cfg.d_model * cfg.dtype_bytes


def allreduce_time(cfg, spec, batch: int, tokens: int = 1, *, tp: int = 2) -> float:
    """Seconds of those all-reduces over the interconnect with a ring, at one link direction.

    A ring all-reduce of ``n`` bytes sends ``2 (tp - 1) / tp * n`` bytes out of each device
    (a reduce-scatter then an all-gather) while receiving as many: the sends and receives
    run at the same time, in opposite directions. ``spec.interconnect_bandwidth`` is the
    datasheet figure, which counts BOTH directions (NVLink 900 GB/s on H100/H200 is
    450 GB/s each way), so the ring runs at half of it::

        time = 2 (tp - 1) / tp * allreduce_bytes / (interconnect_bandwidth / 2)

    Latency is ignored (it dominates tiny decode messages in practice: a few microseconds
    per all-reduce, ``2 * n_layers`` of them per step).
    """
    _check_spec(spec)
    tp = _check_tp(cfg, tp)
    if tp == 1:
        return 0.0
    if not spec.interconnect_bandwidth:
        raise ValueError(f"spec {spec.name!r} has no interconnect_bandwidth: set it to model tp > 1")
    one_direction = spec.interconnect_bandwidth / 2
    return 2 * (tp - 1) / tp * allreduce_bytes(cfg, batch, tokens) / one_direction
