"""Is the read ceiling a ceiling? Everything that streams memory here, in GB/s, side by side.

    .venv/bin/python scripts/read_ceiling_check.py [--preset small] [--repeats 7]

Prints, for this machine: the read ceiling every MBU is divided by (the fastest of three
read-only kernels over a buffer several times the last-level cache, as
``inference_lab.base.hardware.measure_ceilings`` measures it), an in-place copy counted read +
write (what the ceiling used to take: faster than any read on a 2-core CPU, and not what decode
does), the lone matrix-vector kernel the model's projections are made of (``pk.matmul`` at m = 1 in
the model's mode, on a weight of the lesson size), and the lesson model's batch-1 decode step (its
bytes per step over its time). A decode step that streams faster than the read ceiling would
mean the ceiling is not one; the script says so and exits 1. docs/benchmarks.md keeps the table.
"""

from __future__ import annotations

import argparse
import platform

import jax
from flax import nnx

from inference_lab.base import hardware
from inference_lab.base.config import ModelConfig
from inference_lab.lessons.machine import cpu_sizes
from inference_lab.measure import matmuls, timing
from inference_lab.model.transformer import Transformer
from pallas_kernels import ceilings

SLACK = 1.05   # two medians of a noisy machine: a step up to 5% above the ceiling is noise


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--buffer-mib", type=int, default=None, help="the streamed buffer (default: as the ceilings)")
    args = ap.parse_args(argv)
    cfg = ModelConfig.preset(args.preset)
    nbytes = (args.buffer_mib * 2**20 if args.buffer_mib
              else hardware.ceiling_sizes(jax.default_backend(), "fp32")[1])   # the ceilings' own buffer
    read = ceilings.read_bandwidth(nbytes, repeats=args.repeats)
    copy = ceilings.copy_bandwidth(nbytes, repeats=args.repeats)
    model = Transformer(cfg, rngs=nnx.Rngs(0), kernels="auto")
    size = cpu_sizes().kernel_size if jax.default_backend() == "cpu" else 8192
    (vec,) = matmuls.matmul_sweep((1,), k=size, n=size, dtype=cfg.dtype, kernels=model.kernels, repeats=args.repeats)
    step = timing.measure_decode(model, 1, 256, 8, repeats=args.repeats, ceilings=None)
    rows = [("read ceiling (MBU is against it)", read["bytes_per_s"], read["method"]),
            ("in-place copy, read + write counted", copy["bytes_per_s"], copy["method"]),
            ("matrix-vector kernel alone", vec.weight_bytes_per_s, vec.describe() + f", m = 1, median of {args.repeats}"),
            (f"{cfg.name} decode step, batch 1", step.bytes_per_step / step.step_seconds,
             f"{step.bytes_per_step / 1e6:,.0f} MB per step (costs.decode_loop_cost), median of {args.repeats}")]
    print(f"processor: {hardware.processor_summary()}; python {platform.python_version()}, jax {jax.__version__}")
    for name, rate, how in rows:
        print(f"{name:<38}{rate / 1e9:>8,.1f} GB/s   {how}")
    over = [name for name, rate, _ in rows[2:] if rate > SLACK * read["bytes_per_s"]]
    if over:
        print(f"NOT A CEILING: {', '.join(over)} streamed faster than the read ceiling")
        return 1
    print("every read-only stream measured here is at or below the read ceiling")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
