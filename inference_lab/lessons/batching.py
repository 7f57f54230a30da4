"""Notebook 05, batching: the decode batch sweep, its knee against the roofline's flip, and
tensor parallelism on the roofline (the measured half is :mod:`.tensor_parallel`)."""

from __future__ import annotations

from inference_lab import measure, plots, roofline
from inference_lab.lessons.machine import DECODE_COLUMNS, DECODE_STEPS, Sweep


def batch_sweep(model, batch_sizes, context: int, steps: int = DECODE_STEPS) -> "BatchSweep":
    result = measure.sweep(model, batch_sizes=list(batch_sizes), prompt_lengths=[context], steps=steps,
                           phases=("decode",), progress=True)
    return BatchSweep(list(result), DECODE_COLUMNS, skipped=result.skipped)


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


def batch_point_view(sweep: BatchSweep, spec, cfg, dtype, batch: int):
    rec, one = sweep.at(batch), sweep.at(1)
    fig = plots.decode_throughput_plot(sweep.records, cfg=cfg, spec=spec, dtype=dtype)
    ax = fig.axes[0]
    ax.scatter([batch], [rec.decode_tokens_per_s], s=220, facecolors="none", edgecolors="black", linewidths=2, zorder=6)
    text = (f"batch size {batch}: step {rec.step_seconds * 1e3:,.2f} ms ({rec.step_seconds / one.step_seconds:.2f}x batch 1), "
            f"{rec.decode_tokens_per_s:,.0f} tok/s ({rec.decode_tokens_per_s / one.decode_tokens_per_s:.1f}x batch 1)")
    return fig, text


def knee_explanation(sweep: BatchSweep, spec, cfg, dtype) -> str:
    context = sweep.records[0].context
    knee = roofline.measured_knee(sweep.records)
    flip_kv = roofline.predicted_flip(cfg, spec, dtype, context=context, include_kv=True)
    flip_w = roofline.predicted_flip(cfg, spec, dtype, context=context, include_kv=False)
    biggest = max(r.batch for r in sweep.records)
    kv_share = roofline.decode_cost(cfg, biggest, context)
    kv = kv_share.parts.get("kv_read", 0) / kv_share.bytes
    knee_txt = f"batch {knee}" if knee else f"beyond the sweep (> {biggest})"
    return "\n".join([
        f"ridge point here: {spec.ridge_point(dtype):.1f} FLOP/byte",
        f"predicted flip, weights only: batch {flip_w}",
        f"predicted flip, with KV reads at context {context}: " + (f"batch {flip_kv}" if flip_kv else "never (KV reads grow as fast as FLOPs)"),
        f"measured knee (step >= 1.5x batch 1): {knee_txt}",
        f"at batch {biggest}, the KV cache is {kv:.0%} of the bytes a step moves",
    ])


def tensor_parallel_table(cfg, spec, *, batch: int, context: int, degrees=(1, 2, 4, 8)) -> str:
    """Per-device bytes and predicted decode step with tensor parallelism (roofline)."""
    lines = [f"{cfg.name} on {spec.name}, decode batch {batch}, context {context}",
             f"{'TP':>4}{'weights/device':>16}{'step compute+memory':>21}{'all-reduce':>12}{'step':>10}{'tok/s':>10}"]
    for tp in degrees:
        if cfg.n_kv_heads % tp or cfg.n_heads % tp:
            lines.append(f"{tp:>4}  (heads do not divide by {tp})")
            continue
        t = roofline.predict_time(roofline.decode_cost(cfg, batch, context, tp=tp), spec, cfg.dtype)
        comm = roofline.allreduce_time(cfg, spec, batch, tp=tp) if tp > 1 else 0.0
        step = t + comm
        lines.append(f"{tp:>4}{roofline.weight_bytes(cfg, tp=tp) / 1e9:>14.2f}GB{t * 1e3:>19.3f}ms"
                     f"{comm * 1e3:>10.3f}ms{step * 1e3:>8.3f}ms{batch / step:>10,.0f}")
    return "\n".join(lines)
