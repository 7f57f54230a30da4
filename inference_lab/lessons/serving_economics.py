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
from inference_lab.lessons import one_model_two_speeds as two_speeds
from inference_lab.lessons.machine import DECODE_STEPS
from inference_lab.analytic import roofline
from inference_lab.analytic.serving_metrics import trace_from_token_times
from inference_lab.analytic.workload import Requests

DEFAULT_PRICE_KEY = "H100_SXM"
BAND = (3.0, 5.0)
BAND_SOURCE = ("an engineer's write-up on why output tokens cost more, which reports providers charging "
               "3-5x more per output token than per input token")

PROJECT_H200 = {
    "what": "measured by this project on an H200 with jax 0.11.2, 2026-11-30 (docs/architecture.md)",
    "matmul_flops_per_s": 782e12,  # XLA (cuBLAS) bf16 matmul 8192^3
    "copy_bytes_per_s": 4.31e12,  # XLA x + y, f32, 1 GiB, read + write counted
    "decoder_bytes_per_s": 2.87e12,  # a plain-JAX Llama-3-8B-shaped decoder, batch 1: 191 tok/s x 15.0 GB a step
}

# The simulator's machine: Llama-3-8B on one H100 SXM per worker, at stated shares of the datasheet.
# Decode at 60%: the one whole decoder of this shape measured on a GPU read at 2.87 of the H200's
# 4.8 TB/s. A copy's 90% is no decode ceiling (it writes as much as it reads; notebook 00).
LAB = {"model": "llama3_8b", "spec": DEFAULT_PRICE_KEY, "mfu": 0.5, "mbu": 0.6, "step_overhead_s": 2e-4}


def lab_phases(**overrides):
    """The roofline phase model every simulation of the lesson uses (:data:`LAB`)."""
    lab = {**LAB, **overrides}
    return phases.roofline_phases(ModelConfig.preset(lab["model"]), hardware.PRESETS[lab["spec"]],
                                     step_overhead_s=lab["step_overhead_s"], mfu=lab["mfu"], mbu=lab["mbu"])


def lab_assumptions() -> str:
    h200 = hardware.PRESETS["H200"]
    m = PROJECT_H200["matmul_flops_per_s"] / h200.peak_flops("bf16")
    b = PROJECT_H200["copy_bytes_per_s"] / h200.bandwidth
    d = PROJECT_H200["decoder_bytes_per_s"] / h200.bandwidth
    return (f"step times: the roofline of {LAB['model']} on an {LAB['spec']} at {LAB['mfu']:.0%} of its datasheet "
            f"FLOP/s and {LAB['mbu']:.0%} of its bandwidth, plus {LAB['step_overhead_s'] * 1e3:.1f} ms per iteration\n"
            f"why those shares: {PROJECT_H200['what']}: the best bf16 matmul reached {m:.0%} of the datasheet "
            f"FLOP/s, and a whole forward pass (attention, norms, launches) reaches less; a decoder of this shape "
            f"at batch 1 read at {d:.0%} of the datasheet bandwidth (a plain copy moved {b:.0%}, but a copy writes "
            f"as much as it reads and is no decode ceiling)")


# ============================================================================= prices
def price_ratios(cfg, spec, *, batches, prompt_len: int, context: int, prefill_mfu: float = 1.0) -> dict:
    return dict(zip(batches, economics.price_ratio_vs_batch(cfg, spec, list(batches), context=context,
                                                            prompt_len=prompt_len, prefill_mfu=prefill_mfu)))


def price_table(cfg, spec, price, *, batches, prompt_len: int, context: int, prefill_mfu: float = 1.0) -> str:
    """Token prices by decode batch, with the device memory each batch needs (weights, KV cache and
    one iteration's working set: :func:`roofline.memory_needed` with a server's token budget); a
    batch that does not fit in 90% of the device is listed, not priced."""
    lines = [f"prefill at {prefill_mfu:.0%} MFU; {spec.name} memory {spec.memory_bytes / 1e9:.0f} GB, 90% usable",
             f"{'batch':>6}{'memory GB':>11}{'input $/M':>11}{'output $/M':>12}{'output/input':>14}"]
    for b in batches:
        need = roofline.memory_needed(cfg, b, context, prefill_tokens=roofline.SERVER_PREFILL_TOKENS)
        if not roofline.fits(cfg, b, context, spec):
            lines.append(f"{b:>6}{need / 1e9:>11.1f}   does not fit: not priced")
            continue
        p = economics.predicted_token_prices(cfg, spec, batch=b, context=context, prompt_len=prompt_len,
                                             dollars_per_gpu_hour=price.dollars_per_hour, prefill_mfu=prefill_mfu)
        lines.append(f"{b:>6}{need / 1e9:>11.1f}{p['input_per_million']:>11.3f}{p['output_per_million']:>12.3f}"
                     f"{p['ratio']:>13.1f}x")
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


def measured_price_ratios(model, price, *, batches, prompt_len: int, steps: int = DECODE_STEPS) -> MeasuredPrices:
    """Token prices from this machine's own prefill and decode throughput, per decode batch
    (``steps`` decode steps per timed loop: the notebook passes its sizes' ``decode_steps``, so
    these loops are the programs notebooks 05 and 06 compiled, read from the compile cache)."""
    points = [timing.PrefillPoint(model, 1, prompt_len)]
    points += [timing.DecodePoint(model, int(b), prompt_len, steps) for b in batches]
    recs = timing.measure_points(points)   # side by side: the ratios are what the prices rest on
    rows = economics.measured_token_prices(recs, price.dollars_per_hour)
    return MeasuredPrices(rows, {r["batch"]: r["ratio"] for r in rows})


def price_view(cfg, spec, price, batch: int, prefill_mfu: float = 1.0, *, prompt_len: int, context: int):
    fig = plots.price_ratio_plot(cfg, spec, contexts=(context,), prefill_mfu=sorted({1.0, prefill_mfu}, reverse=True))
    fig.axes[0].axvline(batch, color="black", lw=1, ls=":")
    if not roofline.fits(cfg, batch, context, spec):
        need = roofline.memory_needed(cfg, batch, context, prefill_tokens=roofline.SERVER_PREFILL_TOKENS)
        return fig, (f"batch size {batch} at context {context:,}: needs {need / 1e9:,.0f} GB, more than 90% of the "
                     f"{spec.memory_bytes / 1e9:,.0f} GB {spec.name}: no price (the largest batch that fits is "
                     f"{roofline.max_batch(cfg, spec, context)})")
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
    """The reference node's figures (:data:`one_model_two_speeds.REFERENCE_NODE`, reading A: two
    speeds), its speed gap, and the shares of its ceilings they imply (the assumed 27B shape)."""
    ref = two_speeds.reference_gap()
    return {**two_speeds.REFERENCE_NODE, "gap": ref.measured, "prefill_mfu": ref.mfu, "decode_mbu": ref.mbu,
            "what": "the course's reference node: Qwen3.5-27B on 4xH100 SXM, tensor parallel 4"}


def reference_mfu_price(cfg, spec, *, batch: int, context: int, prompt_len: int) -> str:
    """What the reference node's prefill MFU (reading A) would do to the price ratio."""
    mfu = reference_node()["prefill_mfu"]
    ratio = price_ratios(cfg, spec, batches=(batch,), prompt_len=prompt_len, context=context, prefill_mfu=mfu)[batch]
    return (f"at the reference node's prefill MFU under reading A ({mfu:.1%}), output would cost {ratio:.2f}x "
            f"input at batch {batch}: " + ("cheaper than input" if ratio < 1 else "more than input"))


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


def chunking_ttft_line(sweep: Sweep) -> str:
    """What chunking did to TTFT across the loads, at p50 and p99, in plain numbers."""
    c, k = sweep.of("colocated"), sweep.of("chunked")
    lower_p99 = [kk[sweep.x] for cc, kk in zip(c, k) if kk["ttft_p99_ms"] < cc["ttft_p99_ms"]]
    return (f"TTFT, chunked over prefill first: p50 x{ttft_cost_of_chunking(sweep):.3f} on average over the loads; "
            + (f"p99 lower with chunking at {sweep.x} {', '.join(f'{x:g}' for x in lower_p99)}"
               if lower_p99 else "p99 higher at every load"))


def tpot_above_itl(sweep: Sweep) -> list:
    """The rows whose TPOT p99 is above their ITL p99 (a few requests with one long pause each)."""
    return [r for r in sweep.rows if r["tpot_p99_ms"] > r["itl_p99_ms"]]


def budget_trades_ttft_for_itl(sweep: Sweep, default: int = simulator.DEFAULT_CHUNK_TOKENS) -> bool:
    """The smallest budget has the lowest ITL p99 and at least 1.5x the default's TTFT p50; the
    largest has the highest ITL p99."""
    rows = sweep.of("chunked")
    d = next(r for r in rows if r["chunk_tokens"] == default)
    itl = [r["itl_p99_ms"] for r in rows]
    return (rows[0]["ttft_p50_ms"] >= 1.5 * d["ttft_p50_ms"] and itl[0] == min(itl) and itl[-1] == max(itl)
            and itl[0] < d["itl_p99_ms"] < itl[-1])


def per_user_ratio(res, phases) -> float:
    """How many times faster prefill reads than decode writes, for one user of a loaded simulated
    run: prefill tokens/s of a mean prompt alone over that user's decode tokens/s (1 / TPOT p50).
    The speed gap of one stream served alone, widened by the batch every decode step serves."""
    prompt = float(np.mean(res.requests.prompt_len))
    return prompt / phases.prefill_seconds([int(prompt)]) * res.summary()["tpot_p50_ms"] / 1e3


def rag_clock(res, phases, rate: float) -> str:
    """One simulated run, two clocks: decode's share of each request's wait (its end-to-end
    latency) and its share of the GPUs' busy time. A decode step is every running answer's wait,
    and one GPU-step shared by all of them. Also the per-user ratio that sets the wait's split
    (:func:`per_user_ratio`)."""
    ok = np.isfinite(res.finish) & np.isfinite(res.first_token)
    e2e = res.finish[ok] - res.requests.arrival[ok]
    wait_share = np.median((res.finish[ok] - res.first_token[ok]) / e2e)
    ph = res.phase_seconds
    busy = sum(ph.values())
    batch = next(iter(res.mean_batch.values()), float("nan"))
    mixed = f", iterations doing both {ph['mixed'] / busy:.0%}" if ph["mixed"] else ""
    return (f"{res.mode} at {rate:g} req/s: decode is {wait_share:.0%} of a request's end-to-end latency (median) "
            f"and {ph['decode'] / busy:.0%} of the GPUs' busy time (prefill {ph['prefill'] / busy:.0%}{mixed}); "
            f"each decode step served {batch:.1f} answers on average; per user, prefill reads "
            f"{per_user_ratio(res, phases):.0f}x faster than decode writes (the per-user ratio)")


def _who_writes(lo: float, hi: float, gap: float) -> str:
    """Which phase takes most of a request's time, for prompt:output mixes ``lo``..``hi`` at a
    speed ``gap``: decode (writing) wherever the mix is below the gap."""
    if hi < gap:
        return "writing takes most of every request's time"
    if lo > gap:
        return "reading takes most of every request's time"
    return f"the mix straddles the gap: writing takes most of a request's time below {gap:.0f}:1, reading above"


def rag_against_reference(gaps) -> str:
    """The reference node's split of a RAG request's time under reading A (its two figures as two
    speeds; under reading B they give no speed gap), beside the per-user ratios of the simulated runs
    (``gaps``: :func:`per_user_ratio` of each), the phase that dominates worded from the numbers."""
    ref = two_speeds.reference_gap()
    lo, hi = two_speeds.RAG_MIX
    low, high = min(gaps), max(gaps)
    here = f"{low:.0f}x" if round(low) == round(high) else f"{low:.0f}x to {high:.0f}x"
    return (f"the reference node under reading A (a speed gap of {ref.measured:.1f}x): a RAG request served alone "
            f"spends {ref.decode_share(lo, 1):.0%} of its time writing at {lo}:1 and {ref.decode_share(hi, 1):.0%} "
            f"at {hi}:1, so {_who_writes(lo, hi, ref.measured)}; in these simulated runs the per-user ratio is "
            f"{here}, so {_who_writes(lo, hi, low)}")


# ============================================================================= the 1P1D run, explained
def prefill_wait(res, phases) -> np.ndarray:
    """Each request's TTFT minus its own prompt's prefill alone: time spent waiting (or sharing)."""
    own = np.array([phases.prefill_seconds([int(p)]) for p in res.requests.prompt_len])
    return res.ttft - own


def prefill_pool_line(colocated, disaggregated, phases) -> str:
    """The disaggregated prefill GPU's average utilisation beside the wait prompts had for it (p99),
    against colocated serving's, worded from the numbers: how busy it was on average, and whether
    its queue is still what makes the TTFT tail."""
    u = disaggregated.utilisation["prefill"]
    busy = ("idle more than half the time" if u < 0.5 else f"idle the other {1 - u:.0%}" if u < 0.9
            else "busy nearly all the time")
    wc, wd = (np.percentile(prefill_wait(r, phases), 99) * 1e3 for r in (colocated, disaggregated))
    tail = ("so a queue forms behind it whenever prompts bunch up, and the TTFT tail is that wait" if wd > wc else
            "and its prompts wait no longer than colocated ones: here the one prefill server is not the tail")
    return (f"disaggregated prefill GPU: busy {u:.0%} of the time on average ({busy}); prompts waited for it "
            f"{wd:.0f} ms at p99 against {wc:.0f} ms with two GPUs that can each prefill, {tail}")


def busy_is_not_full(res, max_batch: int, *, busy: float = 0.9, full: float = 0.25) -> bool:
    """A decode pool busy nearly all the time, yet running a batch far below its capacity."""
    return res.utilisation["decode"] >= busy and res.mean_batch["decode"] <= full * max_batch


def one_prefill_server_queues(colocated, disaggregated, phases) -> bool:
    """Disaggregated TTFT p99 is worse because its one prefill server makes prompts wait
    behind each other, where two colocated GPUs could each take one: its p99 wait is longer."""
    wc, wd = (np.percentile(prefill_wait(r, phases), 99) for r in (colocated, disaggregated))
    worse = disaggregated.summary()["ttft_p99_ms"] > colocated.summary()["ttft_p99_ms"]
    return worse and wd > wc
