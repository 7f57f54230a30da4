"""Quantized weights on this machine, side by side in one run: which CPU formulation of an int8
matmul pays, and what each weight format does to a whole model's decode and prefill.

    PYTHONPATH=. python scripts/quantization_bench.py [--preset small] [--repeats 7] [--json PATH]
                                                      [--llama-cpp PATH/TO/llama.cpp]

Part 1 (the formulations): every streamed matrix of one layer set of ``--preset`` at decode
shapes (batch 1 and 8), each formulation against the float32 dot, timed round-robin. Part 2 (the
model): ``--preset`` with float32, bfloat16, int8 (both activation modes) and int4 weights,
decode steps at batch 1 and 8 and a prefill, all timed side by side (``measure_points``), each
ratio against float32. Prints markdown tables (for docs/benchmarks.md) and the processor.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from inference_lab.base.config import ModelConfig
from inference_lab.base.hardware import processor_summary
from inference_lab.measure import timing
from inference_lab.model.transformer import Transformer
from pallas_kernels import quantization, reference
from pallas_kernels.timing import round_robin, timed

HIGHEST = lax.Precision.HIGHEST


def _blocked(x, q, scales, tile=64):
    """Dequantize ``tile`` rows at a time (an f32 tile that stays in cache) and accumulate."""
    def body(i, acc):
        w = lax.dynamic_slice_in_dim(q, i * tile, tile, 0).astype(jnp.float32)
        return acc + jnp.dot(lax.dynamic_slice_in_dim(x, i * tile, tile, 1), w, precision=HIGHEST)
    acc = lax.fori_loop(0, q.shape[0] // tile, body, jnp.zeros((x.shape[0], q.shape[1]), jnp.float32))
    return acc * scales


def _int8_dot_one_row(x, q, scales):
    """The kept path without its padding: XLA:CPU's int8 dot on the rows as they are."""
    xq, xs = quantization.quantize_rows(x)
    return lax.dot(xq, q, preferred_element_type=jnp.int32).astype(jnp.float32) * scales * xs


FORMULATIONS = {   # name -> (what it stores, x [B, K], (float w, int8 q, scales, bf16 w) -> y [B, N])
    "float32 dot (the baseline)": lambda x, w, q, s, b: jnp.dot(x, w, precision=HIGHEST),
    "bf16 weights, dot with f32 activations": lambda x, w, q, s, b: jnp.dot(x, b, preferred_element_type=jnp.float32),
    "int8: dequantize, then f32 dot": lambda x, w, q, s, b: jnp.dot(x, q.astype(jnp.float32) * s, precision=HIGHEST),
    "int8: f32 dot on the int8 weight, then scale": lambda x, w, q, s, b: jnp.dot(x, q.astype(jnp.float32),
                                                                                  precision=HIGHEST) * s,
    "int8: fused multiply-and-sum (no dot)": lambda x, w, q, s, b: jnp.sum(x[:, :, None] * q.astype(jnp.float32)[None],
                                                                          axis=1) * s,
    "int8: blocked dequantize (64-row f32 tiles)": lambda x, w, q, s, b: _blocked(x, q, s),
    "int8 x int8 -> int32 dot, one row": lambda x, w, q, s, b: _int8_dot_one_row(x, q, s),
    # what the model runs: pk.quantized_matmul's XLA path (activations rounded per row, one row padded to two)
    "int8 x int8 -> int32 dot, rows padded to 2 (kept)": lambda x, w, q, s, b: reference.quantized_matmul(
        x, q, s, activations="int8"),
}


def formulations(cfg, batches=(1, 8), repeats=7, names=tuple(FORMULATIONS)):
    """Part 1: {batch: {name: seconds}} of the formulations ``names`` over every layer's matrices
    (the `small` preset's 8 layers: past the last-level cache, as a decode step is)."""
    rng = np.random.default_rng(0)
    shapes = cfg.matrix_shapes()[:-1]          # every layer's matrices (the head is small here)
    weights = [rng.standard_normal((k, n)).astype(np.float32) for k, n in shapes]
    ops = [(jnp.asarray(w), *quantization.quantize_int8(w), jnp.asarray(w, jnp.bfloat16)) for w in weights]
    out = {}
    for b in batches:
        xs = {k: jnp.asarray(rng.standard_normal((b, k)), jnp.float32) for k, _ in shapes}
        fns = {name: jax.jit(lambda ops, xs, f=FORMULATIONS[name]: [f(xs[w.shape[0]], w, q, s, bf)
                                                                   for w, q, s, bf in ops])
               for name in names}
        samples = round_robin([lambda fn=fn: timed(fn, ops, xs) for fn in fns.values()], repeats)
        times = {name: s.seconds for name, s in zip(fns, samples)}
        out[b] = {name: float(np.median(t)) for name, t in times.items()}
    return out


FORMATS = {  # name -> (dtype, quantization, group size, activations)
    "float32": ("float32", "none", None, "auto"),
    "bfloat16": ("bfloat16", "none", None, "auto"),
    "int8, f32 activations": ("float32", "int8", None, "float"),
    "int8 (kept: int8 activations)": ("float32", "int8", None, "int8"),
    "int4 g32": ("float32", "int4", 32, "auto"),
    "int4 g128": ("float32", "int4", 128, "auto"),
}


def models(preset, batches=(1, 8), context=128, prompt_len=256, repeats=7, formats=FORMATS):
    """Part 2: {format: {"decode": {batch: s/step}, "prefill": s, "weight_bytes": int}}, timed side by side."""
    base = Transformer(ModelConfig.preset(preset), kernels="reference")
    points, owners = [], []
    for name, (dtype, scheme, g, activations) in formats.items():
        m = base if dtype == "float32" else Transformer(base.cfg.replace(dtype=dtype), kernels="reference",
                                                        params=jax.tree.map(lambda a: a.astype(dtype), base.params()))
        m = m.quantized(scheme, g, activations=activations) if scheme != "none" else m
        for b in batches:
            points.append(timing.DecodePoint(m, b, context, 8))
            owners.append((name, m, "decode", b))
        points.append(timing.PrefillPoint(m, 1, prompt_len))
        owners.append((name, m, "prefill", 1))
    records = timing.measure_points(points, repeats=repeats, ceilings=None, progress=False)
    out = {}
    for (name, m, phase, b), r in zip(owners, records):
        row = out.setdefault(name, {"decode": {}, "weight_bytes": m.nbytes})
        if phase == "decode":
            row["decode"][b] = r.step_seconds
        else:
            row["prefill"] = r.seconds
    return out


def markdown(part1, part2, preset) -> str:
    lines = [f"Formulations (every layer's matrices of `{preset}`; ratio = float32 time / this time):", "",
             "| formulation | " + " | ".join(f"batch {b}: ratio" for b in part1) + " |",
             "|---|" + "---:|" * len(part1)]
    base = {b: t["float32 dot (the baseline)"] for b, t in part1.items()}
    for name in part1[next(iter(part1))]:
        lines.append(f"| {name} | " + " | ".join(f"x{base[b] / part1[b][name]:.2f}" for b in part1) + " |")
    lines += ["", f"Whole model (`{preset}`, reference kernels; ratio = float32 time / this time):", "",
              "| weights | MB | decode B1 ms/step | ratio | decode B8 ms/step | ratio | prefill ms | ratio |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    f = part2["float32"]
    for name, row in part2.items():
        cells = [f"{row['weight_bytes'] / 1e6:.1f}"]
        for b in sorted(row["decode"]):
            cells += [f"{row['decode'][b] * 1e3:.2f}", f"x{f['decode'][b] / row['decode'][b]:.2f}"]
        cells += [f"{row['prefill'] * 1e3:.1f}", f"x{f['prefill'] / row['prefill']:.2f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", default=None)
    p.add_argument("--llama-cpp", default=None, type=Path,
                   help="a llama.cpp tree with llama-bench built: its F32 and Q8_0 on the same shape, in the same run")
    args = p.parse_args(argv)
    cfg = ModelConfig.preset(args.preset)
    print(f"processor: {processor_summary()} ({platform.machine()}), jax {jax.__version__}", flush=True)
    part1 = formulations(cfg, repeats=args.repeats)
    part2 = models(args.preset, repeats=args.repeats)
    print(markdown(part1, part2, args.preset))
    if args.llama_cpp is not None:   # the peer, right after: the same machine in the same state
        import llama_cpp_peer

        print()
        llama_cpp_peer.main(["--llama-cpp", str(args.llama_cpp), "--preset", args.preset, "--repeats", str(args.repeats)])
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"processor": processor_summary(), "formulations": part1, "models": part2}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
