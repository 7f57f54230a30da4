"""Why output tokens cost more, and what disaggregated serving changes. Pure Python + numpy.

Two halves:

1. **Prices from throughput.** A GPU rented at ``$ per hour`` that does ``tokens/s`` of some
   phase costs ``$ / 3600 / (tokens/s) * 1e6`` per million of those tokens. Prefill is
   compute-bound even for one request, so input tokens are cheap at any batch; decode is
   cheap per token only when many sequences share each weight read. The ratio of the two
   prices, derived from a datasheet (:func:`predicted_token_prices`) or from your own records
   (:func:`measured_token_prices`), is why providers charge 3-5x more for output.

2. **A serving simulation** (:func:`simulate`): seeded Poisson arrivals, prompt and output
   lengths from distributions (the brief's RAG traffic: prompt:output 19:1 to 47:1), served

   * ``"colocated"``: every GPU does both phases with continuous batching. Each iteration is
     either a prefill of newly admitted prompts (prefill first, as vLLM's default scheduler
     does) or one decode step of every running sequence. A long prompt stalls everyone's
     decode: TTFT and time per output token (TPOT) move together.
   * ``"disaggregated"``: a prefill pool computes prompts and ships each KV cache over an
     interconnect to a decode pool that only generates, at high batch. Prompt load raises
     TTFT; TPOT barely moves.

   Phase times come from a :class:`PhaseModel`: the roofline of a ``ModelConfig`` on a
   ``HardwareSpec`` (:func:`roofline_phases`) or fits to measured records
   (:func:`measured_phases`). The simulation is exact event order, no jax, a few thousand
   requests in a fraction of a second.

Timing conventions: the first output token comes out of the prefill (TTFT = its end minus the
arrival); each later token costs one decode step; TPOT = (finish - first token) / (output
tokens - 1), so it includes queueing for a decode slot and, when disaggregated, the KV
transfer.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
from typing import Callable, Iterable, Sequence

import numpy as np

from inference_lab import roofline
from inference_lab.hardware import dtype_key

__all__ = [
    "GpuPrice", "GPU_PRICES", "cost_per_million_tokens", "token_prices",
    "predicted_token_prices", "price_ratio_vs_batch", "measured_token_prices",
    "PhaseModel", "roofline_phases", "measured_phases", "sample_requests", "Requests",
    "simulate", "simulate_requests", "SimResult", "load_sweep", "RAG_RATIO",
]

RAG_RATIO = (19, 47)
"""Prompt:generation token ratios of the RAG traffic in the brief (a 27B model on 4xH100)."""


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


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive number")
    return float(value)


def _price(spec, dollars_per_gpu_hour):
    if dollars_per_gpu_hour is not None:
        return _positive("dollars_per_gpu_hour", dollars_per_gpu_hour)
    from inference_lab.hardware import PRESETS

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
    price = _positive("dollars_per_gpu_hour", dollars_per_gpu_hour)
    tps = _positive("tokens_per_s", tokens_per_s)
    gpus = roofline._check_count("gpus", gpus)
    return price * gpus / 3600.0 / tps * 1e6


def token_prices(dollars_per_gpu_hour: float, prefill_tokens_per_s: float,
                 decode_tokens_per_s: float, *, gpus: int = 1) -> dict:
    """``{"input_per_million", "output_per_million", "ratio"}`` from the two throughputs.

    ``ratio`` = output price / input price = prefill tok/s / decode tok/s.
    """
    inp = cost_per_million_tokens(dollars_per_gpu_hour, prefill_tokens_per_s, gpus=gpus)
    out = cost_per_million_tokens(dollars_per_gpu_hour, decode_tokens_per_s, gpus=gpus)
    return {"input_per_million": inp, "output_per_million": out, "ratio": out / inp}


def predicted_token_prices(cfg, spec, *, batch: int, context: int, prompt_len: int | None = None,
                           prefill_batch: int = 1, dollars_per_gpu_hour: float | None = None,
                           dtype=None) -> dict:
    """:func:`token_prices` from the roofline: decode at ``batch`` sequences of ``context``
    tokens, prefill of ``prefill_batch`` prompts of ``prompt_len`` (default: ``context``).

    The price defaults to the example in :data:`GPU_PRICES` for a preset spec.
    """
    price = _price(spec, dollars_per_gpu_hour)
    prompt_len = context if prompt_len is None else prompt_len
    pre = roofline.predicted_prefill_tokens_per_s(cfg, spec, prefill_batch, prompt_len, dtype)
    dec = roofline.predicted_decode_tokens_per_s(cfg, spec, batch, context, dtype)
    out = token_prices(price, pre, dec)
    out.update(batch=batch, context=context, prompt_len=prompt_len,
               prefill_tokens_per_s=pre, decode_tokens_per_s=dec, dollars_per_gpu_hour=price)
    return out


def price_ratio_vs_batch(cfg, spec, batches: Iterable[int], *, context: int,
                         prompt_len: int | None = None, dtype=None) -> list[float]:
    """Output/input price ratio predicted at each decode batch size (prefill at batch 1).

    Falls steeply with batch while decode is memory-bound (the weight read is shared), then
    levels off where each sequence's own KV-cache read dominates: that floor, set by the
    context length, is where providers' 3-5x comes from.
    """
    return [predicted_token_prices(cfg, spec, batch=b, context=context, prompt_len=prompt_len,
                                   dollars_per_gpu_hour=1.0, dtype=dtype)["ratio"] for b in batches]


def measured_token_prices(records: Iterable, dollars_per_gpu_hour: float) -> list[dict]:
    """Prices from your own records: input from the fastest prefill record, output per decode
    batch (median tok/s over repeats). Records are read by attribute (``prefill_tokens_per_s``,
    ``decode_tokens_per_s``, ``batch``). One dict per decode batch, sorted by batch."""
    price = _positive("dollars_per_gpu_hour", dollars_per_gpu_hour)
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


# ============================================================================= phase models
@dataclasses.dataclass(frozen=True)
class PhaseModel:
    """How long each kind of serving iteration takes.

    ``prefill_seconds(prompt_lens)``: one prefill iteration over those prompts (one pass).
    ``decode_seconds(batch, total_context)``: one decode step of ``batch`` sequences holding
    ``total_context`` cached tokens between them.
    ``kv_bytes_per_token``: KV-cache bytes per prompt token, for the transfer between pools
    (``None``: unknown; the disaggregated mode then refuses to run).
    """

    prefill_seconds: Callable[[Sequence[int]], float]
    decode_seconds: Callable[[int, int], float]
    kv_bytes_per_token: float | None = None
    description: str = ""


def roofline_phases(cfg, spec, dtype=None, *, step_overhead_s: float = 0.0) -> PhaseModel:
    """Phase times from :mod:`inference_lab.roofline` (same formulas, summed over a mixed batch).

    ``step_overhead_s`` adds a fixed cost per iteration (kernel launches, Python); real engines
    pay tens of microseconds to milliseconds.
    """
    roofline._check_cfg(cfg)
    roofline._check_spec(spec)
    if step_overhead_s < 0:
        raise ValueError(f"step_overhead_s={step_overhead_s!r} must be >= 0")
    dt = dtype_key(cfg.dtype if dtype is None else dtype)
    peak, bw = spec.peak_flops(dt), spec.bandwidth
    head = cfg.vocab_size * cfg.d_model
    body = cfg.matmul_params - head
    attn = 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim  # FLOPs per (query, key) pair, all layers
    W = roofline.weight_bytes(cfg)
    kv_tok = roofline.kv_bytes_per_token(cfg)
    row = cfg.d_model * cfg.dtype_bytes

    def prefill_seconds(prompt_lens):
        t = np.asarray(prompt_lens, dtype=np.float64)
        flops = 2 * body * t.sum() + 2 * head * t.size + attn * (t * (t + 1) / 2).sum()
        nbytes = W + t.sum() * (kv_tok + row)
        return max(flops / peak, nbytes / bw) + step_overhead_s

    def decode_seconds(batch, total_context):
        flops = 2 * cfg.matmul_params * batch + attn * (total_context + batch)
        nbytes = W + batch * (row + kv_tok) + total_context * kv_tok
        return max(flops / peak, nbytes / bw) + step_overhead_s

    return PhaseModel(prefill_seconds, decode_seconds, kv_tok,
                      f"roofline of {cfg.name} on {spec.name} ({dt})")


def _extrapolating_interp(x, xs, ys):
    """Piecewise-linear through the points, continued linearly past the last one."""
    if len(xs) == 1:
        return ys[0] * x / xs[0]  # one point: proportional
    if x <= xs[-1]:
        return float(np.interp(x, xs, ys))
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return float(ys[-1] + max(slope, 0.0) * (x - xs[-1]))


def measured_phases(records: Iterable, *, cfg=None, kv_bytes_per_token: float | None = None) -> PhaseModel:
    """Phase times fitted to measured records (read by attribute, per INTERFACES.md).

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
        kv_bytes_per_token = roofline.kv_bytes_per_token(cfg)
    elif kv_bytes_per_token is not None:
        kv_bytes_per_token = _positive("kv_bytes_per_token", kv_bytes_per_token)
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


# ============================================================================= workload
@dataclasses.dataclass(frozen=True)
class Requests:
    """A workload: per-request arrival time (s), prompt length and output length (tokens)."""

    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray

    def __len__(self):
        return len(self.arrival)


def _draw(name, spec, rng, n):
    """int -> constant; (lo, hi) -> uniform integers in [lo, hi]; callable(rng, n) -> array."""
    if callable(spec):
        out = np.asarray(spec(rng, n))
    elif isinstance(spec, tuple) and len(spec) == 2:
        lo, hi = spec
        if not (isinstance(lo, (int, np.integer)) and isinstance(hi, (int, np.integer)) and 1 <= lo <= hi):
            raise ValueError(f"{name}={spec!r}: a range must be two integers 1 <= lo <= hi")
        out = rng.integers(lo, hi + 1, size=n)
    elif isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        out = np.full(n, spec)
    else:
        raise ValueError(f"{name}={spec!r}: pass an int, a (lo, hi) range or a callable(rng, n)")
    out = np.rint(out).astype(np.int64)
    if out.shape != (n,) or (out < 1).any():
        raise ValueError(f"{name} must give {n} integers >= 1")
    return out


def sample_requests(n_requests: int, rate: float, *, prompt_len=512, output_len=(32, 128),
                    ratio: tuple[float, float] | None = None, seed: int = 0) -> Requests:
    """Poisson arrivals at ``rate`` requests/s with drawn lengths.

    ``prompt_len``/``output_len``: an int (every request the same), a ``(lo, hi)`` range
    (uniform integers, both ends included) or a ``callable(rng, n)`` returning ``n`` lengths.

    ``ratio=(lo, hi)``: prompt length = output length x a uniform ratio in ``[lo, hi]``
    (``RAG_RATIO`` = 19:1 to 47:1), replacing ``prompt_len``. Same seed, same workload.
    """
    n = roofline._check_count("n_requests", n_requests)
    rate = _positive("rate", rate)
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate, size=n))
    out = _draw("output_len", output_len, rng, n)
    if ratio is not None:
        lo, hi = ratio
        if not 0 < lo <= hi:
            raise ValueError(f"ratio={ratio!r} must be (lo, hi) with 0 < lo <= hi, e.g. {RAG_RATIO}")
        prompt = np.maximum(1, np.rint(out * rng.uniform(lo, hi, size=n))).astype(np.int64)
    else:
        prompt = _draw("prompt_len", prompt_len, rng, n)
    return Requests(arrival, prompt, out)


# ============================================================================= simulation
@dataclasses.dataclass
class SimResult:
    """Per-request timings (seconds) and per-pool utilisation of one simulated run."""

    mode: str
    requests: Requests
    first_token: np.ndarray  # time the first output token came out (end of its prefill)
    finish: np.ndarray  # time the last output token came out
    tokens: np.ndarray  # output tokens produced per request (must equal output_len)
    decode_tokens_total: int  # tokens produced by decode steps, counted step by step
    utilisation: dict  # pool -> busy fraction of (workers x makespan)
    iterations: dict  # pool -> iterations run

    @property
    def ttft(self) -> np.ndarray:
        return self.first_token - self.requests.arrival

    @property
    def tpot(self) -> np.ndarray:
        """Time per output token after the first; NaN for one-token outputs."""
        n = self.requests.output_len - 1
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, (self.finish - self.first_token) / np.maximum(n, 1), np.nan)

    @property
    def makespan(self) -> float:
        return float(self.finish.max() - self.requests.arrival.min())

    @property
    def output_tokens_per_s(self) -> float:
        return float(self.tokens.sum() / self.makespan)

    def percentiles(self, q=(50, 90, 99)) -> dict:
        """``{"ttft": {50: s, ...}, "tpot": {...}}``."""
        return {name: {p: float(np.nanpercentile(v, p)) for p in q}
                for name, v in (("ttft", self.ttft), ("tpot", self.tpot))}

    def summary(self) -> dict:
        """One flat row: TTFT/TPOT percentiles (ms), tokens/s, utilisation per pool."""
        p = self.percentiles()
        row = {"mode": self.mode, "requests": len(self.requests)}
        for name in ("ttft", "tpot"):
            for q, v in p[name].items():
                row[f"{name}_p{q}_ms"] = 1e3 * v
        row["output_tokens_per_s"] = self.output_tokens_per_s
        row["user_tokens_per_s_p50"] = 1.0 / p["tpot"][50] if p["tpot"][50] > 0 else math.inf
        for pool, u in self.utilisation.items():
            row[f"util_{pool}"] = u
        return row


class _DecodeSet:
    """The running sequences of one worker, advanced one decode step at a time in O(log n).

    A sequence joining after step ``s0`` with ``r`` tokens to go and ``c`` cached tokens
    produces one token in each of steps ``s0+1 .. s0+r``; its context at step ``s`` is
    ``c + (s - s0 - 1)``. ``total_context`` is kept as a running sum.
    """

    def __init__(self):
        self.step = 0
        self.heap: list[tuple[int, int]] = []  # (finish step, request id)
        self.join: dict[int, tuple[int, int]] = {}  # rid -> (join step, cached tokens at join)
        self.total_context = 0

    def __len__(self):
        return len(self.heap)

    def add(self, rid: int, remaining: int, cached: int) -> None:
        heapq.heappush(self.heap, (self.step + remaining, rid))
        self.join[rid] = (self.step, cached)
        self.total_context += cached

    def advance(self) -> list[tuple[int, int]]:
        """After one step: every context grows by one; return (rid, tokens decoded) of the finished."""
        self.step += 1
        self.total_context += len(self.heap)
        done = []
        while self.heap and self.heap[0][0] == self.step:
            _, rid = heapq.heappop(self.heap)
            s0, cached = self.join.pop(rid)
            self.total_context -= cached + (self.step - s0)
            done.append((rid, self.step - s0))
        return done


class _Worker:
    def __init__(self, pool: str, index: int):
        self.pool, self.index = pool, index
        self.busy = False
        self.busy_time = 0.0
        self.iterations = 0
        self.running = _DecodeSet()


def simulate_requests(requests: Requests, phases: PhaseModel, *, mode: str = "colocated",
                      gpus: int = 1, prefill_gpus: int = 1, decode_gpus: int = 1,
                      max_batch: int = 64, max_prefill_tokens: int = 8192,
                      interconnect_bandwidth: float | None = None,
                      transfer_latency_s: float = 0.0) -> SimResult:
    """Serve ``requests`` and time every token (see the module docstring for the two modes).

    ``gpus``: colocated workers. ``prefill_gpus``/``decode_gpus``: the disaggregated pools.
    ``max_batch``: sequences a worker decodes at once. ``max_prefill_tokens``: prompt tokens
    one prefill iteration takes (at least one prompt, however long). A disaggregated request
    moves ``prompt_len x kv_bytes_per_token`` bytes over ``interconnect_bandwidth`` (bytes/s,
    e.g. ``spec.interconnect_bandwidth``) plus ``transfer_latency_s``; transfers overlap.
    """
    if mode not in ("colocated", "disaggregated"):
        raise ValueError(f"mode={mode!r}: use 'colocated' or 'disaggregated'")
    if not isinstance(phases, PhaseModel):
        raise ValueError("phases must be a PhaseModel: use roofline_phases(cfg, spec) or measured_phases(records)")
    if not isinstance(requests, Requests) or len(requests) == 0:
        raise ValueError("requests must be a non-empty Requests (use sample_requests)")
    max_batch = roofline._check_count("max_batch", max_batch)
    max_prefill_tokens = roofline._check_count("max_prefill_tokens", max_prefill_tokens)
    if transfer_latency_s < 0:
        raise ValueError(f"transfer_latency_s={transfer_latency_s!r} must be >= 0")
    if mode == "colocated":
        pre_pool = dec_pool = [_Worker("colocated", i) for i in range(roofline._check_count("gpus", gpus))]
    else:
        pre_pool = [_Worker("prefill", i) for i in range(roofline._check_count("prefill_gpus", prefill_gpus))]
        dec_pool = [_Worker("decode", i) for i in range(roofline._check_count("decode_gpus", decode_gpus))]
        interconnect_bandwidth = _positive("interconnect_bandwidth", interconnect_bandwidth)
        if phases.kv_bytes_per_token is None:
            raise ValueError("disaggregated mode needs phases.kv_bytes_per_token: pass cfg= to measured_phases")

    arrival, plen, olen = requests.arrival, requests.prompt_len, requests.output_len
    n = len(requests)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    tokens = np.zeros(n, dtype=np.int64)
    decode_tokens_total = 0
    waiting_prefill: collections.deque[int] = collections.deque()
    waiting_decode: collections.deque[int] = collections.deque()  # disaggregated: KV arrived
    events: list = []  # (time, tie-breaker, kind, payload): a deterministic total order
    counter = 0

    def push(t, kind, payload):
        nonlocal counter
        heapq.heappush(events, (t, counter, kind, payload))
        counter += 1

    for rid in range(n):
        push(float(arrival[rid]), "arrive", rid)

    def take_prompts(worker):
        """FIFO prompts for one prefill pass, within the token budget and free batch slots."""
        room = max_batch - len(worker.running) if mode == "colocated" else max_batch
        batch, total = [], 0
        while waiting_prefill and len(batch) < room:
            nxt = int(plen[waiting_prefill[0]])
            if batch and total + nxt > max_prefill_tokens:
                break
            batch.append(waiting_prefill.popleft())
            total += nxt
        return batch

    def start(worker, now):
        """Begin the worker's next iteration if it has work; leave it idle otherwise."""
        if worker.busy:
            return
        kind = None
        if worker.pool in ("colocated", "prefill") and waiting_prefill and (
                worker.pool == "prefill" or len(worker.running) < max_batch):
            rids = take_prompts(worker)
            seconds = phases.prefill_seconds([int(plen[r]) for r in rids])
            kind = ("prefill", rids)
        else:
            if worker.pool == "decode":  # admit arrived KV caches at the step boundary
                while waiting_decode and len(worker.running) < max_batch:
                    rid = waiting_decode.popleft()
                    worker.running.add(rid, int(olen[rid]) - 1, int(plen[rid]))
            if len(worker.running):
                seconds = phases.decode_seconds(len(worker.running), worker.running.total_context)
                kind = ("decode", len(worker.running))
        if kind is None:
            return
        worker.busy = True
        worker.busy_time += seconds
        worker.iterations += 1
        push(now + seconds, "done", (worker, kind))

    while events:
        now, _, what, payload = heapq.heappop(events)
        if what == "arrive":
            waiting_prefill.append(payload)
            for w in pre_pool:
                start(w, now)
        elif what == "kv":
            waiting_decode.append(payload)
            for w in dec_pool:
                start(w, now)
        else:
            worker, (kind, info) = payload
            worker.busy = False
            if kind == "prefill":
                for rid in info:
                    first[rid] = now
                    tokens[rid] = 1
                    if olen[rid] == 1:
                        finish[rid] = now
                    elif mode == "colocated":
                        worker.running.add(rid, int(olen[rid]) - 1, int(plen[rid]))
                    else:
                        kv = plen[rid] * phases.kv_bytes_per_token
                        push(now + kv / interconnect_bandwidth + transfer_latency_s, "kv", rid)
            else:
                decode_tokens_total += info  # one token per running sequence this step
                for rid, decoded in worker.running.advance():
                    tokens[rid] += decoded
                    finish[rid] = now
            start(worker, now)
            if mode == "colocated" or worker.pool == "prefill":
                for w in pre_pool:  # a freed slot may let an idle colocated worker admit
                    start(w, now)

    pools = {"colocated": pre_pool} if mode == "colocated" else {"prefill": pre_pool, "decode": dec_pool}
    span = float(np.nanmax(finish) - arrival.min())
    util = {k: float(sum(w.busy_time for w in ws) / (len(ws) * span)) if span > 0 else 0.0
            for k, ws in pools.items()}
    iters = {k: sum(w.iterations for w in ws) for k, ws in pools.items()}
    return SimResult(mode, requests, first, finish, tokens, decode_tokens_total, util, iters)


def simulate(phases: PhaseModel, *, rate: float, n_requests: int = 2000, prompt_len=512,
             output_len=(32, 128), ratio=None, seed: int = 0, mode: str = "colocated",
             **serving) -> SimResult:
    """:func:`sample_requests` then :func:`simulate_requests` (``serving``: its keywords)."""
    reqs = sample_requests(n_requests, rate, prompt_len=prompt_len, output_len=output_len,
                           ratio=ratio, seed=seed)
    return simulate_requests(reqs, phases, mode=mode, **serving)


def load_sweep(phases: PhaseModel, rates: Iterable[float], *, modes=("colocated", "disaggregated"),
               seed: int = 0, **kwargs) -> list[dict]:
    """:meth:`SimResult.summary` rows at each arrival rate and mode (same seed everywhere).

    For a fair comparison the colocated mode gets as many GPUs as the two disaggregated pools
    together (``gpus = prefill_gpus + decode_gpus``) unless ``gpus`` is given.
    """
    kwargs.setdefault("gpus", kwargs.get("prefill_gpus", 1) + kwargs.get("decode_gpus", 1))
    rows = []
    for rate in rates:
        for mode in modes:
            row = simulate(phases, rate=rate, seed=seed, mode=mode, **kwargs).summary()
            row["rate"] = rate
            rows.append(row)
    return rows
