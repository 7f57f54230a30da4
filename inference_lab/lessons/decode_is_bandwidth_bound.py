"""Notebook 03, decode is bandwidth-bound: the decode kernel checked, the bytes of a step,
step time against depth and context."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

import pallas_kernels as pk
from inference_lab import measure, plots, roofline
from inference_lab.lessons.machine import DECODE_COLUMNS, DECODE_STEPS, Machine, Sweep, _model, _pct, kernel_check_mode
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
    lines = [f"{'context':>8}{'weights MB':>12}{'KV read MB':>12}{'KV write MB':>13}{'total MB':>10}{'FLOP/byte':>11}"]
    for c in contexts:
        cost = roofline.decode_cost(cfg, batch, int(c))
        p = cost.parts
        weights = p.get("weights", 0) + p.get("embedding_rows", 0)
        lines.append(f"{c:>8}{weights / 1e6:>12,.1f}{p.get('kv_read', 0) / 1e6:>12,.1f}"
                     f"{p.get('kv_write', 0) / 1e6:>13,.2f}{cost.bytes / 1e6:>10,.1f}{cost.intensity:>11.2f}")
    return "\n".join(lines)


def decode_context_sweep(model, contexts, steps: int = DECODE_STEPS) -> Sweep:
    recs = [measure.measure_decode(model, batch=1, context=int(c), steps=steps) for c in contexts]
    return Sweep(recs, DECODE_COLUMNS)


@dataclasses.dataclass
class DepthSweep:
    layers: list
    records: list

    def table(self) -> str:
        inner = Sweep(self.records, DECODE_COLUMNS[2:]).table().splitlines()
        return "\n".join([f"{'layers':>7}" + inner[0]] +
                         [f"{n:>7}" + row for n, row in zip(self.layers, inner[1:])])

    def label(self, rec) -> str:
        return f"{self.layers[self.records.index(rec)]} layers"


def decode_depth_sweep(here: Machine, layers, *, context: int, steps: int = DECODE_STEPS) -> DepthSweep:
    """Decode at batch 1 through models of the lesson shape with ``layers`` layers each: the
    bytes a step moves grow with the depth while the math per byte stays the same."""
    recs = []
    for n in layers:
        model = _model(here.config.replace(n_layers=int(n)), "auto")
        recs.append(measure.measure_decode(model, batch=1, context=context, steps=steps))
    return DepthSweep([int(n) for n in layers], recs)


def decode_point_view(sweep: Sweep, cfg, context: int):
    rec = sweep.at(context=context)
    cost = roofline.decode_cost(cfg, rec.batch, context)
    fig = plots.decode_bytes_bars(sweep.records, cfg, highlight=context)
    kv = cost.parts.get("kv_read", 0) / cost.bytes
    text = (f"prompt length (context) {context}: {rec.bytes_per_step / 1e6:,.1f} MB per step ({kv:.0%} KV cache) in "
            f"{rec.step_seconds * 1e3:,.2f} ms = {rec.bytes_per_step / rec.step_seconds / 1e9:,.1f} GB/s, MBU {_pct(rec.mbu)}")
    return fig, text
