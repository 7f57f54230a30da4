"""Why output tokens cost more: token prices from throughput. Pure Python + numpy.

**Prices from throughput.** A GPU rented at ``$ per hour`` that does ``tokens/s`` of some
   phase costs ``$ / 3600 / (tokens/s) * 1e6`` per million of those tokens. Prefill is
   compute-bound even for one request, so input tokens are cheap at any batch; decode is
   cheap per token only when many sequences share each weight read. The ratio of the two
   prices, derived from a datasheet (:func:`predicted_token_prices`, with the fraction of peak
   FLOP/s prefill reaches stated as ``prefill_mfu``) or from your own records
   (:func:`measured_token_prices`), is why providers charge 3-5x more for output.

The serving simulation (prefill and decode sharing GPUs or split into pools) lives in
:mod:`inference_lab.analytic.simulator`.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np

from inference_lab.analytic import costs, roofline
from inference_lab.base import checks
from inference_lab.base.hardware import PRESETS

__all__ = [
    "GpuPrice", "GPU_PRICES", "cost_per_million_tokens", "token_prices",
    "predicted_token_prices", "price_ratio_vs_batch", "measured_token_prices",
]

# ============================================================================= prices
@dataclasses.dataclass(frozen=True)
class GpuPrice:
    """An example rental price: dollars per GPU-hour, with where and when it was quoted."""

    dollars_per_hour: float
    source: str
    date: str
    note: str = ""


_MERCATUS = ("Mercatus 'Cloud GPU pricing' guide, on-demand $/GPU-hour table, specialty-cloud "
             "tier (https://www.mercatus-ai.com/blog/cloud-gpu-pricing)")

GPU_PRICES: dict[str, GpuPrice] = {
    "H100_SXM": GpuPrice(3.00, _MERCATUS, "2026-05",
                         "midpoint of the quoted $2.50-3.50; hyperscalers $3.50-5.00"),
    "H200": GpuPrice(4.00, _MERCATUS, "2026-05",
                     "midpoint of the quoted $3.50-4.50; hyperscalers $4.50-7.00"),
    "A100_80GB": GpuPrice(1.30, _MERCATUS, "2026-05",
                          "midpoint of the quoted $1.10-1.50; hyperscalers $1.50-3.00"),
}
"""Example on-demand prices keyed like ``hardware.PRESETS``. Examples only: prices move month
to month and by provider (spot and reserved capacity are far cheaper); pass your own
``dollars_per_gpu_hour`` to every function here."""


def _price(spec, dollars_per_gpu_hour):
    if dollars_per_gpu_hour is not None:
        return checks.positive("dollars_per_gpu_hour", dollars_per_gpu_hour)
    for key, preset in PRESETS.items():
        if preset == spec and key in GPU_PRICES:
            return GPU_PRICES[key].dollars_per_hour
    raise ValueError(
        f"no example price for {getattr(spec, 'name', spec)!r}: pass dollars_per_gpu_hour= "
        f"(examples exist for {', '.join(GPU_PRICES)})"
    )


def cost_per_million_tokens(dollars_per_gpu_hour: float, tokens_per_s: float, *, gpus: int = 1) -> float:
    """Dollars per million tokens for ``gpus`` GPUs rented at ``dollars_per_gpu_hour`` each
    that together process ``tokens_per_s`` tokens per second."""
    price = checks.positive("dollars_per_gpu_hour", dollars_per_gpu_hour)
    tps = checks.positive("tokens_per_s", tokens_per_s)
    gpus = checks.count("gpus", gpus)
    return price * gpus / 3600.0 / tps * 1e6


def token_prices(dollars_per_gpu_hour: float, prefill_tokens_per_s: float,
                 decode_tokens_per_s: float, *, gpus: int = 1) -> dict:
    """``{"input_per_million", "output_per_million", "ratio"}`` from the two throughputs.

    ``ratio`` = output price / input price = prefill tok/s / decode tok/s.
    """
    inp = cost_per_million_tokens(dollars_per_gpu_hour, prefill_tokens_per_s, gpus=gpus)
    out = cost_per_million_tokens(dollars_per_gpu_hour, decode_tokens_per_s, gpus=gpus)
    return {"input_per_million": inp, "output_per_million": out, "ratio": out / inp}


def _efficiency(name, value) -> float:
    value = checks.positive(name, value)
    if value > 1:
        raise ValueError(f"{name}={value!r} must be a fraction in (0, 1]: the share of the datasheet peak reached")
    return value


def predicted_token_prices(cfg, spec, *, batch: int, context: int, prompt_len: int | None = None,
                           prefill_batch: int = 1, dollars_per_gpu_hour: float | None = None,
                           dtype=None, prefill_mfu: float = 1.0, decode_mbu: float = 1.0) -> dict:
    """:func:`token_prices` from the roofline: decode at ``batch`` sequences of ``context``
    tokens, prefill of ``prefill_batch`` prompts of ``prompt_len`` (default: ``context``).

    ``prefill_mfu``: the fraction of the datasheet FLOP/s prefill reaches (1.0: the roofline
    itself, which no engine reaches); ``decode_mbu``: the same for decode's bandwidth. Each
    phase takes ``max(flops / (peak * mfu), bytes / (bandwidth * mbu))``. The price defaults
    to the example in :data:`GPU_PRICES` for a preset spec.
    """
    price = _price(spec, dollars_per_gpu_hour)
    prefill_mfu, decode_mbu = _efficiency("prefill_mfu", prefill_mfu), _efficiency("decode_mbu", decode_mbu)
    prompt_len = context if prompt_len is None else prompt_len
    dt = roofline.flop_dtype(cfg, dtype)
    c, m = roofline.predict_terms(costs.prefill_cost(cfg, prefill_batch, prompt_len), spec, dt)
    pre = prefill_batch * prompt_len / max(c / prefill_mfu, m)
    c, m = roofline.predict_terms(costs.decode_cost(cfg, batch, context), spec, dt)
    dec = batch / max(c, m / decode_mbu)
    out = token_prices(price, pre, dec)
    out.update(batch=batch, context=context, prompt_len=prompt_len, prefill_tokens_per_s=pre,
               decode_tokens_per_s=dec, dollars_per_gpu_hour=price, prefill_mfu=prefill_mfu,
               decode_mbu=decode_mbu)
    return out


def price_ratio_vs_batch(cfg, spec, batches: Iterable[int], *, context: int,
                         prompt_len: int | None = None, dtype=None, prefill_mfu: float = 1.0,
                         decode_mbu: float = 1.0) -> list[float]:
    """Output/input price ratio predicted at each decode batch size (prefill at batch 1).

    Falls steeply with batch while decode is memory-bound (the weight read is shared), then
    levels off where each sequence's own KV-cache read dominates: a floor set by the context
    length. At the roofline (``prefill_mfu=1``) that floor sits above the 3-5x providers
    charge; the ratio scales with ``prefill_mfu / decode_mbu``, and real prefill runs well
    below the datasheet peak, which brings the floor into the band.
    """
    return [predicted_token_prices(cfg, spec, batch=b, context=context, prompt_len=prompt_len,
                                   dollars_per_gpu_hour=1.0, dtype=dtype, prefill_mfu=prefill_mfu,
                                   decode_mbu=decode_mbu)["ratio"] for b in batches]


def measured_token_prices(records: Iterable, dollars_per_gpu_hour: float) -> list[dict]:
    """Prices from your own records: input from the fastest prefill record, output per decode
    batch (median tok/s over repeats). Records are read by attribute (``prefill_tokens_per_s``,
    ``decode_tokens_per_s``, ``batch``). One dict per decode batch, sorted by batch."""
    price = checks.positive("dollars_per_gpu_hour", dollars_per_gpu_hour)
    records = list(records)
    prefill = [r.prefill_tokens_per_s for r in records if getattr(r, "prefill_tokens_per_s", None)]
    decode: dict[int, list[float]] = {}
    for r in records:
        if getattr(r, "decode_tokens_per_s", None):
            decode.setdefault(int(r.batch), []).append(float(r.decode_tokens_per_s))
    if not prefill or not decode:
        raise ValueError("records need at least one prefill and one decode record (measure.sweep makes both)")
    pre = max(prefill)
    rows = []
    for b in sorted(decode):
        row = token_prices(price, pre, float(np.median(decode[b])))
        row.update(batch=b, prefill_tokens_per_s=pre, decode_tokens_per_s=float(np.median(decode[b])))
        rows.append(row)
    return rows
