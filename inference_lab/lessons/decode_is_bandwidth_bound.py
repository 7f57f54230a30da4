"""Notebook 03, decode is bandwidth-bound: the decode kernel checked, the bytes of a step, and
two experiments that tell bytes from FLOPs: add FLOPs at fixed bytes (batch), add bytes at
fixed matmul FLOPs (context); and the matrix-vector kernel alone beside the step."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

import pallas_kernels as pk
from inference_lab import plots
from inference_lab.measure import matmuls, timing
from inference_lab.analytic import costs
from inference_lab.lessons.machine import DECODE_COLUMNS, Sweep, percent, kernel_check_mode
from pallas_kernels.testing import decode_attention_f64, rel_err


def decode_kernel_check(seed: int = 0) -> dict:
    """Decode attention under the interpreter vs float64 NumPy, ragged lengths 1..S_max."""
    mode = kernel_check_mode()   # compiled on a GPU, interpreted elsewhere
    k = jax.random.split(jax.random.key(seed), 3)
    B, S, Hq, Hkv, D = 3, 77, 8, 2, 32
    q = jax.random.normal(k[0], (B, Hq, D))
    kc, vc = jax.random.normal(k[1], (B, S, Hkv, D)), jax.random.normal(k[2], (B, S, Hkv, D))
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

    def kernel_line(self) -> str:
        k = [p for p in self.kernels if p.m == 1][0]
        return (f"the matrix-vector kernel alone, [1, {k.k}] @ [{k.k}, {k.n}] {k.dtype}: {k.weight_bytes / 1e6:,.0f} MB "
                f"in {k.seconds * 1e3:,.2f} ms = {k.weight_bytes_per_s / 1e9:,.1f} GB/s")


def decode_experiments(model, *, batches, contexts, context: int, steps: int, kernel_size: int = 4096) -> Experiments:
    """Both experiments in one side-by-side measurement (so load hits every point alike),
    then the matrix-vector kernel on a ``kernel_size`` square weight."""
    points = [(int(b), int(context)) for b in batches]
    points += [(1, int(c)) for c in contexts if (1, int(c)) not in points]
    recs = timing.decode_points(model, points, steps)
    batch = [r for r in recs if r.context == context]
    ctx = [r for r in recs if r.batch == 1]
    kernels = matmuls.matmul_sweep((1, 2), k=kernel_size, n=kernel_size, dtype=model.cfg.dtype,
                                  kernels=model.kernels, repeats=9)
    return Experiments(batch, ctx, kernels)


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
