"""Notebook 07, serving economics: token prices from the roofline and from this machine, and
colocated against disaggregated serving in the simulator."""

from __future__ import annotations

import dataclasses

from inference_lab import economics, measure, plots
from inference_lab.lessons.machine import DECODE_STEPS


DEFAULT_PRICE_KEY = "H100_SXM"


def price_ratios(cfg, spec, *, batches, prompt_len: int, context: int) -> dict:
    return dict(zip(batches, economics.price_ratio_vs_batch(cfg, spec, list(batches), context=context,
                                                            prompt_len=prompt_len)))


def price_table(cfg, spec, price, *, batches, prompt_len: int, context: int) -> str:
    lines = [f"{'batch':>6}{'input $/M':>11}{'output $/M':>12}{'output/input':>14}"]
    for b in batches:
        p = economics.predicted_token_prices(cfg, spec, batch=b, context=context, prompt_len=prompt_len,
                                             dollars_per_gpu_hour=price.dollars_per_hour)
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
    recs = [measure.measure_prefill(model, batch=1, prompt_len=prompt_len)]
    recs += [measure.measure_decode(model, batch=int(b), context=prompt_len, steps=DECODE_STEPS) for b in batches]
    rows = economics.measured_token_prices(recs, price.dollars_per_hour)
    return MeasuredPrices(rows, {r["batch"]: r["ratio"] for r in rows})


def price_view(cfg, spec, price, batch: int, *, prompt_len: int, context: int):
    fig = plots.price_ratio_plot(cfg, spec, contexts=(context,))
    fig.axes[0].axvline(batch, color="black", lw=1, ls=":")
    p = economics.predicted_token_prices(cfg, spec, batch=batch, context=context, prompt_len=prompt_len,
                                         dollars_per_gpu_hour=price.dollars_per_hour)
    text = (f"batch size {batch}: input ${p['input_per_million']:.3f}/M, output ${p['output_per_million']:.3f}/M: "
            f"output costs {p['ratio']:.1f}x input")
    return fig, text


def sim_summary(results: dict) -> str:
    """One line per simulated deployment: TTFT and TPOT percentiles, throughput, utilisation."""
    lines = [f"{'deployment':<28}{'TTFT p50':>10}{'p99':>9}{'TPOT p50':>10}{'p99':>8}{'tok/s':>9}  utilisation"]
    for name, res in results.items():
        row = res.summary()
        util = ", ".join(f"{pool} {u:.0%}" for pool, u in res.utilisation.items())
        lines.append(f"{name:<28}{row['ttft_p50_ms']:>8.0f}ms{row['ttft_p99_ms']:>7.0f}ms{row['tpot_p50_ms']:>8.1f}ms"
                     f"{row['tpot_p99_ms']:>6.1f}ms{row['output_tokens_per_s']:>9,.0f}  {util}")
    return "\n".join(lines)


SERVING = dict(rate=10.0, n_requests=600, output_len=(32, 128), prefill_gpus=1, decode_gpus=1)


def one_way_bandwidth(spec) -> float:
    """Bytes/s one way between two chips: datasheets quote NVLink as the total of both
    directions (900 GB/s on an H100 is 450 GB/s each way), and a KV cache travels one way."""
    if not spec.interconnect_bandwidth:
        raise ValueError(f"spec {spec.name!r} has no interconnect_bandwidth; use a GPU preset such as "
                         "hardware.PRESETS['H100_SXM']")
    return spec.interconnect_bandwidth / 2


def serving_at(phases, prompt_len: int, *, spec, seed: int = 0, serving: dict = SERVING) -> dict:
    """Colocated (2 GPUs) vs disaggregated (1 prefill + 1 decode GPU, KV caches shipped one
    way over ``spec``'s interconnect) at one prompt length."""
    kw = dict(serving, interconnect_bandwidth=one_way_bandwidth(spec))
    rate, n, out = kw.pop("rate"), kw.pop("n_requests"), kw.pop("output_len")
    gpus = kw["prefill_gpus"] + kw["decode_gpus"]
    common = dict(rate=rate, n_requests=n, prompt_len=(prompt_len // 2, prompt_len * 3 // 2), output_len=out, seed=seed)
    return {"colocated": economics.simulate(phases, mode="colocated", gpus=gpus, **common),
            "disaggregated": economics.simulate(phases, mode="disaggregated", **common, **kw)}


@dataclasses.dataclass
class LoadSweep:
    rows: list  # summary rows with "prompt_len" and "mode"

    def _of(self, mode):
        return [_as_row(r) for r in sorted((r for r in self.rows if r["mode"] == mode), key=lambda r: r["prompt_len"])]

    @property
    def colocated(self):
        return self._of("colocated")

    @property
    def disaggregated(self):
        return self._of("disaggregated")

    def table(self) -> str:
        lines = [f"{'prompt':>7}{'mode':>15}{'TTFT p50':>11}{'TTFT p99':>11}{'TPOT p50':>11}"]
        for r in sorted(self.rows, key=lambda r: (r["prompt_len"], r["mode"])):
            lines.append(f"{r['prompt_len']:>7}{r['mode']:>15}{r['ttft_p50_ms']:>9.0f}ms{r['ttft_p99_ms']:>9.0f}ms"
                         f"{r['tpot_p50_ms']:>9.1f}ms")
        return "\n".join(lines)


def _as_row(row: dict):
    """A summary row with attribute access (row.ttft_p50 in seconds, row.tpot_p50 ...)."""
    return ServingPoint(ttft_p50=row["ttft_p50_ms"] / 1e3, ttft_p99=row["ttft_p99_ms"] / 1e3,
                     tpot_p50=row["tpot_p50_ms"] / 1e3, prompt_len=row["prompt_len"], mode=row["mode"])


@dataclasses.dataclass(frozen=True)
class ServingPoint:
    """One deployment at one prompt length: median and p99 latencies in seconds."""

    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    prompt_len: int
    mode: str


def prompt_load_sweep(phases, prompt_lengths, *, spec, seed: int = 0) -> LoadSweep:
    """Raise the prompt length (the prefill load) at a fixed arrival rate, both deployments."""
    rows = []
    for p in prompt_lengths:
        for mode, res in serving_at(phases, int(p), spec=spec, seed=seed).items():
            rows.append({**res.summary(), "prompt_len": int(p), "mode": mode})
    return LoadSweep(rows)


def serving_view(phases, prompt_len: int, *, spec, seed: int = 0):
    results = serving_at(phases, prompt_len, spec=spec, seed=seed)
    fig = plots.latency_distributions(results)
    c, d = (results[m].summary() for m in ("colocated", "disaggregated"))
    text = (f"prompt length {prompt_len}: colocated TTFT p50 {c['ttft_p50_ms']:,.0f} ms, TPOT p50 {c['tpot_p50_ms']:.1f} ms; "
            f"disaggregated TTFT p50 {d['ttft_p50_ms']:,.0f} ms, TPOT p50 {d['tpot_p50_ms']:.1f} ms")
    return fig, text
