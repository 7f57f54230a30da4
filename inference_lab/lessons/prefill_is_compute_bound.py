"""Notebook 02, prefill is compute-bound: the prefill kernels checked, FLOP/s against prompt
length beside the lone matmul kernel's, and how a RAG request's time splits between reading
and writing."""

from __future__ import annotations

import dataclasses


import pallas_kernels as pk
from inference_lab import plots
from inference_lab.base.random_arrays import normal
from inference_lab.measure import timing
from inference_lab.analytic import costs, roofline, workload
from inference_lab.lessons.machine import DECODE_STEPS, PREFILL_COLUMNS, Sweep, percent, kernel_check_mode
from pallas_kernels.testing import flash_attention_f64, matmul_f64, rel_err


def prefill_kernels_check(seed: int = 0) -> dict:
    """The matmul and flash attention under the interpreter vs float64 NumPy (awkward sizes)."""
    mode = kernel_check_mode()   # compiled on a GPU, interpreted elsewhere
    a, b = normal((37, 100), "float32", (seed, 0)), normal((100, 70), "float32", (seed, 1))
    q = normal((2, 45, 8, 32), "float32", (seed, 2))
    kk, vv = normal((2, 61, 2, 32), "float32", (seed, 3)), normal((2, 61, 2, 32), "float32", (seed, 4))
    return {
        "matmul 37x100 @ 100x70": rel_err(pk.matmul(a, b, mode=mode), matmul_f64(a, b)),
        "flash attention T45 S61 GQA 8/2": rel_err(pk.flash_attention(q, kk, vv, causal=True, mode=mode),
                                                   flash_attention_f64(q, kk, vv, causal=True)),
    }


def prefill_sweep(model, prompt_lengths) -> Sweep:
    """Prefill at batch 1 for each prompt length, timed side by side (round-robin)."""
    return Sweep(timing.prefill_points(model, [(1, int(t)) for t in prompt_lengths]), PREFILL_COLUMNS)


def first_compute_bound_length(cfg, spec, dtype, lengths) -> int | None:
    """The shortest of ``lengths`` whose prefill the roofline calls compute-bound here."""
    for t in sorted(lengths):
        if roofline.bound(costs.prefill_cost(cfg, 1, int(t)), spec, dtype) == "compute":
            return int(t)
    return None


def prediction_table(sweep: Sweep, kernels, cfg, spec, dtype) -> str:
    """Per prompt length: the roofline's time (overhead + max of the two terms), the time the
    lone kernel predicts (its time at m = T, scaled from its weight to the model's matmul
    weights), and the measured time."""
    by_m = {k.m: k for k in kernels}
    lines = [f"{'prompt':>7}{'roofline ms':>13}{'kernel-scaled ms':>18}{'measured ms':>13}"
             f"{'measured/roofline':>19}{'measured/kernel':>17}{'bound (roofline)':>18}"]
    for r in sweep.records:
        cost = costs.prefill_cost(cfg, 1, r.prompt_len)
        roof = roofline.predict_time(cost, spec, dtype, overhead=True)
        k = by_m.get(r.prompt_len)
        scaled = k.seconds * cfg.matmul_params / (k.k * k.n) if k else None
        lines.append(f"{r.prompt_len:>7}{roof * 1e3:>13,.2f}" + (f"{scaled * 1e3:>18,.2f}" if k else f"{'-':>18}")
                     + f"{r.seconds * 1e3:>13,.2f}{r.seconds / roof:>18.2f}x"
                     + (f"{r.seconds / scaled:>16.2f}x" if k else f"{'-':>17}")
                     + f"{roofline.bound(cost, spec, dtype):>18}")
    return "\n".join(lines)


def kernel_against_peak(kernels, spec, dtype) -> str:
    """The lone matmul's fastest point against the measured "peak", and why it can pass it."""
    best = max(kernels, key=lambda k: k.flops_per_s)
    share = best.flops_per_s / spec.peak_flops(dtype)
    method = spec.sources.get("flops", "the measured matmul peak")
    return (f"the lone matmul at m = {best.m} ran at {best.flops_per_s / 1e9:,.1f} GFLOP/s, {share:.0%} of the "
            f"measured peak ({method}). "
            + ("It is above 100% because the peak is one shape's figure, not a bound on every shape (this shape "
               "may suit XLA's blocking better, or the peak's runs met a busier moment): where the kernel-scaled "
               "time falls below the roofline, it is the ceiling that is low for this shape, not the kernel that "
               "is impossibly fast."
               if share > 1 else
               "A ceiling is one shape's figure: another shape can come closer to it, or pass it."))


def prefill_point_view(sweep: Sweep, spec, dtype, prompt_len: int, kernels=()):
    rec = sweep.at(prompt_len=prompt_len)
    fig = plots.prefill_flops_vs_length(sweep.records, spec, dtype, highlight=prompt_len, kernels=kernels)
    k = {p.m: p for p in kernels}.get(prompt_len)
    lone = f"; the lone matmul at m = {prompt_len}: {percent(k.flops_per_s / spec.peak_flops(dtype))}" if k else ""
    text = (f"prompt length {prompt_len}: {rec.flops / rec.seconds / 1e9:,.1f} GFLOP/s = {percent(rec.mfu)} of the measured "
            f"matmul peak; {rec.prefill_tokens_per_s:,.0f} tok/s" + lone)
    return fig, text


@dataclasses.dataclass
class RagSplit:
    rows: list  # (ratio, prompt tokens, output tokens, prefill s, decode s)

    def table(self) -> str:
        lines = [f"{'prompt:output':>14}{'prompt':>8}{'output':>8}{'prefill s':>11}{'decode s':>10}{'decode share':>14}"]
        for ratio, p, o, ps, ds in self.rows:
            lines.append(f"{f'{ratio}:1':>14}{p:>8}{o:>8}{ps:>11.3f}{ds:>10.3f}{ds / (ps + ds):>14.0%}")
        return "\n".join(lines)

    def decode_share(self, ratio) -> float:
        for r, _, _, ps, ds in self.rows:
            if r == ratio:
                return ds / (ps + ds)
        raise KeyError(ratio)


def rag_time_split(model, prompt_tokens: int, ratios=workload.RAG_RATIO, steps: int = DECODE_STEPS) -> RagSplit:
    """Time of one RAG request's phases at the given prompt:output ratios, from measurements."""
    pre, dec = timing.measure_points([timing.PrefillPoint(model, 1, prompt_tokens),
                                      timing.DecodePoint(model, 1, prompt_tokens, steps)])
    rows = []
    for ratio in ratios:
        out = max(1, round(prompt_tokens / ratio))
        rows.append((ratio, prompt_tokens, out, pre.seconds, dec.step_seconds * out))
    return RagSplit(rows)
