"""Notebook 04, arithmetic intensity: FLOPs per byte with and without the KV terms, the three
regimes measured on this machine, its prefill and decode points on its roofline, and the
reference node's numbers reconciled with the roofline."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from inference_lab import plots
from inference_lab.base import hardware
from inference_lab.base.config import ModelConfig
from inference_lab.base.random_arrays import normal
from inference_lab.measure import timing
from pallas_kernels.ceilings import read_bandwidth
from pallas_kernels.timing import timed
from inference_lab.analytic import costs, roofline
from inference_lab.lessons import course_record


def intensity_terms_table(cfg, contexts, batch: int) -> str:
    """Decode intensity with and without the KV-cache and attention terms."""
    lines = [f"{'context':>8}{'weights only':>14}{'+ attention & KV':>18}{'KV share of bytes':>19}"]
    for c in contexts:
        full = costs.decode_cost(cfg, batch, int(c))
        bare = costs.forward_cost_no_attention(cfg, batch)
        kv = (full.parts.get("kv_read", 0) + full.parts.get("kv_write", 0)) / full.bytes
        lines.append(f"{c:>8}{bare.intensity:>14.1f}{full.intensity:>18.1f}{kv:>19.0%}")
    return f"decode, batch {batch}, {cfg.name} ({cfg.dtype}): FLOP per byte\n" + "\n".join(lines)


# ----------------------------------------------------------------------------- three regimes
@dataclasses.dataclass(frozen=True)
class Op:
    kind: str   # "stream", "matmul", "decode", "prefill"
    label: str
    flops: float
    bytes: float
    seconds: float                 # the median of its repeats
    best_seconds: float | None = None


class _OpPoint:
    """One call of ``fn`` on arrays ``make()`` builds, as a point of
    :func:`~inference_lab.measure.timing.measure_points`: its record is the :class:`Op`."""

    phase, dtype, batch = "op", None, 1

    def __init__(self, kind, label, flops, nbytes, fn, make):
        self.kind, self.label, self.flops, self.size = kind, label, flops, nbytes
        self.fn, self.make, self.args = fn, make, None

    def memory_needed(self) -> int:
        return 3 * self.size

    def prepare(self) -> None:
        self.args = self.make()
        timed(self.fn, *self.args)                              # compile
        self.quick = timed(self.fn, *self.args) < 2e-3

    def run(self) -> float:
        if self.quick:  # a short call right after a long one finds the threads asleep and the caches
            timed(self.fn, *self.args)   # cold: warm it (untimed), as a loop of such calls would be
        return timed(self.fn, *self.args)

    def release(self) -> None:
        self.args = None

    def record(self, samples, spec) -> Op:
        return Op(self.kind, self.label, self.flops, self.size, samples.median, samples.best)


def regime_sweep(*, stream_bytes=(2**8, 2**16, 2**20, 2**24, 2**26, 2**28), matmul_sizes=(32, 512, 2048),
                 repeats: int = 9) -> list[Op]:
    """Time a read-only stream (a sum) over buffers of ``stream_bytes`` and square float32
    matmuls of ``matmul_sizes``, one call each (median of ``repeats``, taken round-robin over
    all the ops so a burst of load hits them alike). Small ones show the fixed cost of a call;
    large streams, the bandwidth; large matmuls, the math."""
    total = jax.jit(jnp.sum)
    mm = jax.jit(lambda a, b: jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST))
    points = [_OpPoint("stream", _size(n), n // 4, n, total,
                       lambda n=n: (normal((n // 4,), "float32", n),))
              for n in stream_bytes]
    for n in matmul_sizes:
        def square(n=n):
            a = normal((n, n), "float32", n + 1)
            return a, a
        points.append(_OpPoint("matmul", f"{n}\u00b3", 2.0 * n ** 3, 3 * n * n * 4, mm, square))
    return list(timing.measure_points(points, repeats=repeats, ceilings=None, desc="three regimes"))


def stream_against_ceiling(ops, spec, *, read_again=None) -> str:
    """The largest stream's rate (median and best repeat) beside the read ceiling, judged by
    :func:`~inference_lab.lessons.course_record.ceiling_status`: a best repeat within reach of the
    ceiling leaves the statistic as the gap (a ceiling is its best repeat, the table shows
    medians); one far above it means the ceiling is impossible. One far below it is read again
    with the ceiling's own method, seconds apart (``read_again() -> bytes/s``; by default
    ``pallas_kernels.ceilings.read_bandwidth`` on the same bytes): if that reaches the ceiling, the
    stream fell in a slow spell of a shared host and the ceiling stands; if not, it is stale. A
    stale or impossible ceiling sends the reader to notebook 00, which measures it and the
    course's record again."""
    big = max((o for o in ops if o.kind == "stream"), key=lambda o: o.bytes)
    median, best, ceiling = big.bytes / big.seconds, big.bytes / (big.best_seconds or big.seconds), spec.bandwidth
    line = (f"the {big.label} sum streamed at {median / 1e9:.1f} GB/s (median of its repeats), "
            f"{best / 1e9:.1f} GB/s at its best repeat")
    if course_record.ceiling_status(ceiling, best) == "stale":
        if read_again is None:
            from pallas_kernels.ceilings import read_bandwidth

            def read_again():
                return read_bandwidth(int(big.bytes), repeats=5)["bytes_per_s"]
        rates = course_record.recheck(ceiling, best, read_again)
        if rates and course_record.ceiling_status(ceiling, max(rates)) == "ok":
            return (f"{line}:\nread ceiling {ceiling / 1e9:,.1f} GB/s, this stream's best x{best / ceiling:.2f} of it; "
                    f"read again with the ceiling's own method, seconds apart: "
                    f"{', '.join(f'{r / 1e9:,.1f}' for r in rates)} GB/s (x{max(rates) / ceiling:.2f}): the ceiling "
                    "stands. This machine's read rate moves from second to second (another program, or another "
                    "tenant of the host, streaming too), and the stream's repeats fell in a slow spell: every "
                    "stream rate in the course is one moment's")
    if course_record.ceiling_status(ceiling, best) == "ok":
        why = (f"{course_record.ceiling_line(ceiling, best)}: between the median and the ceiling the gap is the "
               "statistic, a median counting the repeats that lost time to other work on this machine (or to one of "
               "its two cores being busy)")
    else:
        why = (f"{course_record.ceiling_line(ceiling, best)}: every MBU against it would be off by as much; run "
               "notebook 00 again, which measures the ceilings and the course's record afresh")
    return f"{line}:\n{why}"


def _size(n):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def model_ops(prefill, decode) -> list[Op]:
    """The lesson model's own points (a prefill and a decode step) for the three-regimes figure."""
    return [Op("prefill", f"prefill T={prefill.prompt_len}", prefill.flops, prefill.bytes, prefill.seconds),
            Op("decode", f"decode B={decode.batch}", decode.flops_per_step, decode.bytes_per_step, decode.step_seconds)]


def regime_table(ops, spec, dtype) -> str:
    lines = [f"{'op':>10}{'bytes':>11}{'MFLOP':>11}{'roofline us':>13}{'measured us':>13}{'regime (3 terms)':>18}"]
    for o in ops:
        cost = costs.Cost(o.flops, o.bytes, {})
        roof = roofline.predict_time(cost, spec, dtype)
        lines.append(f"{o.label:>10}{_size(o.bytes):>11}{o.flops / 1e6:>11,.3g}{roof * 1e6:>13,.1f}"
                     f"{o.seconds * 1e6:>13,.1f}{roofline.regime(cost, spec, dtype):>18}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- measured points
@dataclasses.dataclass
class RooflinePoints:
    prefill: list
    decode: list

    @property
    def records(self) -> list:
        return self.prefill + self.decode


def roofline_points(model, prompt_lengths, batch_sizes, context: int, steps: int = 8) -> RooflinePoints:
    points = ([timing.PrefillPoint(model, 1, int(t)) for t in prompt_lengths]
              + [timing.DecodePoint(model, int(b), int(context), steps) for b in batch_sizes])
    recs = timing.measure_points(points)   # side by side: one burst of load bends no ratio
    return RooflinePoints([r for r in recs if r.phase == "prefill"], [r for r in recs if r.phase == "decode"])


def roofline_batch_view(points: RooflinePoints, spec, dtype, cfg, batch: int):
    chosen = [r for r in points.decode if r.batch == batch]
    fig = plots.roofline_plot(spec, dtype, records=points.prefill + chosen, cfg=cfg,
                              title=f"Decode batch {batch} on {spec.name}'s roofline")
    rec = chosen[0]
    intensity = rec.flops_per_step / rec.bytes_per_step
    bound = "memory-bound" if intensity < spec.ridge_point(dtype) else "compute-bound"
    roof = min(spec.peak_flops(dtype), intensity * spec.bandwidth)
    achieved = rec.flops_per_step / rec.step_seconds
    text = (f"batch size {batch}: intensity {intensity:.1f} FLOP/byte (ridge {spec.ridge_point(dtype):.1f}): "
            f"{bound} by the roofline; {achieved / 1e9:,.1f} GFLOP/s achieved = {achieved / roof:.0%} of the roof "
            f"above it, {rec.decode_tokens_per_s:,.0f} tok/s")
    return fig, text


# ----------------------------------------------------------------------------- the cache rule
# What the course streams, and the bytes each re-reads every step (a model's weights) or every
# repeat (a kernel's weight): the sizes that decide whether the last-level cache is in the figure.
COURSE_STREAMS = (("01's small model, 08's draft", "shakespeare"),
                  ("08's target", "shakespeare_large"),
                  ("03's and 05's lone matmul", 4096 * 4096 * 4),
                  ("the lesson model of 01-05", "small"))
FITS, STREAMS = 1.0, 1.5   # x the last-level cache: at most FITS re-reads from it, at least STREAMS reads memory


def cache_rule(*, repeats: int = 3) -> str:
    """The rule for which measurements depend on the last-level cache, and the measurement: the
    read ceiling's method (:func:`pallas_kernels.ceilings.read_bandwidth`, re-read as a decode
    loop re-reads its weights) at the bytes each of :data:`COURSE_STREAMS` re-reads, beside how
    many times the cache those bytes are. The rule says which side each is on; the rates say
    whether this processor's cache reads faster than its memory at all."""
    llc = hardware.last_level_cache_bytes() if jax.devices()[0].platform == "cpu" else None
    rows = []
    for use, what in COURSE_STREAMS:
        nbytes = what if isinstance(what, int) else costs.weight_bytes(ModelConfig.preset(what))
        name = "" if isinstance(what, int) else f" ({what})"
        rows.append((use + name, nbytes, read_bandwidth(nbytes, repeats=repeats)["bytes_per_s"]))
    # memory's rate: the median of the sizes the rule says stream from memory (the largest alone
    # without a reported cache); one noisy size should not set the yardstick
    streamed = sorted(r for (_, n, r) in rows if llc and n >= STREAMS * llc) or [rows[-1][2]]
    memory = streamed[len(streamed) // 2]
    head = f"{'what the course streams':<42}{'bytes':>10}{'x cache':>9}{'read at':>12}{'x memory':>10}  the rule says"
    lines = [f"this processor: {hardware.processor_summary()}; last-level cache "
             + (f"{llc / 2**20:,.0f} MiB" if llc else "not reported (on a GPU: its L2)"), head]
    for use, nbytes, rate in rows:
        times = nbytes / llc if llc else float("nan")
        rule = ("-" if not llc else "fits: re-read from the cache" if times <= FITS else
                "streams from memory" if times >= STREAMS else "partly cached")
        lines.append(f"{use:<42}{nbytes / 1e6:>7,.1f} MB{times:>9.2f}{rate / 1e9:>7,.1f} GB/s{rate / memory:>10.2f}  {rule}")
    cached = [r for (_, n, r) in rows if llc and n <= FITS * llc]
    if cached:
        gain = min(cached) / memory
        lines.append(f"here the cache-resident sizes read at x{gain:.2f} memory's rate or more: "
                     + ("their figures measure the cache, not memory, and will differ on a processor with "
                        "another cache" if gain >= 1.2 else "this processor's cache is no faster than its memory, "
                        "so here even they measure memory"))
    return "\n".join(lines)
