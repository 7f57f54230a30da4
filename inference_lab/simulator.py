"""A serving simulator: requests arrive, prefill and decode share GPUs (or run in pools).

Seeded Poisson arrivals with prompt and output lengths from distributions (RAG traffic has
prompt:output token ratios of 19:1 to 47:1), served

* ``"colocated"``: every GPU does both phases with continuous batching. Each iteration is
  either a prefill of newly admitted prompts (prefill first, as vLLM's default scheduler
  used to do) or one decode step of every running sequence. A long prompt stalls everyone's
  decode: TTFT and time per output token (TPOT) move together.
* ``"disaggregated"``: a prefill pool computes prompts and ships each KV cache over an
  interconnect to a decode pool that only generates, at high batch. Prompt load raises TTFT;
  TPOT barely moves.

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
from typing import Iterable

import numpy as np

from inference_lab import roofline
from inference_lab.phases import PhaseModel, measured_phases, roofline_phases  # noqa: F401
from inference_lab.workload import RAG_RATIO, Requests, _positive, sample_requests  # noqa: F401

__all__ = ["PhaseModel", "roofline_phases", "measured_phases", "sample_requests", "Requests",
           "simulate", "simulate_requests", "SimResult", "load_sweep", "RAG_RATIO"]


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
