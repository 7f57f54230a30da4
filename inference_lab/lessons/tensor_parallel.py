"""Notebook 05's measured tensor parallelism: the tiny model split over simulated CPU devices.

The number of jax devices is fixed when jax starts, and a notebook's jax has long started: so
the measuring runs in a child process (:func:`run_with_devices`) started with
``XLA_FLAGS=--xla_force_host_platform_device_count=N``; this module is also that child's
program (``python -m inference_lab.lessons.tensor_parallel ARGS``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from inference_lab.base import checks, hardware
from inference_lab.runtime import hlo
from inference_lab.measure import timing
from inference_lab.model import parallel
from inference_lab.analytic import costs, roofline
from inference_lab.base.config import ModelConfig
from inference_lab.model.kv_cache import KVCache
from inference_lab.model.transformer import Transformer


def _measure_rows(cfg_name: str, degrees, batch: int, context: int, steps: int, repeats: int,
                  kernels: str) -> list[dict]:
    """Run in a process that has ``max(degrees)`` devices: one row per degree."""
    cfg = ModelConfig.preset(cfg_name)
    base = Transformer(cfg, kernels=kernels)
    rows = []
    for tp in degrees:
        # tp=1 is the plain one-device model: the baseline, with no collectives at all.
        model = base if tp == 1 else parallel.shard(base, parallel.make_mesh(tp))
        rec = timing.measure_decode(model, batch, context, steps, repeats=repeats, ceilings=None)
        # The collectives of the very program just timed (its loop body is one decode step);
        # compiling it again is mostly a hit in the persistent compilation cache.
        text = hlo.compiled_decode_text(model, KVCache.create(cfg, batch, context + steps), steps=steps)
        rows.append({"tp": tp, "weight_bytes_per_device": parallel.weight_bytes_per_device(model),
                     "all_reduces": hlo.count_all_reduces(text),
                     "all_gathers": sum(1 for op, *_ in hlo.hlo_ops(text) if op.startswith("all-gather")),
                     "measured_step_s": rec.step_seconds})
    return rows


def tp_lesson(cfg_name: str = "tiny", degrees=(1, 2, 4), *, spec="H100_SXM", batch: int = 1,
              context: int = 64, steps: int = 8, repeats: int = 3, kernels: str = "reference",
              timeout: float = 120.0) -> list[dict]:
    """Tensor parallelism measured on simulated CPU devices, next to the roofline's prediction.

    The measuring runs in a child process started with
    ``XLA_FLAGS=--xla_force_host_platform_device_count=max(degrees)`` (the calling process,
    a notebook, already has its devices fixed). Returns one dict per degree:

    - ``tp``; ``weight_bytes_per_device``: bytes of weights on device 0 (about total / tp,
      the norms are replicated);
    - ``all_reduces``: all-reduce instructions in the compiled decode step (``2 * n_layers``
      + 1 for the vocabulary-split embedding when tp > 1), ``all_gathers``: the logits' one;
    - ``measured_step_s``: median decode step time at ``batch`` x ``context``;
    - ``predicted_step_s``: the roofline step time on ``spec`` (a preset name or a
      HardwareSpec; its name in ``spec``): ``predict_time(decode_cost(..., tp))`` +
      ``predicted_allreduce_s`` (``roofline.allreduce_time``; 0 when the spec has no
      interconnect, e.g. ``hardware.measure_ceilings()`` of this machine).

    ``kernels="reference"`` (XLA's kernels) by default: the lesson is about the split and its
    collectives; "interpret" works too but takes minutes. :func:`format_tp_rows` prints the
    rows as a table.

    Simulated CPU devices are threads sharing the same cores and the same memory, so the
    measured time does NOT shrink with tp (it grows: the same work plus the collectives).
    That is the lesson's point: tensor parallelism buys bandwidth only when each shard has
    its own memory, as each GPU has its own HBM; the prediction shows what it buys there.
    Takes ~10 s for ``tiny`` on two cores (most of it starting jax and compiling).
    """
    cfg = ModelConfig.preset(cfg_name)
    if isinstance(spec, str):
        if spec not in hardware.PRESETS:
            raise ValueError(f"spec={spec!r} is unknown; use one of {sorted(hardware.PRESETS)} or a HardwareSpec")
        spec = hardware.PRESETS[spec]
    degrees = [checks.tensor_parallel(cfg, t) for t in degrees]
    if not degrees:
        raise ValueError("degrees is empty; give at least one tp, e.g. (1, 2, 4)")
    for name, value in (("batch", batch), ("context", context), ("steps", steps), ("repeats", repeats)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")

    args = dict(cfg_name=cfg_name, degrees=degrees, batch=int(batch), context=int(context),
                steps=int(steps), repeats=int(repeats), kernels=kernels)
    rows = run_with_devices(max(degrees), [sys.executable, "-m", "inference_lab.lessons.tensor_parallel", json.dumps(args)],
                            timeout=timeout)
    for r in rows:
        tp = r["tp"]
        comm = roofline.allreduce_time(cfg, spec, batch, tp=tp) if tp > 1 and spec.interconnect_bandwidth else 0.0
        r["spec"] = spec.name
        r["predicted_allreduce_s"] = comm
        r["predicted_step_s"] = roofline.predict_time(costs.decode_cost(cfg, batch, context, tp=tp),
                                                      spec, cfg.dtype) + comm
    return rows


def run_with_devices(n_devices: int, argv: list[str], *, timeout: float) -> list | dict:
    """Run ``argv`` in a child process that sees ``n_devices`` simulated CPU devices and
    return the JSON it prints on its last stdout line. The child is always ended."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n_devices}").strip()
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError(f"the tensor-parallel child process did not finish in {timeout:.0f} s") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise RuntimeError(f"the tensor-parallel child process failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def format_tp_rows(rows: list[dict]) -> str:
    """The rows of :func:`tp_lesson` as a text table."""
    spec = rows[0]["spec"] if rows else "?"
    lines = [f"{'tp':>3}{'weights/device':>16}{'all-reduces':>13}{'measured step (here)':>22}"
             f"{'predicted step (' + spec + ')':>30}{'of which all-reduces':>22}"]
    for r in rows:
        lines.append(f"{r['tp']:>3}{r['weight_bytes_per_device'] / 1e6:>13.2f} MB{r['all_reduces']:>13}"
                     f"{r['measured_step_s'] * 1e3:>19.3f} ms{r['predicted_step_s'] * 1e6:>27.2f} us"
                     f"{r['predicted_allreduce_s'] * 1e6:>19.2f} us")
    return "\n".join(lines)


if __name__ == "__main__":  # the child process of tp_lesson
    print(json.dumps(_measure_rows(**json.loads(sys.argv[1]))))
