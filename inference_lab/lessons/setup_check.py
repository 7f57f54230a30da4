"""Notebook 00, setup check: what this machine is, that the kernels compute the right
numbers here, its two ceilings, and the predicted split of a decode step."""

from __future__ import annotations

import jax.numpy as jnp

import pallas_kernels as pk
from inference_lab import plots
from inference_lab.analytic import costs, roofline
from inference_lab.base.random_arrays import normal
from inference_lab.lessons.machine import Machine, kernel_check_mode
from pallas_kernels.testing import rel_err


def plan_line(here: Machine) -> str:
    where = "GPU: timings on the compiled Pallas kernels" if here.kernels == "pallas" else \
        "timings on XLA's kernels; the Pallas kernels are shown under the interpreter"
    return (f"Later notebooks on this machine: preset '{here.config.name}' ({here.dtype}), {where}; "
            f"decode batch sweep up to {max(here.sizes.batch_sizes)}, prompts up to {max(here.sizes.prefill_lengths)} tokens.")


def pallas_vs_reference(seed: int = 0) -> dict:
    """Each Pallas kernel under the interpreter against its plain-jnp twin, at awkward sizes."""
    mode = kernel_check_mode()   # compiled on a GPU, interpreted elsewhere
    def rand(i, shape):
        return normal(shape, "float32", (seed, i))   # random values, never zeros

    a, b = rand(0, (37, 100)), rand(1, (100, 70))
    q, kk, vv = rand(2, (2, 45, 8, 32)), rand(3, (2, 61, 2, 32)), rand(4, (2, 61, 2, 32))
    dq, kc, vc = rand(5, (3, 8, 32)), rand(6, (3, 77, 2, 32)), rand(7, (3, 77, 2, 32))
    lengths = jnp.array([1, 40, 77], jnp.int32)
    return {
        "matmul": rel_err(pk.matmul(a, b, mode=mode), pk.reference.matmul(a, b)),
        "flash_attention": rel_err(pk.flash_attention(q, kk, vv, mode=mode),
                                   pk.reference.flash_attention(q, kk, vv)),
        "decode_attention": rel_err(pk.decode_attention(dq, kc, vc, lengths, mode=mode),
                                    pk.reference.decode_attention(dq, kc, vc, lengths)),
    }


def decode_split(cfg, spec, dtype, *, batch: int, context: int) -> dict:
    """Predicted compute, memory and overhead time of one decode step (seconds), on ``spec``'s
    ceilings (``overhead_s`` is 0 where the spec has none, e.g. a datasheet preset)."""
    cost = costs.decode_cost(cfg, batch, context)
    compute_s, memory_s = roofline.predict_terms(cost, spec, dtype)
    return {"compute_s": compute_s, "memory_s": memory_s, "overhead_s": roofline.overhead_seconds(spec),
            "intensity": cost.intensity, "cost": cost, "regime": roofline.regime(cost, spec, dtype)}


def decode_split_view(cfg, spec, dtype, *, batch: int, context: int):
    split = decode_split(cfg, spec, dtype, batch=batch, context=context)
    fig = plots.time_split_bars(split["compute_s"], split["memory_s"], overhead_s=split["overhead_s"] or None,
                                title=f"{cfg.name} on {spec.name}, decode batch {batch}, context {context}")
    text = (f"batch size {batch}: compute {split['compute_s'] * 1e3:.3g} ms vs memory {split['memory_s'] * 1e3:.3g} ms "
            f"vs overhead {split['overhead_s'] * 1e3:.3g} ms (intensity {split['intensity']:.1f} FLOP/byte, "
            f"ridge {spec.ridge_point(dtype):.1f}): {split['regime']}-bound")
    return fig, text


def plan_table(here: Machine) -> str:
    """What the next notebooks do on this machine, from the lesson sizes (not typed by hand)."""
    s = here.sizes
    gpu = here.kernels == "pallas"
    kernels = "the compiled Pallas kernels" if gpu else "XLA's kernels (Pallas shown under the interpreter)"
    rows = [
        ("01 one model, two speeds", f"one request of {s.prompt_len} tokens, both phases timed"),
        ("02 prefill is compute-bound", f"prompts of {', '.join(map(str, s.prefill_lengths))} tokens"),
        ("03 decode is bandwidth-bound", f"batches {', '.join(map(str, s.flops_batches))}; "
                                         f"contexts {', '.join(map(str, s.decode_contexts))}"),
        ("04 arithmetic intensity", f"this machine's ridge, {here.spec.ridge_point(here.dtype):.1f} FLOP/byte; "
                                    "three regimes"),
        ("05 batching", f"decode batch sweep up to {max(s.batch_sizes)}; the lone matmul kernel"),
        ("06 on your machine", f"the probe at batches {', '.join(map(str, s.probe_batches))}"),
    ]
    head = f"preset '{here.config.name}' ({here.dtype}), timed on {kernels}"
    return head + "\n" + "\n".join(f"  {a:<30}{b}" for a, b in rows)
