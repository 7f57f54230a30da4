"""FLOPs and bytes of each phase: what the roofline (:mod:`inference_lab.analytic.roofline`) divides.

What is counted (``cfg`` is a :class:`~inference_lab.base.config.ModelConfig`, ``b`` its
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

from inference_lab.base import checks

__all__ = ["Cost", "weight_bytes", "kv_bytes_per_token", "attention_intensity", "kv_cache_bytes", "prefill_cost", "decode_cost",
           "verify_cost", "decode_loop_cost", "forward_cost_no_attention", "without_kv", "forward_intensity"]


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


# ----------------------------------------------------------------------------- sizes
def weight_bytes(cfg, *, tp: int = 1) -> float:
    """Bytes of weights one forward reads: every matrix once (layers + output head) + norms.

    The input embedding is not included (a forward reads only the rows it gathers). With
    ``tp`` devices each holds and reads ``1/tp`` of the matrices; norms are replicated.
    """
    checks.model_config(cfg)
    tp = checks.tensor_parallel(cfg, tp)
    norms = (2 * cfg.n_layers + 1) * cfg.d_model
    return cfg.matmul_weight_bytes / tp + norms * cfg.dtype_bytes   # quantized matrices: their stored bytes


def kv_bytes_per_token(cfg, *, tp: int = 1) -> float:
    """Bytes of K and V for one token across all layers: ``2 * L * Hkv * D * b`` with ``b`` the
    cache's bytes per element (``cfg.kv_bytes_per_element``: the dtype's, or int8 and its scales)."""
    checks.model_config(cfg)
    tp = checks.tensor_parallel(cfg, tp)
    return 2 * cfg.n_layers * (cfg.n_kv_heads // tp) * cfg.head_dim * cfg.kv_bytes_per_element


def attention_intensity(cfg) -> float:
    """FLOPs per KV-cache byte of decode attention: ``4 Hq D`` FLOPs per cached token per
    layer over ``2 Hkv D b`` bytes = ``2 Hq / (Hkv b)``. Long context pulls a decode step's
    intensity toward this, from below at small batch, from above at large."""
    checks.model_config(cfg)
    return 2 * cfg.n_heads / (cfg.n_kv_heads * cfg.kv_bytes_per_element)


def kv_cache_bytes(cfg, batch: int, context: int, *, tp: int = 1) -> float:
    """Bytes of a KV cache holding ``context`` tokens for each of ``batch`` sequences."""
    batch = checks.count("batch", batch)
    context = checks.count("context", context)
    return batch * context * kv_bytes_per_token(cfg, tp=tp)


# ----------------------------------------------------------------------------- phase costs
def prefill_cost(cfg, batch: int, prompt_len: int, *, logits: str = "last", tp: int = 1) -> Cost:
    """FLOPs and bytes of prefilling ``batch`` prompts of ``prompt_len`` tokens (one pass).

    Bytes: weights once + the gathered embedding rows + the KV cache written.
    FLOPs: 2 per matmul parameter per token + causal attention (``T (T + 1) / 2`` keys).
    ``logits="last"`` (default, as ``generation.prefill`` returns only each row's last logits)
    applies the output head to one token per row; ``"all"`` to every prompt token.
    Per device when ``tp > 1``.
    """
    checks.model_config(cfg)
    tp = checks.tensor_parallel(cfg, tp)
    batch = checks.count("batch", batch)
    prompt_len = checks.count("prompt_len", prompt_len)
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
    checks.model_config(cfg)
    tp = checks.tensor_parallel(cfg, tp)
    batch = checks.count("batch", batch)
    context = checks.count("context", context)
    kv_tok = kv_bytes_per_token(cfg, tp=tp)
    return _cost(
        matmul=2 * cfg.matmul_params * batch / tp,
        attention=4 * cfg.n_layers * (cfg.n_heads // tp) * cfg.head_dim * (context + 1) * batch,
        weights=weight_bytes(cfg, tp=tp),
        embedding_rows=batch * cfg.d_model * cfg.dtype_bytes / tp,
        kv_read=batch * context * kv_tok,
        kv_write=batch * kv_tok,
    )


def verify_cost(cfg, batch: int, context: int, tokens: int, *, tp: int = 1, cache_once: bool = False) -> Cost:
    """FLOPs and bytes of ONE verify step (speculative decoding's check, ``generation.verify``):
    ``tokens`` new tokens per row after ``context`` cached ones, in one forward.

    The weights are read once for all ``batch x tokens`` tokens (so a verify of a few tokens
    costs the bytes of one decode step); every token costs its matmul FLOPs and the head (each
    position's logits are checked); token ``j`` attends to ``context + j + 1`` keys. The lab's
    verify runs the decode-attention kernel once per new token, so the cache is read ``tokens``
    times (small next to the weights at a short context). ``cache_once=True`` is a production
    verify (vLLM's: one attention kernel for all the new tokens of a row), which reads it once.
    ``tokens=1`` is :func:`decode_cost`.
    """
    tokens = checks.count("tokens", tokens)
    step = decode_cost(cfg, batch, context, tp=tp)
    if tokens == 1:
        return step
    keys = tokens * context + tokens * (tokens + 1) / 2       # per row, over the new tokens
    return _cost(
        matmul=step.parts["matmul"] * tokens,
        attention=4 * cfg.n_layers * (cfg.n_heads // tp) * cfg.head_dim * keys * batch,
        weights=step.parts["weights"],
        embedding_rows=step.parts["embedding_rows"] * tokens,
        kv_read=step.parts["kv_read"] * (1 if cache_once else tokens),
        kv_write=step.parts["kv_write"] * tokens,
    )


def decode_loop_cost(cfg, batch: int, context: int, steps: int, *, tp: int = 1) -> Cost:
    """The mean cost of one step of a timed loop of ``steps`` decode steps from ``context``
    cached tokens (step ``i`` attends to ``context + i + 1`` keys): what a measured step time
    is compared with. The cost is linear in the context, so the mean of the first and last
    steps is the mean of them all, in constant time (a file claiming a billion steps is as
    quick to check as one claiming 32)."""
    steps = checks.count("steps", steps)
    first = decode_cost(cfg, batch, context, tp=tp)
    last = decode_cost(cfg, batch, context + steps - 1, tp=tp)
    return (first + last) * 0.5


def forward_cost_no_attention(cfg, n_tokens: int) -> Cost:
    """The first approximation: a forward over ``n_tokens`` with attention and KV dropped.

    FLOPs ``2 * N * P`` (``P`` matmul parameters) over the weight bytes ``P * dtype_bytes``:
    intensity ~ ``N`` FLOP/byte in 2-byte precision (``N / 2`` in float32).
    """
    checks.model_config(cfg)
    n_tokens = checks.count("n_tokens", n_tokens)
    return _cost(matmul=2 * cfg.matmul_params * n_tokens, weights=weight_bytes(cfg))


def forward_intensity(cfg, n_tokens: int) -> float:
    """FLOP per byte of :func:`forward_cost_no_attention` (about ``n_tokens`` in bf16)."""
    return forward_cost_no_attention(cfg, n_tokens).intensity


def without_kv(cost: Cost) -> Cost:
    """``cost`` without its KV-cache bytes and attention FLOPs: the weights-only first approximation."""
    parts = {k: v for k, v in cost.parts.items() if k not in ("kv_read", "kv_write", "attention")}
    return _cost(**parts)
