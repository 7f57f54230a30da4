"""Notebook 07, serving economics, part one: token prices (and the MFU they assume), what serving
benchmarks measure, and colocated, chunked and disaggregated serving under load.
(Part two, pool sizing and a real engine's run: :mod:`.serving_pools`.)

Each claim the notebook asserts is a function here returning a bool from data, so a unit test
can also feed it data where the claim is false.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from inference_lab import plots
from inference_lab.analytic import economics, phases, simulator, workload
from inference_lab.base import hardware
from inference_lab.measure import timing
from inference_lab.base.config import ModelConfig
from inference_lab.lessons.machine import DECODE_STEPS
from inference_lab.analytic.serving_metrics import trace_from_token_times
from inference_lab.analytic.workload import Requests

DEFAULT_PRICE_KEY = "H100_SXM"
BAND = (3.0, 5.0)
BAND_SOURCE = ("an engineer's write-up on why output tokens cost more, which reports providers charging "
               "3-5x more per output token than per input token")

REFERENCE_NODE = {
    "what": "the course's reference node: a 27B dense model (Qwen3.5-27B) on 4xH100 SXM, tensor parallel 4",
    "params": 27e9, "gpus": 4, "spec": DEFAULT_PRICE_KEY,
    "prefill_tokens_per_s": 3288.0, "decode_tokens_per_s": 108.0,  # measured there, one request at a time
}
PROJECT_H200 = {
    "what": "measured by this project on an H200 with jax 0.11.2 (docs/architecture.md)",
    "matmul_flops_per_s": 782e12,  # XLA (cuBLAS) bf16 matmul 8192^3
    "copy_bytes_per_s": 4.31e12,  # XLA x + y, f32, 1 GiB, read + write counted
}

# The simulator's machine: Llama-3-8B on one H100 SXM per worker, at stated shares of the datasheet.
LAB = {"model": "llama3_8b", "spec": DEFAULT_PRICE_KEY, "mfu": 0.5, "mbu": 0.8, "step_overhead_s": 2e-4}


def lab_phases(**overrides):
    """The roofline phase model every simulation of the lesson uses (:data:`LAB`)."""
    lab = {**LAB, **overrides}
    return phases.roofline_phases(ModelConfig.preset(lab["model"]), hardware.PRESETS[lab["spec"]],
                                     step_overhead_s=lab["step_overhead_s"], mfu=lab["mfu"], mbu=lab["mbu"])


def lab_assumptions() -> str:
    h200 = hardware.PRESETS["H200"]
    m = PROJECT_H200["matmul_flops_per_s"] / h200.peak_flops("bf16")
    b = PROJECT_H200["copy_bytes_per_s"] / h200.bandwidth
    return (f"step times: the roofline of {LAB['model']} on an {LAB['spec']} at {LAB['mfu']:.0%} of its datasheet "
            f"FLOP/s and {LAB['mbu']:.0%} of its bandwidth, plus {LAB['step_overhead_s'] * 1e3:.1f} ms per iteration\n"
            f"why those shares: {PROJECT_H200['what']}: the best bf16 matmul reached {m:.0%} of the datasheet "
            f"FLOP/s and a plain copy {b:.0%} of its bandwidth; a whole forward pass (attention, norms, launches) "
            f"reaches less")


# ============================================================================= prices
def price_ratios(cfg, spec, *, batches, prompt_len: int, context: int, prefill_mfu: float = 1.0) -> dict:
    return dict(zip(batches, economics.price_ratio_vs_batch(cfg, spec, list(batches), context=context,
                                                            prompt_len=prompt_len, prefill_mfu=prefill_mfu)))


def price_table(cfg, spec, price, *, batches, prompt_len: int, context: int, prefill_mfu: float = 1.0) -> str:
    lines = [f"prefill at {prefill_mfu:.0%} MFU", f"{'batch':>6}{'input $/M':>11}{'output $/M':>12}{'output/input':>14}"]
    for b in batches:
        p = economics.predicted_token_prices(cfg, spec, batch=b, context=context, prompt_len=prompt_len,
                                             dollars_per_gpu_hour=price.dollars_per_hour, prefill_mfu=prefill_mfu)
        lines.append(f"{b:>6}{p['input_per_million']:>11.3f}{p['output_per_million']:>12.3f}{p['ratio']:>13.1f}x")
    return "\n".join(lines)


@dataclasses.dataclass
class MeasuredPrices:
    rows: list
    ratios: dict

    def table(self) -> str:
        lines = [f"{'batch':>6}{'input $/M':>11}{'output $/M':>12}{'output/input':>14}"]
        for r in self.rows:
            lines.append(f"{r['batch']:>6}{r['input_per_million']:>11.3f}{r['output_per_million']:>12.3f}{r['ratio']:>13.1f}x")
        return "\n".join(lines)


def measured_price_ratios(model, price, *, batches, prompt_len: int) -> MeasuredPrices:
    """Token prices from this machine's own prefill and decode throughput, per decode batch."""
    points = [timing.PrefillPoint(model, 1, prompt_len)]
    points += [timing.DecodePoint(model, int(b), prompt_len, DECODE_STEPS) for b in batches]
    recs = timing.measure_points(points)   # side by side: the ratios are what the prices rest on
    rows = economics.measured_token_prices(recs, price.dollars_per_hour)
    return MeasuredPrices(rows, {r["batch"]: r["ratio"] for r in rows})


def price_view(cfg, spec, price, batch: int, prefill_mfu: float = 1.0, *, prompt_len: int, context: int):
    fig = plots.price_ratio_plot(cfg, spec, contexts=(context,), prefill_mfu=sorted({1.0, prefill_mfu}, reverse=True))
    fig.axes[0].axvline(batch, color="black", lw=1, ls=":")
    p = economics.predicted_token_prices(cfg, spec, batch=batch, context=context, prompt_len=prompt_len,
                                         dollars_per_gpu_hour=price.dollars_per_hour, prefill_mfu=prefill_mfu)
    text = (f"batch size {batch}, prefill at {prefill_mfu:.0%} MFU: input ${p['input_per_million']:.3f}/M, "
            f"output ${p['output_per_million']:.3f}/M: output costs {p['ratio']:.1f}x input")
    return fig, text


@dataclasses.dataclass
class PriceBand:
    """Where the price ratio at one batch and context lands against the band, by prefill MFU."""

    batch: int
    context: int
    band: tuple
    mfus: np.ndarray
    ratios: np.ndarray  # at each MFU

    @property
    def at_roofline(self) -> float:
        return float(self.ratios[np.argmax(self.mfus)])

    @property
    def mfu_range(self) -> tuple[float, float] | None:
        inside = self.mfus[(self.ratios >= self.band[0]) & (self.ratios <= self.band[1])]
        return (float(inside.min()), float(inside.max())) if len(inside) else None

    def line(self) -> str:
        r = self.mfu_range
        where = "no MFU" if r is None else f"prefill MFU {r[0]:.0%}-{r[1]:.0%}"
        return (f"batch {self.batch}, context {self.context:,}: {self.at_roofline:.1f}x at the roofline (100% MFU); "
                f"{self.band[0]:g}-{self.band[1]:g}x needs {where}")


def price_band(cfg, spec, *, batch: int, context: int, band=BAND, prompt_len: int | None = None) -> PriceBand:
    mfus = np.round(np.arange(0.02, 1.0001, 0.01), 2)
    ratios = np.array([economics.price_ratio_vs_batch(cfg, spec, [batch], context=context, prompt_len=prompt_len,
                                                      prefill_mfu=float(m))[0] for m in mfus])
    return PriceBand(batch, context, tuple(band), mfus, ratios)


def roofline_misses_the_band(pb: PriceBand) -> bool:
    """The issue with the old curve: at 100% MFU the ratio stays above the band's top."""
    return pb.at_roofline > pb.band[1]


def band_reached_below(pb: PriceBand, achievable_mfu: float) -> bool:
    """The band is reached at a prefill MFU that hardware can actually deliver."""
    r = pb.mfu_range
    return r is not None and r[0] <= achievable_mfu


def reference_node() -> dict:
    """The reference node's measured speeds, and the shares of peak they imply (dense bf16 FLOP/s
    for ~2 FLOPs per parameter per prompt token; bf16 weights read once per decode step)."""
    n, spec = REFERENCE_NODE, hardware.PRESETS[REFERENCE_NODE["spec"]]
    gap = n["prefill_tokens_per_s"] / n["decode_tokens_per_s"]
    mfu = n["prefill_tokens_per_s"] * 2 * n["params"] / (n["gpus"] * spec.peak_flops("bf16"))
    mbu = n["decode_tokens_per_s"] * 2 * n["params"] / (n["gpus"] * spec.bandwidth)
    return {"gap": gap, "prefill_mfu": mfu, "decode_mbu": mbu, **n}


# ============================================================================= what benchmarks measure
def stall_example(streams: int = 4, tokens: int = 51, gap_ms: float = 5.0, stall_ms: float = 85.0, at: int = 20):
    """``streams`` answers streaming a token every ``gap_ms``; once, another user's prefill
    freezes them all: that gap is ``stall_ms``. A hand-made trace with exact numbers."""
    times = []
    for k in range(streams):
        gaps = np.full(tokens - 1, gap_ms / 1e3)
        gaps[at] = stall_ms / 1e3
        t0 = 0.05 + 1e-3 * k
        times.append(np.concatenate([[t0], t0 + np.cumsum(gaps)]))
    reqs = Requests(np.zeros(streams), np.full(streams, 1000), np.full(streams, tokens))
    return trace_from_token_times("hand-made", reqs, times)


def tpot_hides_the_stall(row: dict, factor: float = 5.0) -> bool:
    """ITL p99 sees a freeze that TPOT p99 averages away."""
    return row["itl_p99_ms"] > factor * row["tpot_p99_ms"]


def metrics_table(row: dict) -> str:
    lines = [f"{'metric':<8}{'mean':>9}{'p50':>9}{'p90':>9}{'p99':>9}   (ms)"]
    for m in ("ttft", "tpot", "itl", "e2e"):
        lines.append(f"{m.upper():<8}" + "".join(f"{row[f'{m}_{s}_ms']:>9.1f}" for s in ("mean", "p50", "p90", "p99")))
    return "\n".join(lines)


# ============================================================================= the three modes under load
def one_way_bandwidth(spec) -> float:
    """Bytes/s one way between two chips: datasheets quote NVLink as the total of both
    directions (900 GB/s on an H100 is 450 GB/s each way), and a KV cache travels one way."""
    if not spec.interconnect_bandwidth:
        raise ValueError(f"spec {spec.name!r} has no interconnect_bandwidth; use a GPU preset such as "
                         "hardware.PRESETS['H100_SXM']")
    return spec.interconnect_bandwidth / 2


RAG_TRAFFIC = {"ratio": workload.RAG_RATIO, "output_len": (32, 128)}
SERVING = dict(rate=10.0, n_requests=600, output_len=(32, 128), prefill_gpus=1, decode_gpus=1)


def serving_at(phases, prompt_len: int, *, spec, seed: int = 0, serving: dict = SERVING,
               chunk_tokens: int = simulator.DEFAULT_CHUNK_TOKENS) -> dict:
    """Colocated and chunked (2 GPUs each) and disaggregated (1 prefill + 1 decode GPU, KV caches
    shipped one way over ``spec``'s interconnect) on the same requests, prompts around ``prompt_len``."""
    kw = dict(serving)
    rate, n, out = kw.pop("rate"), kw.pop("n_requests"), kw.pop("output_len")
    gpus = kw["prefill_gpus"] + kw["decode_gpus"]
    reqs = workload.sample_requests(n, rate, prompt_len=(prompt_len // 2, prompt_len * 3 // 2), output_len=out,
                                     seed=seed)
    link = one_way_bandwidth(spec)
    return {"colocated": simulator.simulate_requests(reqs, phases, mode="colocated", gpus=gpus),
            "chunked": simulator.simulate_requests(reqs, phases, mode="chunked", gpus=gpus, chunk_tokens=chunk_tokens),
            "disaggregated": simulator.simulate_requests(reqs, phases, mode="disaggregated", interconnect_bandwidth=link,
                                                         **kw)}


def sim_summary(results: dict) -> str:
    """One line per simulated deployment: latency percentiles, throughput, utilisation, batch."""
    lines = [f"{'deployment':<28}{'TTFT p50':>9}{'p99':>7}{'TPOT p50':>9}{'p99':>6}{'ITL p99':>8}"
             f"{'E2E p50':>8}{'tok/s':>7}  busy (mean decode batch)"]
    for name, res in results.items():
        r = res.summary()
        pools = ", ".join(f"{pool} {u:.0%}" + (f" ({res.mean_batch[pool]:.1f})" if pool in res.mean_batch else "")
                          for pool, u in res.utilisation.items())
        lines.append(f"{name:<28}{r['ttft_p50_ms']:>7.0f}ms{r['ttft_p99_ms']:>5.0f}ms{r['tpot_p50_ms']:>7.1f}ms"
                     f"{r['tpot_p99_ms']:>4.0f}ms{r['itl_p99_ms']:>6.0f}ms{r['e2e_p50_ms']:>6.0f}ms"
                     f"{r['output_tokens_per_s']:>7,.0f}  {pools}")
    return "\n".join(lines)


@dataclasses.dataclass
class Sweep:
    """Summary rows of several modes against one knob (``x``: rate, prompt_len, chunk_tokens)."""

    rows: list
    x: str

    def of(self, mode: str) -> list:
        return sorted((r for r in self.rows if r["mode"] == mode), key=lambda r: r[self.x])

    @property
    def colocated(self):
        return [_as_point(r) for r in self.of("colocated")]

    @property
    def disaggregated(self):
        return [_as_point(r) for r in self.of("disaggregated")]

    @property
    def chunked(self):
        return [_as_point(r) for r in self.of("chunked")]

    def table(self) -> str:
        lines = [f"{self.x:>12}{'mode':>15}{'TTFT p50':>10}{'TTFT p99':>10}{'TPOT p99':>10}{'ITL p99':>9}{'E2E p99':>9}"]
        for r in sorted(self.rows, key=lambda r: (r[self.x], r["mode"])):
            lines.append(f"{r[self.x]:>12g}{r['mode']:>15}{r['ttft_p50_ms']:>8.0f}ms{r['ttft_p99_ms']:>8.0f}ms"
                         f"{r['tpot_p99_ms']:>8.1f}ms{r['itl_p99_ms']:>7.0f}ms{r['e2e_p99_ms']:>7.0f}ms")
        return "\n".join(lines)


LoadSweep = Sweep  # the name notebook 07 used before the three modes


@dataclasses.dataclass(frozen=True)
class ServingPoint:
    """One deployment at one point of a sweep: latencies in seconds."""

    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    itl_p99: float
    mode: str
    prompt_len: int | None = None


def _as_point(row: dict) -> ServingPoint:
    return ServingPoint(row["ttft_p50_ms"] / 1e3, row["ttft_p99_ms"] / 1e3, row["tpot_p50_ms"] / 1e3,
                        row["tpot_p99_ms"] / 1e3, row["itl_p99_ms"] / 1e3, row["mode"], row.get("prompt_len"))


def prompt_load_sweep(phases, prompt_lengths, *, spec, seed: int = 0) -> Sweep:
    """Raise the prompt length (the prefill load) at a fixed arrival rate, all three modes."""
    rows = []
    for p in prompt_lengths:
        for mode, res in serving_at(phases, int(p), spec=spec, seed=seed).items():
            rows.append({**res.summary(), "prompt_len": int(p)})
    return Sweep(rows, "prompt_len")


def rate_sweep(phases, rates, *, spec, gpus: int = 2, n_requests: int = 500, seed: int = 0,
               traffic: dict = RAG_TRAFFIC) -> Sweep:
    """Rising load on the same GPUs: colocated and chunked on ``gpus`` GPUs, disaggregated as
    1 prefill + ``gpus - 1`` decode GPUs; RAG traffic by default (prompts 19-47x the answer)."""
    rows = []
    for rate in rates:
        reqs = workload.sample_requests(n_requests, rate, seed=seed, **traffic)
        for mode in simulator.MODES:
            res = simulator.simulate_requests(reqs, phases, mode=mode, gpus=gpus, prefill_gpus=1,
                                              decode_gpus=gpus - 1, interconnect_bandwidth=one_way_bandwidth(spec))
            rows.append({**res.summary(), "rate": rate})
    return Sweep(rows, "rate")


def budget_sweep(phases, budgets, *, rate: float, gpus: int = 2, n_requests: int = 500, seed: int = 0,
                 traffic: dict = RAG_TRAFFIC) -> Sweep:
    """Chunked prefill at one load with every token budget in ``budgets`` (rows' ``chunk_tokens``)."""
    reqs = workload.sample_requests(n_requests, rate, seed=seed, **traffic)
    rows = [{**simulator.simulate_requests(reqs, phases, mode="chunked", gpus=gpus, chunk_tokens=int(b)).summary(),
             "chunk_tokens": int(b)} for b in budgets]
    return Sweep(rows, "chunk_tokens")


def chunking_holds_tpot(sweep: Sweep) -> bool:
    """Across rising load, chunked TPOT p99 grows less than prefill-first colocated's, and is
    lower at the highest load."""
    c, k = sweep.of("colocated"), sweep.of("chunked")
    grow_c = c[-1]["tpot_p99_ms"] / c[0]["tpot_p99_ms"]
    grow_k = k[-1]["tpot_p99_ms"] / k[0]["tpot_p99_ms"]
    return grow_k < grow_c and k[-1]["tpot_p99_ms"] < c[-1]["tpot_p99_ms"]


def ttft_cost_of_chunking(sweep: Sweep) -> float:
    """Chunked TTFT p50 over prefill-first colocated's, averaged over the sweep's loads."""
    return float(np.mean([k["ttft_p50_ms"] / c["ttft_p50_ms"] for c, k in zip(sweep.of("colocated"), sweep.of("chunked"))]))


def chunking_costs_ttft(sweep: Sweep) -> bool:
    """A chunked prompt's first token comes later than prefill-first's, on average over the loads."""
    return ttft_cost_of_chunking(sweep) > 1.0


def budget_trades_ttft_for_itl(sweep: Sweep, default: int = simulator.DEFAULT_CHUNK_TOKENS) -> bool:
    """The smallest budget has the lowest ITL p99 and at least 1.5x the default's TTFT p50; the
    largest has the highest ITL p99."""
    rows = sweep.of("chunked")
    d = next(r for r in rows if r["chunk_tokens"] == default)
    itl = [r["itl_p99_ms"] for r in rows]
    return (rows[0]["ttft_p50_ms"] >= 1.5 * d["ttft_p50_ms"] and itl[0] == min(itl) and itl[-1] == max(itl)
            and itl[0] < d["itl_p99_ms"] < itl[-1])


def budget_view(phases, chunk_tokens: int, *, rate: float, gpus: int = 2, seed: int = 0, n_requests: int = 400):
    reqs = workload.sample_requests(n_requests, rate, seed=seed, **RAG_TRAFFIC)
    runs = {"colocated": simulator.simulate_requests(reqs, phases, mode="colocated", gpus=gpus),
            f"chunked, {chunk_tokens} tokens": simulator.simulate_requests(reqs, phases, mode="chunked", gpus=gpus,
                                                                           chunk_tokens=chunk_tokens)}
    c, k = (r.summary() for r in runs.values())
    text = (f"chunk budget {chunk_tokens} tokens at {rate:g} req/s: TTFT p50 {k['ttft_p50_ms']:,.0f} ms "
            f"(prefill first: {c['ttft_p50_ms']:,.0f}), TPOT p99 {k['tpot_p99_ms']:.1f} ms ({c['tpot_p99_ms']:.1f}), "
            f"ITL p99 {k['itl_p99_ms']:.1f} ms ({c['itl_p99_ms']:.1f})")
    return plots.latency_distributions(runs), text


def serving_view(phases, prompt_len: int, *, spec, seed: int = 0):
    results = serving_at(phases, prompt_len, spec=spec, seed=seed)
    fig = plots.latency_distributions(results)
    c, k, d = (results[m].summary() for m in simulator.MODES)
    text = (f"prompt length {prompt_len}: TTFT p50 / TPOT p99 colocated {c['ttft_p50_ms']:,.0f} / {c['tpot_p99_ms']:.1f} ms, "
            f"chunked {k['ttft_p50_ms']:,.0f} / {k['tpot_p99_ms']:.1f} ms, "
            f"disaggregated {d['ttft_p50_ms']:,.0f} / {d['tpot_p99_ms']:.1f} ms")
    return fig, text


# ============================================================================= the 1P1D run, explained
def prefill_wait(res, phases) -> np.ndarray:
    """Each request's TTFT minus its own prompt's prefill alone: time spent waiting (or sharing)."""
    own = np.array([phases.prefill_seconds([int(p)]) for p in res.requests.prompt_len])
    return res.ttft - own


def busy_is_not_full(res, max_batch: int, *, busy: float = 0.9, full: float = 0.25) -> bool:
    """A decode pool busy nearly all the time, yet running a batch far below its capacity."""
    return res.utilisation["decode"] >= busy and res.mean_batch["decode"] <= full * max_batch


def one_prefill_server_queues(colocated, disaggregated, phases) -> bool:
    """Disaggregated TTFT p99 is worse because its one prefill server makes prompts wait
    behind each other, where two colocated GPUs could each take one: its p99 wait is longer."""
    wc, wd = (np.percentile(prefill_wait(r, phases), 99) for r in (colocated, disaggregated))
    worse = disaggregated.summary()["ttft_p99_ms"] > colocated.summary()["ttft_p99_ms"]
    return worse and wd > wc
