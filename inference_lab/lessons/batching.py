"""Notebook 05, batching: the decode batch sweep, its knee against the roofline's flip and
against the lone matmul kernel, latency against throughput, how many sequences fit in memory,
and tensor parallelism on the roofline (the measured half is :mod:`.tensor_parallel`)."""

from __future__ import annotations

from inference_lab import plots
from inference_lab.measure import matmuls, timing
from inference_lab.analytic import costs, roofline
from inference_lab.base import checks
from inference_lab.lessons.machine import DECODE_COLUMNS, DECODE_STEPS, Sweep
from inference_lab.lessons.one_model_two_speeds import WORDS_PER_BPE_TOKEN


KNEE_FACTOR = 1.5     # the lessons' knee: the first batch whose step takes >= 1.5x the batch-1 step
NEAR_THE_LINE = 0.1   # a step within 10% of that line can cross it on the next run
SHORT_CONTEXT = 16    # cached tokens of the sweep that isolates the weights: attention and KV add almost nothing


def batch_sweep(model, batch_sizes, context: int, steps: int = DECODE_STEPS) -> "BatchSweep":
    """Decode at each batch size (one context), timed side by side (round-robin)."""
    recs = timing.decode_points(model, [(int(b), int(context)) for b in batch_sizes], steps)
    return BatchSweep(recs, DECODE_COLUMNS)


class BatchSweep(Sweep):
    def __init__(self, records, columns, skipped=()):
        super().__init__(records, columns)
        self.skipped = list(skipped)

    def at(self, batch=None, **where):
        """The record at that batch size: ``sweep.at(8)``."""
        if batch is not None:
            where["batch"] = batch
        return super().at(**where)

    def table(self) -> str:
        lines = [super().table()]
        lines += [f"skipped {phase} batch {b}: {why}" for phase, b, _, why in self.skipped]
        return "\n".join(lines)


def kernel_sweep(rows, size: int, dtype, kernels: str = "auto") -> list:
    """The lone matmul ``[m, size] @ [size, size]`` at each row count ``m``, side by side, through
    the entry point the model calls in the mode it runs (``kernels``: pass ``model.kernels``)."""
    return matmuls.matmul_sweep(tuple(int(m) for m in rows), k=size, n=size, dtype=dtype, kernels=kernels,
                                repeats=15)


def model_matmuls(model, rows) -> list:
    """The model's own weight matrices multiplied alone, for each row count, side by side."""
    return matmuls.model_matmuls_sweep(model, tuple(int(m) for m in rows), repeats=9)


def kernel_table(*sweeps) -> str:
    """One block per kernel sweep: time, time relative to m = 1, weight GB/s and GFLOP/s."""
    lines = []
    for kernels in sweeps:
        one = [k for k in kernels if k.m == 1][0]
        lines += [one.describe(), f"{'m':>5}{'ms':>9}{'x m=1':>8}{'weight GB/s':>13}{'GFLOP/s':>10}"]
        for k in kernels:
            lines.append(f"{k.m:>5}{k.seconds * 1e3:>9.2f}{k.seconds / one.seconds:>8.2f}"
                         f"{k.weight_bytes_per_s / 1e9:>13.1f}{k.flops_per_s / 1e9:>10.1f}")
    return "\n".join(lines)


def _knee(kernels):
    one = [p for p in kernels if p.m == 1][0]
    return next((k.m for k in sorted(kernels, key=lambda k: k.m) if k.seconds >= KNEE_FACTOR * one.seconds), None)


def users_view(sweep: BatchSweep, batch: int):
    """The serving trade-off at one batch size: total and per-user tokens/s."""
    rec, one = sweep.at(batch), sweep.at(1)
    fig = plots.users_vs_total(sweep.records, highlight=batch)
    text = (f"batch size {batch}: step {rec.step_seconds * 1e3:,.2f} ms ({rec.step_seconds / one.step_seconds:.2f}x "
            f"batch 1); total {rec.decode_tokens_per_s:,.0f} tok/s ({rec.decode_tokens_per_s / one.decode_tokens_per_s:.1f}x), "
            f"each user {rec.decode_tokens_per_s / batch:,.1f} tok/s ({rec.decode_tokens_per_s / batch / one.decode_tokens_per_s:.0%} "
            "of what one user alone gets)")
    return fig, text


def knee_explanation(sweep: BatchSweep, kernels, spec, cfg, dtype, lone=()) -> str:
    """Ridge, predicted flips, and the measured knees: the model's, its matmuls' alone
    (``kernels``) and, given, one large matmul's (``lone``)."""
    context = sweep.records[0].context
    knee = roofline.measured_knee(sweep.records)
    kernel_knee = _knee(kernels)
    flip_kv = roofline.predicted_flip(cfg, spec, dtype, context=context, include_kv=True)
    flip_w = roofline.predicted_flip(cfg, spec, dtype, context=context, include_kv=False)
    biggest = max(r.batch for r in sweep.records)
    cost = costs.decode_cost(cfg, biggest, context)
    kv = cost.parts.get("kv_read", 0) / cost.bytes
    knee_txt = f"batch {knee}" if knee else f"beyond the sweep (> {biggest})"
    return "\n".join([
        f"ridge point here: {spec.ridge_point(dtype):.1f} FLOP/byte; a decode step's intensity is about "
        f"{2 / cfg.dtype_bytes:g} x batch in {cfg.dtype}, so the shortcut puts the roofline's flip at batch "
        f"{spec.ridge_point(dtype) * cfg.dtype_bytes / 2:.1f}; counting every byte and FLOP of the step moves it to:",
        f"predicted flip, weights only: batch {flip_w}",
        f"predicted flip, with KV reads at context {context}: " + (f"batch {flip_kv}" if flip_kv else
                                                                   "never (KV reads grow as fast as FLOPs)"),
        f"measured knee of the model (step >= 1.5x batch 1): {knee_txt}",
        f"measured knee of {kernels[0].describe()} (time >= 1.5x m = 1): "
        + (f"m = {kernel_knee}" if kernel_knee else "beyond the sweep"),
    ] + ([f"measured knee of one {lone[0].describe()}: "
          + (f"m = {_knee(lone)}" if _knee(lone) else "beyond the sweep")] if lone else []) + [
        f"at batch {biggest}, the KV cache is {kv:.0%} of the bytes a step moves",
        growth_split(sweep, kernels, flip_kv),
        knee_reading(sweep, flip_kv),
    ])


def growth_split(sweep: BatchSweep, kernels, flip) -> str:
    """Which of the three causes grew the step here: from batch 1 to the largest batch below the
    flip that both sweeps measured, the model's added time against what its matmuls alone added
    (the kernels), the rest being every sequence's own work (attention over its KV cache, norms,
    sampling)."""
    mm = {k.m: k.seconds for k in kernels}
    b = max((r.batch for r in sweep.records if r.batch in mm and r.batch > 1 and (flip is None or r.batch < flip)),
            default=None)
    if b is None:
        return "no batch below the flip was measured in both sweeps: nothing to split"
    added = sweep.at(b).step_seconds - sweep.at(1).step_seconds
    by_matmuls = mm[b] - mm[1]
    rest = added - by_matmuls
    main = "the matmuls" if by_matmuls >= rest else "every sequence's own work (attention over its KV cache, norms, sampling)"
    return (f"from batch 1 to {b} the step grew {added * 1e3:.2f} ms: the matmuls alone added {by_matmuls * 1e3:.2f} ms "
            f"({by_matmuls / added:.0%}), the rest {rest * 1e3:.2f} ms ({rest / added:.0%}); most of it is {main}")


def knee_reading(sweep: BatchSweep, flip) -> str:
    """This run's knee beside the roofline's flip, in words the numbers choose: where the knee is
    against the flip (well before, near, later), and which smaller batches came close enough to
    the 1.5x line that the knee can land there on another run."""
    one = sweep.at(1).step_seconds
    growth = {r.batch: r.step_seconds / one for r in sorted(sweep.records, key=lambda r: r.batch) if r.batch > 1}
    knee = roofline.measured_knee(sweep.records, KNEE_FACTOR)
    lines = ["this run, step time over batch 1's: " + ", ".join(f"batch {b} x{g:.2f}" for b, g in growth.items())]
    if knee is None:
        lines.append(f"no batch in the sweep reaches x{KNEE_FACTOR}: the knee lies past batch {max(growth)}")
    elif flip is None:
        lines.append(f"the knee is batch {knee}; the roofline never flips at this context: the step grows from bytes alone")
    else:
        where = ("well before" if knee * 2 <= flip else "later than" if knee >= flip * 2 else "near")
        lines.append(f"the knee (batch {knee}) comes {where} the roofline's flip (batch {flip})")
    close = [b for b, g in growth.items() if (knee is None or b < knee) and g >= KNEE_FACTOR * (1 - NEAR_THE_LINE)]
    if close:
        lines.append("batch " + ", ".join(str(b) for b in close) + f" came within {NEAR_THE_LINE:.0%} of the "
                     f"x{KNEE_FACTOR} line ({', '.join(f'x{growth[b]:.2f}' for b in close)}): on another run the "
                     "knee can land there, so read the growth, not the knee alone")
    return "\n".join(lines)


def kv_capacity_table(cfgs, spec, contexts, *, tp: int = 1, headroom: float = 0.9) -> str:
    """Per model and context: KV bytes per token, per sequence, and :func:`roofline.max_batch`."""
    lines = [f"{spec.name}, {spec.memory_bytes / 1e9:.0f} GB x {headroom:.0%} usable" + (f", TP={tp}" if tp > 1 else ""),
             f"{'model':<22}{'KV/token':>10}{'weights':>10}{'context':>9}{'KV/sequence':>13}{'max batch':>11}"]
    for cfg in cfgs:
        kv_tok = costs.kv_bytes_per_token(cfg)
        for c in contexts:
            lines.append(f"{cfg.name:<22}{kv_tok / 1024:>7,.0f}KiB{cfg.num_params * cfg.dtype_bytes / tp / 1e9:>8.1f}GB"
                         f"{c:>9,}{kv_tok * c / tp / 1e9:>11.2f}GB{roofline.max_batch(cfg, spec, c, tp=tp, headroom=headroom):>11,}")
    return "\n".join(lines)


def tensor_parallel_table(cfg, spec, *, batch: int, context: int, degrees=(1, 2, 4, 8)) -> str:
    """Per-device bytes and predicted decode step with tensor parallelism (roofline), the
    all-reduces' latency and bytes included (:func:`roofline.allreduce_time`)."""
    lines = [f"{cfg.name} on {spec.name}, decode batch {batch}, context {context}; all-reduces: "
             f"{2 * cfg.n_layers} per step, {spec.allreduce_latency_s * 1e6:.0f} us of latency each plus their bytes"
             if spec.allreduce_latency_s else f"{cfg.name} on {spec.name}, decode batch {batch}, context {context}",
             f"{'TP':>4}{'weights/device':>16}{'step compute+memory':>21}{'all-reduce':>12}{'step':>10}{'tok/s':>10}"]
    for tp in degrees:
        if tp not in checks.tp_degrees(cfg):
            lines.append(f"{tp:>4}  (does not split {cfg.name} into whole heads and equal slices)")
            continue
        t = roofline.predict_time(costs.decode_cost(cfg, batch, context, tp=tp), spec, cfg.dtype)
        comm = roofline.allreduce_time(cfg, spec, batch, tp=tp) if tp > 1 else 0.0
        step = t + comm
        lines.append(f"{tp:>4}{costs.weight_bytes(cfg, tp=tp) / 1e9:>14.2f}GB{t * 1e3:>19.3f}ms"
                     f"{comm * 1e3:>10.3f}ms{step * 1e3:>8.3f}ms{batch / step:>10,.0f}")
    return "\n".join(lines)


def reference_knees(cfg, spec, *, tp: int, context: int) -> str:
    """Where the roofline puts the reference model's knee: the "~32" a served node saw and the
    "~256" an engineer's write-up rounds to are two different quantities."""
    knee = roofline.predicted_knee(cfg, spec, context, tp=tp)
    knee_w = roofline.predicted_knee(cfg, spec, context, tp=tp, include_kv=False)
    flip_w = roofline.predicted_flip(cfg, spec, context=context, include_kv=False)
    flip = roofline.predicted_flip(cfg, spec, context=context)
    longest = next((c for c in (256, 512, 1024, 2048, 4096) if roofline.predicted_flip(cfg, spec, context=c) is None),
                   None)
    return "\n".join([
        f"{cfg.name}, {spec.name} x{tp} (TP={tp}), context {context:,}:",
        f"  weights only: the step turns compute-bound at batch {flip_w} (the ridge: the write-up's ~256) and "
        f"reaches 1.5x batch 1 (the predicted knee) at batch {knee_w}",
        "  with the KV reads: " + (f"compute-bound from batch {flip}" if flip else
                                   f"never compute-bound at any batch (from a context of {longest:,} on, each "
                                   "sequence's KV bytes take longer than its math)")
        + f"; the step reaches 1.5x batch 1 (the predicted knee) at batch {knee}, still memory-bound: every "
          "sequence reads its own cache, so from there each added sequence adds a near-constant slice of step "
          "time and the throughput bends toward a ceiling. The served node's throughput stopped climbing freely "
          "past ~32: the same bend, from the bytes alone"])


# What the decode levers change, on the roofline. Sources of the figures that are not this lab's:
MIXTRAL = {"total": 46.7e9, "active": 12.9e9, "experts": 8, "top_k": 2,
           "source": "Mixtral of Experts (Mistral AI, 2024): 46.7B parameters, 12.9B used per token, 8 experts, top 2"}


def _moe_params_read(batch: int) -> float:
    """Parameters one decode step of a Mixtral-shaped model reads at ``batch``: the shared part,
    and every expert that some sequence of the batch is routed to (uniform, independent routing)."""
    m = MIXTRAL
    expert = (m["total"] - m["active"]) / (m["experts"] - m["top_k"])
    shared = m["active"] - m["top_k"] * expert
    touched = m["experts"] * (1 - (1 - m["top_k"] / m["experts"]) ** batch)
    return shared + touched * expert


def decode_levers(cfg, spec, *, context: int) -> str:
    """The levers on a batch-1 decode step, as the roofline prices them: bytes per parameter of the
    weights and of the KV cache (quantisation), and a mixture of experts' active parameters."""
    cost = costs.decode_cost(cfg, 1, context)
    w = cost.parts.get("weights", 0) + cost.parts.get("embedding_rows", 0)
    kv = cost.parts.get("kv_read", 0) + cost.parts.get("kv_write", 0)
    rows = [("bf16 weights, bf16 KV cache (as above)", w, kv),
            ("int8 weights (1 byte per parameter)", w / 2, kv),
            ("int4 weights (half a byte)", w / 4, kv),
            ("int4 weights, fp8 KV cache", w / 4, kv / 2)]
    lines = [f"{cfg.name}, batch 1, context {context:,}, on {spec.name} at its datasheet bandwidth "
             f"(words/s at {WORDS_PER_BPE_TOKEN} words per token):",
             f"  {'':<40}{'GB/step':>9}{'tok/s':>8}{'words/s':>9}"]
    for name, wb, kb in rows:
        tok = spec.bandwidth / (wb + kb)
        lines.append(f"  {name:<40}{(wb + kb) / 1e9:>9.2f}{tok:>8,.0f}{tok * WORDS_PER_BPE_TOKEN:>9,.0f}")
    lines.append(f"  a Mixtral-shaped mixture of experts (bf16): batch 1 reads {_moe_params_read(1) / 1e9:.1f}B of its "
                 f"{MIXTRAL['total'] / 1e9:.1f}B parameters, batch 8 {_moe_params_read(8) / 1e9:.1f}B, batch 32 "
                 f"{_moe_params_read(32) / 1e9:.1f}B: the active parameters set batch-1 speed, a batch soon touches "
                 f"every expert ({MIXTRAL['source']})")
    return "\n".join(lines)
