"""Notebook 03, decode is bandwidth-bound: the decode kernel checked, the bytes of a step, and
two experiments that tell bytes from FLOPs: add FLOPs at fixed bytes (batch), add bytes at
fixed matmul FLOPs (context); and the matrix-vector kernel alone beside the step."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

import pallas_kernels as pk
from inference_lab import plots
from inference_lab.base.random_arrays import normal
from inference_lab.measure import matmuls, timing
from inference_lab.analytic import costs, roofline
from inference_lab.lessons.machine import DECODE_COLUMNS, Sweep, percent, kernel_check_mode
from inference_lab.lessons.one_model_two_speeds import STREAM_CONTEXT, hollow
from pallas_kernels.testing import decode_attention_f64, rel_err


def decode_kernel_check(seed: int = 0) -> dict:
    """Decode attention under the interpreter vs float64 NumPy, ragged lengths 1..S_max."""
    mode = kernel_check_mode()   # compiled on a GPU, interpreted elsewhere
    B, S, Hq, Hkv, D = 3, 77, 8, 2, 32
    q = normal((B, Hq, D), "float32", (seed, 0))
    kc, vc = normal((B, S, Hkv, D), "float32", (seed, 1)), normal((B, S, Hkv, D), "float32", (seed, 2))
    lengths = jnp.array([1, 40, S], jnp.int32)
    return {"decode attention lengths 1/40/77 GQA 8/2":
            rel_err(pk.decode_attention(q, kc, vc, lengths, mode=mode),
                    decode_attention_f64(q, kc, vc, lengths))}


def decode_bytes_table(cfg, batch: int, contexts) -> str:
    lines = [f"{'context':>8}{'weights MB':>12}{'KV read MB':>12}{'KV write MB':>13}{'total MB':>10}"
             f"{'MFLOP':>9}{'FLOP/byte':>11}"]
    for c in contexts:
        cost = costs.decode_cost(cfg, batch, int(c))
        p = cost.parts
        weights = p.get("weights", 0) + p.get("embedding_rows", 0)
        lines.append(f"{c:>8}{weights / 1e6:>12,.1f}{p.get('kv_read', 0) / 1e6:>12,.1f}"
                     f"{p.get('kv_write', 0) / 1e6:>13,.2f}{cost.bytes / 1e6:>10,.1f}{cost.flops / 1e6:>9,.0f}"
                     f"{cost.intensity:>11.2f}")
    return "\n".join(lines)


@dataclasses.dataclass
class Experiments:
    """The two decode experiments of one run, timed side by side, and the lone kernel."""

    batch: list  # decode records at batch sizes, one context: FLOPs x B, bytes ~x1
    context: list  # decode records at batch 1, several contexts: KV bytes up, matmul FLOPs fixed
    kernels: list  # matmuls.KernelPoint at m = 1 (and 2): the matrix-vector kernel alone
    hollow: object  # the batch-1 step of the model's hollow twin (notebook 01): its fixed costs
    model_cfg: object  # the model's ModelConfig (its heads set attention's intensity)
    hollow_short: object = None  # the same twin at notebook 01's shorter context, timed beside it

    def table(self) -> str:
        rows = sorted(self.batch, key=lambda r: r.batch) + sorted(
            (r for r in self.context if (r.batch, r.context) not in {(b.batch, b.context) for b in self.batch}),
            key=lambda r: r.context)
        base = rows[0]
        head = Sweep([], DECODE_COLUMNS).table()
        lines = [head + f"{'FLOPs x':>9}{'bytes x':>9}{'time x':>8}"]
        for r in rows:
            lines.append(Sweep([r], DECODE_COLUMNS).table().splitlines()[1]
                         + f"{r.flops_per_step / base.flops_per_step:>9.2f}{r.bytes_per_step / base.bytes_per_step:>9.2f}"
                         f"{r.step_seconds / base.step_seconds:>8.2f}")
        return "\n".join(lines)

    def kernel_line(self, read_ceiling: float | None = None) -> str:
        """The matrix-vector kernel's stream rate (bytes over its median time) and, given the read
        ceiling (bytes/s), what share of it that is; then the hollow twin's share of the step."""
        k = [p for p in self.kernels if p.m == 1][0]
        one = min(self.batch, key=lambda r: r.batch)
        share = ("" if read_ceiling is None else
                 f", {k.weight_bytes_per_s / read_ceiling:.0%} of the read ceiling ({read_ceiling / 1e9:,.1f} GB/s: "
                 "the best repeat of the fastest read kernel, where this is one kernel's median)")
        return (f"the matrix-vector kernel alone, [1, {k.k}] @ [{k.k}, {k.n}] {k.dtype}: {k.weight_bytes / 1e6:,.0f} MB "
                f"in {k.seconds * 1e3:,.2f} ms = {k.weight_bytes_per_s / 1e9:,.1f} GB/s{share}\n"
                f"the model's hollow twin (same layers and calls, almost no bytes), batch 1, context "
                f"{self.hollow.context}: {self.hollow.step_seconds * 1e3:,.3f} ms, "
                f"{self.hollow.step_seconds / one.step_seconds:.0%} of the batch-1 step: what the step costs whatever "
                "its bytes" + self._twin_by_context())

    def _twin_by_context(self) -> str:
        """The twin at notebook 01's context beside this one's: its attention keeps a cost per
        cached token even with almost no bytes to read, so its time is not one number."""
        short = self.hollow_short
        if short is None or short.context == self.hollow.context:
            return ""
        grew = self.hollow.step_seconds / short.step_seconds
        how = (f"x{grew:.1f} at {self.hollow.context}: its attention still costs time per cached token with almost no "
               "bytes to read, so a step's fixed cost depends on the context" if grew >= 1.3 else
               "about the same: its cost does not depend on the context here")
        return (f"\nthe same twin at notebook 01's context of {short.context}: {short.step_seconds * 1e3:,.3f} ms, "
                + how)


def decode_experiments(model, *, batches, contexts, context: int, steps: int, kernel_size: int = 4096) -> Experiments:
    """Both experiments and the model's hollow twin at batch 1 in one side-by-side measurement (so
    load hits every point alike), then the matrix-vector kernel on a ``kernel_size`` square weight."""
    pairs = [(int(b), int(context)) for b in batches]
    pairs += [(1, int(c)) for c in contexts if (1, int(c)) not in pairs]
    points = [timing.DecodePoint(model, b, c, steps) for b, c in pairs]
    # the twin at this context, and at notebook 01's where that is shorter: the two notebooks' twins
    twins = sorted({min(STREAM_CONTEXT, int(context)), int(context)})
    points += [timing.DecodePoint(hollow(model), 1, c, steps) for c in twins]
    *recs, twin = timing.measure_points(points, desc="decode")
    short = recs.pop() if len(twins) == 2 else None
    batch = [r for r in recs if r.context == context]
    ctx = [r for r in recs if r.batch == 1]
    kernels = matmuls.matmul_sweep((1, 2), k=kernel_size, n=kernel_size, dtype=model.cfg.dtype,
                                  kernels=model.kernels, repeats=9)
    return Experiments(batch, ctx, kernels, twin, model.cfg, hollow_short=short)


def experiment_view(exp: Experiments, batch: int):
    recs = sorted(exp.batch, key=lambda r: r.batch)
    fig = plots.flops_or_bytes(recs, exp.context)
    ax = fig.axes[0]
    r, one = [x for x in recs if x.batch == batch][0], recs[0]
    t = r.step_seconds / one.step_seconds
    ax.scatter([batch], [t], s=220, facecolors="none", edgecolors="black", lw=2, zorder=6)
    text = (f"batch size {batch}: FLOPs x{r.flops_per_step / one.flops_per_step:.1f}, bytes "
            f"x{r.bytes_per_step / one.bytes_per_step:.2f}, step time x{t:.2f} ({r.step_seconds * 1e3:,.2f} ms); "
            f"MFU {percent(r.mfu)}, MBU {percent(r.mbu)}")
    return fig, text


def context_reading(exp: Experiments, spec, dtype) -> str:
    """What the context experiment can and cannot tell on this machine. A longer context adds the
    KV cache's bytes *and* attention's FLOPs, at attention's own intensity; where that intensity
    sits near the machine's ridge the two grow almost together, and the experiment cannot tell
    a compute-bound step from a bandwidth-bound one. It still shows the cached tokens cost time."""
    by = {r.context: r for r in exp.context}
    lo, hi = by[min(by)], by[max(by)]
    f, b, t = (hi.flops_per_step / lo.flops_per_step, hi.bytes_per_step / lo.bytes_per_step,
               hi.step_seconds / lo.step_seconds)
    cfg = exp.model_cfg
    ai, ridge = costs.attention_intensity(cfg), roofline.ridge_point(spec, dtype)
    place = "above both" if t > max(f, b) else "below both" if t < min(f, b) else "between them"
    kv_rate = (hi.bytes_per_step - lo.bytes_per_step) / max(hi.step_seconds - lo.step_seconds, 1e-12)
    lines = [f"context {lo.context} -> {hi.context}: a compute-bound step would take x{f:.2f}, a bandwidth-bound "
             f"one x{b:.2f}; it took x{t:.2f}, {place}; the extra KV bytes cost time at {kv_rate / 1e9:,.1f} GB/s"]
    if ai > ridge / 4:
        lines += [f"the added work is attention's, at {ai:g} FLOP per KV byte ({cfg.dtype}), against a ridge of "
                  f"{ridge:.1f} here: near it, so a longer context adds FLOPs almost as fast as bytes, and on this "
                  "machine this experiment cannot tell the two regimes apart (the batch experiment does); what it "
                  "shows is that every cached token costs time at every step",
                  f"on a GPU, in bf16, attention does {cfg.n_heads / cfg.n_kv_heads:g} FLOP per KV byte against a "
                  "ridge of 150-400: far below it, and there the same experiment separates the regimes"]
    else:
        lines.append(f"the added work is attention's, at {ai:g} FLOP per KV byte, far below the ridge of {ridge:.0f} "
                     "here: the added FLOPs cost almost nothing beside the added bytes, so the experiment separates "
                     "the regimes")
    return "\n".join(lines)
