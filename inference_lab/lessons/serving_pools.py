"""Notebook 07, part two: sizing xPyD pools for RAG traffic, and a real engine's run beside the
simulator. (Part one, prices and the three serving modes: :mod:`.serving_economics`.)

The split follows from two ratios. A request costs a prefill GPU ``prompt / prefill tok/s``
seconds and a decode GPU ``output / decode tok/s`` seconds, where decode tok/s is that of the
batch the TPOT target allows. Each pool must keep up, so the best split of ``g`` GPUs is the
``x`` that maximises ``min(x / prefill s, (g - x) / decode s)``: the prompt:output ratio over
the prefill/decode speed gap says how many prefill GPUs each decode GPU needs.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from inference_lab import plots
from inference_lab.analytic import simulator, workload
from inference_lab.measure import vllm_bench
from inference_lab.analytic.serving_metrics import SLO
from inference_lab.analytic.workload import Requests

EXAMPLE_VLLM_RESULT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "vllm_bench_serve.json"
"""A hand-made file in the format of ``vllm bench serve --save-result --save-detailed`` (not a
measurement): what a learner's own run looks like to :func:`vllm_bench.load_vllm_bench`."""


def decode_batch_for_tpot(phases, tpot_ms: float, context: int, *, max_batch: int = 1024) -> int:
    """The largest decode batch whose step (all sequences at ``context`` tokens) fits in
    ``tpot_ms``: a TPOT target caps the batch, and with it decode's tokens/s per GPU."""
    best = 0
    for b in range(1, max_batch + 1):
        if phases.decode_seconds(b, b * context) * 1e3 > tpot_ms:
            break
        best = b
    if best == 0:
        raise ValueError(f"tpot_ms={tpot_ms}: even one sequence's decode step is slower "
                         f"({1e3 * phases.decode_seconds(1, context):.1f} ms)")
    return best


@dataclasses.dataclass
class PoolEstimate:
    """GPU-seconds per request in each phase, and what each xPyD split can sustain."""

    gpus: int
    batch: int  # decode sequences per step
    prompt: float  # mean prompt tokens
    output: float  # mean output tokens
    prefill_s: float  # prefill GPU-seconds per request
    decode_s: float  # decode GPU-seconds per request at that batch
    splits: list  # "1P7D", ...
    prefill_rps: list
    decode_rps: list

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt / self.prefill_s

    @property
    def decode_tokens_per_s(self) -> float:
        return self.output / self.decode_s

    @property
    def throughput_ratio(self) -> float:
        """Prefill tokens/s over decode tokens/s of one GPU, decode at this batch: what sizes the
        pools. Not the speed gap (one stream's prefill over one stream's decode, notebook 01's N):
        a decode GPU serves a whole batch."""
        return self.prefill_tokens_per_s / self.decode_tokens_per_s

    @property
    def prefill_gpus_per_decode_gpu(self) -> float:
        """(prompt:output) / throughput ratio = prefill GPU-seconds per decode GPU-second."""
        return self.prefill_s / self.decode_s

    @property
    def best(self) -> str:
        return self.splits[int(np.argmax(np.minimum(self.prefill_rps, self.decode_rps)))]

    @property
    def best_prefill_gpus(self) -> int:
        return split_prefill_gpus(self.best)

    def line(self) -> str:
        return (f"batch size {self.batch}: prefill {self.prefill_tokens_per_s:,.0f} tok/s, decode "
                f"{self.decode_tokens_per_s:,.0f} tok/s per GPU (throughput ratio {self.throughput_ratio:.1f}x); prompts "
                f"{self.prompt / self.output:.0f}x longer than answers -> {self.prefill_gpus_per_decode_gpu:.1f} "
                f"prefill GPUs per decode GPU; of {self.gpus}: {self.best}")


def split_name(x: int, gpus: int) -> str:
    return f"{x}P{gpus - x}D"


def split_prefill_gpus(name: str) -> int:
    return int(name.split("P")[0])


def _full_passes_seconds(phases, prompt_lens, max_prefill_tokens: int) -> float:
    """Prefill GPU-seconds for these prompts packed first-come into passes of up to
    ``max_prefill_tokens`` tokens (at least one prompt each), as a busy prefill worker runs them."""
    total, batch, tokens = 0.0, [], 0
    for p in (int(p) for p in prompt_lens):
        if batch and tokens + p > max_prefill_tokens:
            total += phases.prefill_seconds(batch)
            batch, tokens = [], 0
        batch.append(p)
        tokens += p
    return total + (phases.prefill_seconds(batch) if batch else 0.0)


def pool_estimate(phases, requests: Requests, gpus: int, *, tpot_ms: float | None = None,
                  batch: int | None = None, max_prefill_tokens: int = 8192, max_batch: int = 256) -> PoolEstimate:
    """The balance of the pools for this traffic at capacity: prefill in full passes (of up to
    ``max_prefill_tokens``, the simulator's default), decode at the ``batch`` given or at the
    largest one a ``tpot_ms`` target allows (sequences at the mean context), at most
    ``max_batch`` (the sequences a worker may hold)."""
    prompt = float(np.mean(requests.prompt_len))
    output = float(np.mean(requests.output_len))
    context = int(prompt + output / 2)
    if batch is None:
        if tpot_ms is None:
            raise ValueError("pass tpot_ms= (the TPOT target sets the batch) or batch=")
        batch = decode_batch_for_tpot(phases, tpot_ms, context, max_batch=max_batch)
    prefill_s = _full_passes_seconds(phases, requests.prompt_len, max_prefill_tokens) / len(requests)
    decode_s = output * phases.decode_seconds(batch, batch * context) / batch
    xs = range(1, gpus)
    return PoolEstimate(gpus, batch, prompt, output, prefill_s, decode_s, [split_name(x, gpus) for x in xs],
                        [x / prefill_s for x in xs], [(gpus - x) / decode_s for x in xs])


def pool_view(phases, requests: Requests, gpus: int, batch: int):
    est = pool_estimate(phases, requests, gpus, batch=batch)
    fig = plots.pool_balance_plot(est.splits, est.prefill_rps, est.decode_rps,
                                  title=f"{gpus} GPUs, RAG traffic, decode at batch size {batch}")
    return fig, est.line()


@dataclasses.dataclass
class PoolSweep:
    """Goodput of every xPyD split (and colocated, chunked on all the GPUs) against load."""

    rows: list  # summary rows with "rate" and "config"
    slo: SLO
    gpus: int

    def best(self, kind: str = "split") -> tuple[str, float]:
        """The configuration with the highest goodput at any rate: among the xPyD splits
        (``kind="split"``) or among all."""
        rows = [r for r in self.rows if kind == "all" or "P" in r["config"]]
        top = max(rows, key=lambda r: (r["goodput_rps"], -r["rate"]))
        return top["config"], top["goodput_rps"]

    def peak(self, config: str) -> float:
        return max(r["goodput_rps"] for r in self.rows if r["config"] == config)

    def light_load_line(self) -> str:
        """Why goodput stays below the offered load even where every request meets the SLO."""
        rate = min(r["rate"] for r in self.rows)
        rows = [r for r in self.rows if r["rate"] == rate]
        top = max(rows, key=lambda r: r["goodput_rps"])
        arrivals = top["requests"] / rate
        return (f"at {rate:g} req/s: {top['requests']} requests arrive over about {arrivals:.1f} s, and the run lasts "
                f"{top['duration_s']:.1f} s (first arrival to last token: the last answers finish after the last "
                f"arrival), so a run in which every request met the SLO would score {top['request_throughput']:.1f} "
                f"req/s; the best, {top['config']}, scored {top['goodput_rps']:.1f} "
                f"({top['slo_attainment']:.0%} of its requests met the SLO)")

    def table(self) -> str:
        configs = list(dict.fromkeys(r["config"] for r in self.rows))
        rates = sorted({r["rate"] for r in self.rows})
        lines = [f"{'goodput (req/s)':<16}" + "".join(f"{c:>9}" for c in configs)]
        for rate in rates:
            got = {r["config"]: r["goodput_rps"] for r in self.rows if r["rate"] == rate}
            lines.append(f"{f'at {rate:g} req/s':<16}" + "".join(f"{got[c]:>9.1f}" for c in configs))
        return "\n".join(lines)


def pool_sweep(phases, rates, *, gpus: int, slo: SLO, link: float, n_requests: int = 500,
               seed: int = 0, splits=None, max_batch: int = 64, **traffic) -> PoolSweep:
    """Goodput at each offered rate for each xPyD split of ``gpus`` GPUs, and for colocated
    and chunked serving on all of them; the same requests everywhere at each rate."""
    traffic = {"ratio": workload.RAG_RATIO, "output_len": (32, 128), **traffic}
    splits = list(range(1, gpus)) if splits is None else list(splits)
    rows = []
    for rate in rates:
        reqs = workload.sample_requests(n_requests, rate, seed=seed, **traffic)
        runs = {"colocated": dict(mode="colocated", gpus=gpus), "chunked": dict(mode="chunked", gpus=gpus)}
        runs.update({split_name(x, gpus): dict(mode="disaggregated", prefill_gpus=x, decode_gpus=gpus - x)
                     for x in splits})
        for name, kw in runs.items():
            res = simulator.simulate_requests(reqs, phases, max_batch=max_batch, interconnect_bandwidth=link,
                                              slo=slo, **kw)
            rows.append({**res.summary(), "rate": rate, "config": name})
    return PoolSweep(rows, slo, gpus)


def split_follows_from_the_gap(predicted: str, simulated: str, *, tolerance: int = 1) -> bool:
    """The claim: the split with the best simulated goodput is the one the GPU-seconds balance
    predicts, give or take ``tolerance`` GPUs (queueing and bursts are not in the balance)."""
    return abs(split_prefill_gpus(predicted) - split_prefill_gpus(simulated)) <= tolerance


def replay(run: vllm_bench.BenchRun, phases, *, mode: str = "chunked", **serving) -> simulator.SimResult:
    """The requests of a real run (send times, prompt and output lengths, completed ones
    only) served by the simulator: the same traffic on the modelled machine."""
    tr = run.trace
    if tr is None:
        raise ValueError(f"{run.path}: replaying needs the per-request lists (run vllm bench serve with "
                         "--save-detailed)")
    ok = tr.ok
    arrival = tr.requests.arrival[ok]
    order = np.argsort(arrival, kind="stable")
    reqs = Requests(arrival[order] + 1e-9 * np.arange(len(order)), tr.requests.prompt_len[ok][order],
                    tr.requests.output_len[ok][order])
    return simulator.simulate_requests(reqs, phases, mode=mode, **serving)


def read_one_request(run: vllm_bench.BenchRun) -> str:
    """The metric box of section 2, worked on a result file's own lists: one completed request's
    TTFT and gaps, its TPOT by hand, and the run's pooled ITL percentiles and TPOT beside them."""
    tr = run.trace
    if tr is None:
        raise ValueError(f"{run.path}: reading the per-request lists needs a run saved with --save-detailed")
    ok = np.flatnonzero(tr.ok)
    i = max(ok, key=lambda j: (tr.gaps(j).max() if len(tr.gaps(j)) else 0.0, len(tr.gaps(j))))
    gaps = tr.gaps(i) * 1e3
    pooled, tpot = tr.itl * 1e3, tr.tpot * 1e3
    long = pooled > 2 * np.median(pooled)
    pct = {q: np.percentile(pooled, q) for q in (50, 90, 99)}
    reach = [f"p{q}" for q, v in pct.items() if v > 2 * np.median(pooled)]
    failed = len(tr.requests) - len(ok)
    return "\n".join([
        f"request {i}: prompt {tr.requests.prompt_len[i]} tokens, {tr.requests.output_len[i]} output tokens; TTFT "
        f"{(tr.first_token[i] - tr.requests.arrival[i]) * 1e3:.0f} ms; its {len(gaps)} gaps (ms): "
        + ", ".join(f"{g:.1f}" for g in gaps),
        f"  its TPOT by hand: the mean of its gaps = {gaps.mean():.2f} ms (the reader: "
        f"{tpot[list(ok).index(i)]:.2f} ms)",
        f"the run: {len(pooled)} gaps pooled over {len(ok)} completed requests, {int(long.sum())} of them over twice "
        f"the median (pauses: another prompt's prefill); ITL p50 {pct[50]:.1f}, p90 {pct[90]:.1f}, p99 {pct[99]:.1f} ms: "
        + (f"of these, only {' and '.join(reach)} reaches the pauses; " if reach else "none of these reaches the pauses; ")
        + f"TPOT p99 {np.nanpercentile(tpot, 99):.1f} ms: each pause is averaged into its request's TPOT",
        f"{failed} request(s) failed (the file's errors list) and are left out of every metric, as vLLM does"
        if failed else "no request failed"])


def side_by_side(rows: dict) -> str:
    """Named summary rows (a real run's, the simulator's) in one table, vLLM's names alongside."""
    metrics = [("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2E (vLLM: E2EL)", "e2e")]
    names = list(rows)
    lines = [f"{'':<24}" + "".join(f"{n:>26}" for n in names)]
    for label, m in metrics:
        for stat in ("mean", "p50", "p99"):
            vals = [rows[n].get(f"{m}_{stat}_ms", math.nan) for n in names]
            lines.append(f"{label + ' ' + stat + ' (ms)':<24}" + "".join(f"{v:>26.1f}" for v in vals))
    for label, key in (("requests/s", "request_throughput"), ("output tokens/s", "output_tokens_per_s")):
        lines.append(f"{label:<24}" + "".join(f"{rows[n][key]:>26.1f}" for n in names))
    return "\n".join(lines)
