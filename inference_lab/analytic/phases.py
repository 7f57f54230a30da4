"""How long a serving iteration takes: prefill of some prompts, one decode step, or a mixed
iteration (the decode step of every running sequence plus chunks of prompts, as chunked
prefill runs them).

A :class:`PhaseModel` is the simulator's only view of the hardware. Build it from the
roofline of a model on a chip (:func:`roofline_phases`) or fit it to your own measured
records (:func:`measured_phases`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Sequence

import numpy as np

from inference_lab.analytic import costs
from inference_lab.base.hardware import dtype_key
from inference_lab.base import checks

__all__ = ["PhaseModel", "roofline_phases", "measured_phases"]


@dataclasses.dataclass(frozen=True)
class PhaseModel:
    """How long each kind of serving iteration takes.

    ``prefill_seconds(prompt_lens)``: one prefill iteration over those prompts (one pass).
    ``decode_seconds(batch, total_context)``: one decode step of ``batch`` sequences holding
    ``total_context`` cached tokens between them.
    ``kv_bytes_per_token``: KV-cache bytes per prompt token, for the transfer between pools
    (``None``: unknown; the disaggregated mode then refuses to run).
    ``mixed_seconds(batch, total_context, chunks)``: one iteration that decodes ``batch``
    sequences and also prefills ``chunks``, a list of ``(new_tokens, cached_tokens)`` (a piece
    of a prompt and how much of that prompt is already in the cache). ``None``: estimated by
    :meth:`iteration_seconds` from the other two.
    """

    prefill_seconds: Callable[[Sequence[int]], float]
    decode_seconds: Callable[[int, int], float]
    kv_bytes_per_token: float | None = None
    description: str = ""
    mixed_seconds: Callable[[int, int, Sequence[tuple[int, int]]], float] | None = None
    max_seq_len: int | None = None   # the model's context, when known: the simulator refuses longer requests

    def iteration_seconds(self, batch: int, total_context: int, chunks: Sequence[tuple[int, int]] = ()) -> float:
        """One chunked-prefill iteration: ``batch`` decode rows plus prompt ``chunks``.

        Without ``mixed_seconds`` the iteration is one pass over ``batch + sum(new tokens)``
        rows: as long as the longer of that many prompt tokens' prefill and the decode step
        alone (the weights are read once for both).
        """
        if self.mixed_seconds is not None:
            return self.mixed_seconds(batch, total_context, chunks)
        if not chunks:
            return self.decode_seconds(batch, total_context)
        rows = batch + sum(int(c) for c, _ in chunks)
        pre = self.prefill_seconds([rows])
        return max(pre, self.decode_seconds(batch, total_context)) if batch else pre


def _efficiency(name: str, value) -> float:
    value = checks.positive(name, value)
    if value > 1:
        raise ValueError(f"{name}={value!r} must be a fraction in (0, 1]: the share of the peak reached")
    return value


def roofline_phases(cfg, spec, dtype=None, *, step_overhead_s: float = 0.0, mfu: float = 1.0,
                    mbu: float = 1.0) -> PhaseModel:
    """Phase times from :mod:`inference_lab.analytic.roofline` (same formulas, summed over a mixed batch).

    Every iteration, whatever its mix, takes ``max(flops / (peak * mfu), bytes / (bandwidth *
    mbu)) + step_overhead_s``. ``mfu``/``mbu``: the fraction of the datasheet FLOP/s and
    bandwidth a real engine reaches (1.0, the default, is the roofline itself; H100 engines
    reach roughly 0.4-0.7 of the FLOP/s in prefill). ``step_overhead_s`` adds a fixed cost per
    iteration (kernel launches, Python); real engines pay tens of microseconds to milliseconds.
    """
    checks.model_config(cfg)
    checks.hardware_spec(spec)
    step_overhead_s = checks.finite("step_overhead_s", step_overhead_s, 0.0)   # NaN would make every latency NaN
    mfu, mbu = _efficiency("mfu", mfu), _efficiency("mbu", mbu)
    dt = dtype_key(cfg.dtype if dtype is None else dtype)
    peak, bw = spec.peak_flops(dt) * mfu, spec.bandwidth * mbu
    head = cfg.vocab_size * cfg.d_model
    body = cfg.matmul_params - head
    attn = 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim  # FLOPs per (query, key) pair, all layers
    W = costs.weight_bytes(cfg)
    kv_tok = costs.kv_bytes_per_token(cfg)
    row = cfg.d_model * cfg.dtype_bytes

    params = cfg.matmul_params

    def mixed_seconds(batch, total_context, chunks=()):
        # decode rows: one new token each, attending to its context and itself
        flops = 2.0 * params * batch + attn * (total_context + batch)
        nbytes = W + batch * (row + kv_tok) + total_context * kv_tok
        for new, cached in chunks:
            # a chunk: its tokens through the body, one logits row, attention to the cached
            # prefix and causally within itself; it writes its K/V and reads the prefix's
            flops += 2.0 * body * new + 2.0 * head + attn * (new * cached + new * (new + 1) / 2)
            nbytes += new * (kv_tok + row) + cached * kv_tok
        compute, memory = flops / peak, nbytes / bw
        return (compute if compute > memory else memory) + step_overhead_s

    def prefill_seconds(prompt_lens):
        return mixed_seconds(0, 0, [(t, 0) for t in prompt_lens])

    def decode_seconds(batch, total_context):
        return mixed_seconds(batch, total_context)

    eff = "" if mfu == mbu == 1.0 else f", {mfu:.0%} of peak FLOP/s, {mbu:.0%} of bandwidth"
    return PhaseModel(prefill_seconds, decode_seconds, kv_tok,
                      f"roofline of {cfg.name} on {spec.name} ({dt}{eff})", mixed_seconds, max_seq_len=cfg.max_seq_len)


def _extrapolating_interp(x, xs, ys):
    """Piecewise-linear through the points, continued linearly past the last one."""
    if len(xs) == 1:
        return ys[0] * x / xs[0]  # one point: proportional
    if x <= xs[-1]:
        return float(np.interp(x, xs, ys))
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return float(ys[-1] + max(slope, 0.0) * (x - xs[-1]))


def measured_phases(records: Iterable, *, cfg=None, kv_bytes_per_token: float | None = None) -> PhaseModel:
    """Phase times fitted to measured records (read by attribute).

    Prefill: seconds against prompt tokens in the pass (``batch * prompt_len``), piecewise
    linear through the medians. Decode: ``step_seconds`` against batch, the same way, at the
    records' context (context dependence is not fitted: measure at a context like the
    workload's). The KV bytes per token come from ``cfg`` or ``kv_bytes_per_token``.
    """
    pre: dict[int, list[float]] = {}
    dec: dict[int, list[float]] = {}
    for r in records:
        if getattr(r, "step_seconds", None) is not None:
            dec.setdefault(int(r.batch), []).append(float(r.step_seconds))
        elif getattr(r, "seconds", None) is not None and getattr(r, "prompt_len", None):
            pre.setdefault(int(r.batch) * int(r.prompt_len), []).append(float(r.seconds))
    if not pre or not dec:
        raise ValueError("records need prefill records (seconds) and decode records (step_seconds)")
    if cfg is not None:
        kv_bytes_per_token = costs.kv_bytes_per_token(cfg)
    elif kv_bytes_per_token is not None:
        kv_bytes_per_token = checks.positive("kv_bytes_per_token", kv_bytes_per_token)
    pxs = sorted(pre)
    pys = [float(np.median(pre[x])) for x in pxs]
    dxs = sorted(dec)
    dys = [float(np.median(dec[x])) for x in dxs]

    def prefill_seconds(prompt_lens):
        return _extrapolating_interp(float(sum(prompt_lens)), pxs, pys)

    def decode_seconds(batch, total_context):
        return _extrapolating_interp(float(batch), dxs, dys)

    return PhaseModel(prefill_seconds, decode_seconds, kv_bytes_per_token,
                      f"measured: {len(pxs)} prefill sizes, {len(dxs)} decode batches")
