"""What serving benchmarks report, computed one way for simulated and measured runs alike.

The names follow vLLM's ``bench serve`` (and GuideLLM, NVIDIA's AIPerf), for one request
with arrival ``a``, output tokens at times ``t_1 .. t_n`` (``t_1``: the first token):

* **TTFT**, time to first token: ``t_1 - a`` (queueing + prefill);
* **ITL**, inter-token latency: every gap ``t_(k+1) - t_k``, ``n - 1`` of them per request,
  pooled over all requests before taking percentiles (so one stall is one gap, wherever it
  happened);
* **TPOT**, time per output token: ``(t_n - t_1) / (n - 1)``, one number per request, the
  mean of its gaps (so one stall is diluted by the request's other gaps); undefined for
  ``n = 1``;
* **E2E latency** (vLLM: E2EL): ``t_n - a = TTFT + (n - 1) * TPOT``;
* **request throughput**: completed requests / duration; **output tokens/s**: output tokens /
  duration, with duration = last token of the run minus first arrival;
* **goodput**: requests per second that meet every target of an :class:`SLO` (TTFT, TPOT,
  every ITL gap, E2E), over the same duration; ``slo_attainment`` is their share.

Each latency is reported as mean, median (p50), p90 and p99, in milliseconds.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from inference_lab.analytic.workload import Requests

__all__ = ["SLO", "ServingTrace", "LATENCY_METRICS", "trace_from_token_times"]

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e")
PERCENTILES = (50, 90, 99)


@dataclasses.dataclass(frozen=True)
class SLO:
    """Latency targets in milliseconds; ``None`` means no target on that metric.

    A request meets the SLO when its TTFT <= ``ttft_ms``, its TPOT <= ``tpot_ms`` (a one-token
    answer has no TPOT and passes, as in vLLM's goodput), every one of its ITL gaps <=
    ``itl_ms`` (a streaming-smoothness target), and its E2E latency <= ``e2e_ms``.
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real)
                                  or not math.isfinite(v) or v <= 0):
                raise ValueError(f"SLO {f.name}={v!r} must be a positive number of milliseconds or None")
        if all(getattr(self, f.name) is None for f in dataclasses.fields(self)):
            raise ValueError("an SLO needs at least one target, e.g. SLO(ttft_ms=500, tpot_ms=50)")

    def __str__(self):
        names = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "every ITL", "e2e_ms": "E2E"}
        return ", ".join(f"{names[f.name]} <= {getattr(self, f.name):g} ms"
                         for f in dataclasses.fields(self) if getattr(self, f.name) is not None)

    def met(self, trace: "ServingTrace") -> np.ndarray:
        """One bool per successful request of ``trace``: did it meet every target?"""
        ok = np.ones(int(trace.ok.sum()), dtype=bool)
        if self.ttft_ms is not None:
            ok &= trace.ttft <= self.ttft_ms / 1e3
        if self.tpot_ms is not None:
            ok &= np.nan_to_num(trace.tpot, nan=0.0) <= self.tpot_ms / 1e3
        if self.itl_ms is not None:
            ok &= trace.max_itl <= self.itl_ms / 1e3
        if self.e2e_ms is not None:
            ok &= trace.e2e <= self.e2e_ms / 1e3
        return ok


@dataclasses.dataclass(kw_only=True, eq=False)
class ServingTrace:
    """Per-request timings (seconds) of one serving run, simulated or measured.

    ``requests``: arrival (send) times, prompt and output lengths. ``first_token`` and
    ``finish``: when the first and the last output token came out. ``itl_values`` holds every
    gap between consecutive tokens, request after request; request ``i``'s gaps are
    ``itl_values[itl_offsets[i]:itl_offsets[i + 1]]``. ``ok``: which requests completed
    (failed ones are left out of every metric). ``duration``: the run's length for the rates
    (default: last token minus first arrival). ``slo``: the targets goodput is counted against.
    """

    mode: str
    requests: Requests
    first_token: np.ndarray
    finish: np.ndarray
    itl_values: np.ndarray
    itl_offsets: np.ndarray
    ok: np.ndarray | None = None
    duration: float | None = None
    slo: SLO | None = None

    def __post_init__(self):
        n = len(self.requests)
        if self.ok is None:
            self.ok = np.ones(n, dtype=bool)
        if len(self.itl_offsets) != n + 1 or len(self.first_token) != n or len(self.finish) != n:
            raise ValueError("first_token, finish need one entry per request and itl_offsets n + 1")
        if self.slo is not None and not isinstance(self.slo, SLO):
            raise ValueError(f"slo={self.slo!r} must be an SLO(ttft_ms=..., tpot_ms=...) or None")

    # ---------------------------------------------------------------- per request (completed ones)
    @property
    def ttft(self) -> np.ndarray:
        return (self.first_token - self.requests.arrival)[self.ok]

    @property
    def tpot(self) -> np.ndarray:
        """``(last - first token) / (output tokens - 1)``; NaN for one-token outputs."""
        n = (self.requests.output_len - 1)[self.ok]
        span = (self.finish - self.first_token)[self.ok]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, span / np.maximum(n, 1), np.nan)

    @property
    def e2e(self) -> np.ndarray:
        return (self.finish - self.requests.arrival)[self.ok]

    @property
    def itl(self) -> np.ndarray:
        """Every gap between consecutive tokens of every completed request, pooled."""
        if self.ok.all():
            return self.itl_values
        return np.concatenate([self.gaps(i) for i in np.flatnonzero(self.ok)] or [np.empty(0)])

    @property
    def max_itl(self) -> np.ndarray:
        """Each completed request's longest gap (0 for a one-token answer)."""
        starts, ends = self.itl_offsets[:-1], self.itl_offsets[1:]
        out = np.zeros(len(starts))
        has = ends > starts
        if has.any() and len(self.itl_values):
            out[has] = np.maximum.reduceat(self.itl_values, starts[has])
        return out[self.ok]

    def gaps(self, i: int) -> np.ndarray:
        return self.itl_values[self.itl_offsets[i]:self.itl_offsets[i + 1]]

    # ---------------------------------------------------------------- the run
    @property
    def makespan(self) -> float:
        if self.duration is not None:
            return float(self.duration)
        done = self.finish[self.ok]
        return float(done.max() - self.requests.arrival.min()) if len(done) else 0.0

    @property
    def completed(self) -> int:
        return int(self.ok.sum())

    def decoding_at_once(self) -> float:
        """How many requests were decoding at once, on average over the run: each request counts
        from its first token to its last, so the mean is their summed decode time over the span
        from the first first token to the last token (the batch the memory let the server keep)."""
        first, last = self.first_token[self.ok], self.finish[self.ok]
        span = float(last.max() - first.min()) if len(first) else 0.0
        return float(np.sum(last - first) / span) if span > 0 else float(len(first))

    @property
    def output_tokens_per_s(self) -> float:
        return float(self.requests.output_len[self.ok].sum() / self.makespan) if self.makespan > 0 else 0.0

    @property
    def request_throughput(self) -> float:
        return self.completed / self.makespan if self.makespan > 0 else 0.0

    def goodput(self, slo: SLO | None = None) -> float:
        """Requests per second that met every target of ``slo`` (default: the run's own)."""
        slo = slo or self.slo
        if slo is None:
            raise ValueError("goodput needs targets: pass slo=SLO(ttft_ms=..., tpot_ms=...)")
        return float(slo.met(self).sum() / self.makespan) if self.makespan > 0 else 0.0

    def slo_attainment(self, slo: SLO | None = None) -> float:
        """The share of completed requests that met every target."""
        slo = slo or self.slo
        if slo is None:
            raise ValueError("slo_attainment needs targets: pass slo=SLO(ttft_ms=..., tpot_ms=...)")
        met = slo.met(self)
        return float(met.mean()) if len(met) else 0.0

    def with_slo(self, slo: SLO | None):
        """The same run judged against other targets (nothing is re-simulated)."""
        return dataclasses.replace(self, slo=slo)

    def percentiles(self, q=PERCENTILES) -> dict:
        """``{"ttft": {50: s, 90: s, 99: s}, "tpot": ..., "itl": ..., "e2e": ...}`` in seconds."""
        out = {}
        for name in LATENCY_METRICS:
            v = getattr(self, name)
            v = v[np.isfinite(v)]
            out[name] = {p: (float(np.percentile(v, p)) if len(v) else math.nan) for p in q}
        return out

    def summary(self) -> dict:
        """One flat row: mean/p50/p90/p99 of TTFT, TPOT, ITL and E2E (ms), request and output
        throughput, goodput and SLO attainment (``None`` without an SLO)."""
        row = {"mode": self.mode, "requests": len(self.requests), "completed": self.completed,
               "duration_s": self.makespan}
        for name, qs in self.percentiles().items():
            v = getattr(self, name)
            v = v[np.isfinite(v)]
            row[f"{name}_mean_ms"] = 1e3 * float(v.mean()) if len(v) else math.nan
            for q, val in qs.items():
                row[f"{name}_p{q}_ms"] = 1e3 * val
        row["request_throughput"] = self.request_throughput
        row["output_tokens_per_s"] = self.output_tokens_per_s
        row["input_tokens_per_s"] = (float(self.requests.prompt_len[self.ok].sum() / self.makespan)
                                     if self.makespan > 0 else 0.0)
        tpot50 = row["tpot_p50_ms"]
        row["user_tokens_per_s_p50"] = 1e3 / tpot50 if tpot50 > 0 else math.inf
        row["slo"] = str(self.slo) if self.slo else None
        row["goodput_rps"] = self.goodput() if self.slo else None
        row["slo_attainment"] = self.slo_attainment() if self.slo else None
        return row


def trace_from_token_times(mode: str, requests: Requests, token_times, *, slo: SLO | None = None,
                           ok=None, duration: float | None = None) -> ServingTrace:
    """A trace from each request's output-token times (seconds; one list per request, in order,
    the first entry being the first token). The easiest way to build a hand-made trace."""
    times = [np.asarray(t, dtype=np.float64) for t in token_times]
    if len(times) != len(requests):
        raise ValueError(f"token_times has {len(times)} lists for {len(requests)} requests")
    if any(len(t) == 0 for t in times):
        raise ValueError("every request needs at least its first token time")
    gaps = [np.diff(t) for t in times]
    if any((g < 0).any() for g in gaps):
        raise ValueError("token times must not go backwards")
    offsets = np.concatenate([[0], np.cumsum([len(g) for g in gaps])]).astype(np.int64)
    values = np.concatenate(gaps) if gaps else np.empty(0)
    return ServingTrace(mode=mode, requests=requests, first_token=np.array([t[0] for t in times]),
                        finish=np.array([t[-1] for t in times]), itl_values=values,
                        itl_offsets=offsets, ok=None if ok is None else np.asarray(ok, dtype=bool),
                        duration=duration, slo=slo)
