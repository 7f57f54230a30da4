"""Notebook 04, arithmetic intensity: FLOPs per byte with and without the KV terms, and this
machine's measured points on its roofline."""

from __future__ import annotations

import dataclasses

from inference_lab import measure, plots, roofline
from inference_lab.lessons.machine import DECODE_STEPS


def intensity_terms_table(cfg, contexts, batch: int) -> str:
    """Decode intensity with and without the KV-cache and attention terms."""
    lines = [f"{'context':>8}{'weights only':>14}{'+ attention & KV':>18}{'KV share of bytes':>19}"]
    for c in contexts:
        full = roofline.decode_cost(cfg, batch, int(c))
        bare = roofline.forward_cost_no_attention(cfg, batch)
        kv = (full.parts.get("kv_read", 0) + full.parts.get("kv_write", 0)) / full.bytes
        lines.append(f"{c:>8}{bare.intensity:>14.1f}{full.intensity:>18.1f}{kv:>19.0%}")
    return f"decode, batch {batch}, {cfg.name} ({cfg.dtype}): FLOP per byte\n" + "\n".join(lines)


@dataclasses.dataclass
class RooflinePoints:
    prefill: list
    decode: list

    @property
    def records(self) -> list:
        return self.prefill + self.decode


def roofline_points(model, prompt_lengths, batch_sizes, context: int) -> RooflinePoints:
    pre = [measure.measure_prefill(model, batch=1, prompt_len=int(t)) for t in prompt_lengths]
    dec = [measure.measure_decode(model, batch=int(b), context=context, steps=DECODE_STEPS) for b in batch_sizes]
    return RooflinePoints(pre, dec)


def roofline_batch_view(points: RooflinePoints, spec, dtype, cfg, batch: int):
    chosen = [r for r in points.decode if r.batch == batch]
    fig = plots.roofline_plot(spec, dtype, records=points.prefill + chosen, cfg=cfg,
                              title=f"Decode batch {batch} on {spec.name}'s roofline")
    rec = chosen[0]
    intensity = rec.flops_per_step / rec.bytes_per_step
    bound = "memory-bound" if intensity < spec.ridge_point(dtype) else "compute-bound"
    text = (f"batch size {batch}: intensity {intensity:.1f} FLOP/byte (ridge {spec.ridge_point(dtype):.1f}), "
            f"{rec.flops_per_step / rec.step_seconds / 1e9:,.1f} GFLOP/s achieved, {rec.decode_tokens_per_s:,.0f} tok/s: {bound}")
    return fig, text
