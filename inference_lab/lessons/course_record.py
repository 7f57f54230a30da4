"""One measured machine per course run: the figures every notebook quotes, measured once.

Notebook 00 (or whichever notebook runs first) makes the record: this machine's ceilings (matmul
FLOP/s, the read rate, a call's fixed cost), the lesson model's prefill and batch-1 decode at the
lessons' reference shapes, their ratio N ("our model is N times slower at writing than reading")
with its MFU and MBU, the roofline's flip and the measured knee, stamped with the processor, the
time and the load. Every later notebook reads it (:func:`load`), says where its figures come from,
and when it measures a quantity again prints the record's value beside its own
(:func:`beside_the_record`): a drift past :data:`DRIFT` (or past the run's own noise, whichever is
larger) says so, and the record is made again.

A ceiling can go wrong in two ways, and both are caught: a run's own read stream that cannot
come within :data:`STALE` of the read ceiling means the ceiling was measured on a quieter machine
(stale, :func:`ceiling_status`); a rate *above* its ceiling, a read faster than the read ceiling or
a prefill faster than the matmul peak, means the ceiling is impossible (measured in a busy spell,
``roofline.beats_ceiling``). Either way it is measured again (:func:`remeasure_if_beaten`), and a
record whose MFU or MBU came out above 100% is made with ceilings measured again.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform

from inference_lab.analytic import roofline
from inference_lab.base import hardware
from inference_lab.base.disk_cache import cache_dir
from inference_lab.lessons import batching
from inference_lab.lessons.machine import Machine, lesson_model
from inference_lab.lessons.one_model_two_speeds import two_speeds
from pallas_kernels.ceilings import spaced

DRIFT = 1.15      # a re-measured quantity this far from the record (either way) is too far: make it again
STALE = 0.25      # a read ceiling the run's best stream stays this far below is stale
RECHECKS = 4      # before a ceiling is called stale, it is read again up to this many times ...
RECHECK_PAUSE_S = 3.0   # ... this far apart (a shared host's read rate moves from second to second)
SAME_RUN_S = 600  # ceilings measured this recently belong to this course run (00 measures them once, not twice)
VERSION = 1       # of the record's fields: a record of another version is made again


@dataclasses.dataclass(frozen=True)
class MachineRecord:
    """The course's figures for one machine, one run. Rates in tokens/s, FLOP/s and bytes/s."""

    made: str                 # ISO time, UTC
    processor: str
    load: float               # the 1-minute load average when it was made (its own measuring included)
    versions: str
    preset: str
    dtype: str
    flops: float              # matmul ceiling in the lesson dtype
    read_bandwidth: float     # the read ceiling every MBU divides by
    call_overhead_s: float
    prompt_len: int           # the reference shapes: one request of this prompt, decoded from there ...
    context: int              # ... and the batch sweep's context (the flip and the knee)
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    mfu: float                # prefill's share of the roofline's prefill rate
    mbu: float                # decode's share of the roofline's decode rate
    flip: int | None          # the roofline's batch where decode turns compute-bound (None: never)
    knee: int | None          # the first measured batch whose step takes KNEE_FACTOR x batch 1's
    growth: tuple = ()        # ((batch, its step over batch 1's), ...): what the knee is read from
    version: int = VERSION

    @property
    def n(self) -> float:
        """How many times slower the model writes than it reads, per token: the course's N."""
        return self.prefill_tokens_per_s / self.decode_tokens_per_s

    def lines(self) -> str:
        """The record as a learner reads it: every figure, where it came from."""
        flip = f"batch {self.flip}" if self.flip else "never at this context"
        knee = f"batch {self.knee}" if self.knee else "past the sweep"
        return "\n".join([
            f"the course's record of this machine, made {self.made[:16].replace('T', ' ')} UTC "
            f"(1-minute load average {self.load:.1f}, this run's own work included): {self.processor}; {self.versions}",
            f"ceilings: {self.flops / 1e9:,.0f} GFLOP/s ({self.dtype} matmul), read {self.read_bandwidth / 1e9:,.1f} GB/s, "
            f"a call {1e6 * self.call_overhead_s:,.0f} us",
            f"{self.preset}: prefill {self.prefill_tokens_per_s:,.0f} tok/s ({self.prompt_len}-token prompt, MFU "
            f"{self.mfu:.0%}), decode {self.decode_tokens_per_s:,.1f} tok/s (batch 1, MBU {self.mbu:.0%})",
            f"N = {self.n:.1f}: writing is {self.n:.1f}x slower per token than reading; "
            f"at context {self.context}: the roofline's flip (weights and KV cache) {flip}; the measured knee "
            f"(the step x{batching.KNEE_FACTOR:g} batch 1's) {knee}",
        ] + ([self.knee_note()] if self.knee_note() else []))

    def knee_note(self) -> str:
        """The step's growth over the batch, and, where a batch came within batching.NEAR_THE_LINE
        of the knee's line on either side, that another run can put the knee elsewhere."""
        if not self.growth:
            return ""
        near = [b for b, g in self.growth if abs(g / batching.KNEE_FACTOR - 1) <= batching.NEAR_THE_LINE]
        line = "the step over batch 1's: " + ", ".join(f"batch {b} x{g:.2f}" for b, g in self.growth)
        if near:
            which = f"batches {', '.join(map(str, near))} lie" if len(near) > 1 else f"batch {near[0]} lies"
            line += (f"; {which} within {batching.NEAR_THE_LINE:.0%} of the "
                     f"x{batching.KNEE_FACTOR:g} line, so another run can put the knee there or past it: "
                     "quote the growth, not the knee alone")
        return line


def ceiling_status(ceiling: float, achieved: float) -> str:
    """``"ok"``, ``"stale"`` (the run's best read stream, ``achieved``, stays more than
    :data:`STALE` below ``ceiling``) or ``"impossible"`` (it beat the ceiling by more than timing
    noise, ``roofline.beats_ceiling``). Both rates in bytes/s."""
    if roofline.beats_ceiling(achieved, ceiling):   # checks both are positive rates
        return "impossible"
    if achieved < ceiling * (1 - STALE):
        return "stale"
    return "ok"


def ceiling_line(ceiling: float, achieved: float) -> str:
    """:func:`ceiling_status` in words, with the numbers that decided it."""
    status = ceiling_status(ceiling, achieved)
    said = {"ok": "the ceiling stands",
            "stale": f"its best stream stays more than {STALE:.0%} below: the ceiling is stale (measured on a quieter "
                     "machine); measure it again",
            "impossible": "a stream beat it: the ceiling is impossible; measure it again"}[status]
    return (f"read ceiling {ceiling / 1e9:,.1f} GB/s, this run's best read stream {achieved / 1e9:,.1f} GB/s "
            f"(x{achieved / ceiling:.2f}): {said}")


def recheck(ceiling: float, achieved: float, read_again, *, attempts: int = RECHECKS,
            pause_s: float | None = None) -> list:
    """Rates (bytes/s) of ``read_again()``, taken ``pause_s`` apart until the best of them and
    ``achieved`` comes within reach of ``ceiling`` or ``attempts`` run out. On a host whose read
    rate moves between two levels every few seconds (measured on this project's 2-core hosts: ~35
    and ~55 GB/s), one stream in a slow spell is no proof that the ceiling is stale."""
    if ceiling_status(ceiling, achieved) != "stale":
        return []
    return spaced(lambda: float(read_again()), times=attempts, pause_s=RECHECK_PAUSE_S if pause_s is None else pause_s,
                  enough=lambda rates: ceiling_status(ceiling, max([achieved, *rates])) != "stale")


def remeasure_if_beaten(spec, dtype, *, flops: float | None = None, read: float | None = None):
    """``(spec, line)``: ``spec`` and ``""`` when neither measured rate beats its ceiling
    (``flops``: FLOP/s against the matmul peak in ``dtype``; ``read``: bytes/s against the read
    ceiling); otherwise the ceilings measured again (and cached, so the notebooks after this one
    divide by them too) and a line saying which rate beat which ceiling and what the new
    measurement gave. A rate above its ceiling proves the ceiling was measured in a busy spell:
    every MFU or MBU against it would be too high, and a claim that a phase stays *below* the peak
    could fail for no reason of its own."""
    peak = spec.peak_flops(dtype)
    beaten = [f"{what} {rate / 1e9:,.1f} {unit} beat the {name} {ceiling / 1e9:,.1f} {unit}"
              for what, name, rate, ceiling, unit in (("a measured", "matmul peak", flops, peak, "GFLOP/s"),
                                                      ("a measured read", "read ceiling", read, spec.bandwidth, "GB/s"))
              if rate is not None and roofline.beats_ceiling(rate, ceiling)]
    if not beaten:
        return spec, ""
    again = hardware.measure_ceilings(dtype, refresh=True, verbose=False)
    return again, (f"{'; '.join(beaten)}: that ceiling was measured in a busy spell, so it was measured again: matmul "
                   f"{again.peak_flops(dtype) / 1e9:,.1f} GFLOP/s, read {again.bandwidth / 1e9:,.1f} GB/s (was "
                   f"{peak / 1e9:,.1f} and {spec.bandwidth / 1e9:,.1f})")


def drifted(here: float, recorded: float, noise: float = 1.0) -> bool:
    """Whether a re-measured value is too far from the record: past :data:`DRIFT` or the run's own
    ``noise`` (a ratio >= 1), whichever is larger, either way."""
    if not (here > 0 and recorded > 0 and noise >= 1):
        raise ValueError(f"here={here!r} and recorded={recorded!r} must be positive, noise={noise!r} >= 1")
    return abs(math.log(here / recorded)) > math.log(max(DRIFT, noise))


def beside_the_record(name: str, here: float, recorded: float, *, unit: str = "", fmt: str = ".1f",
                      noise: float = 1.0) -> str:
    """A re-measured quantity beside the record's value, labelled as a re-measurement, with the
    drift and, past the rule, what to do."""
    line = (f"{name}: {here:{fmt}}{unit} re-measured here, {recorded:{fmt}}{unit} in the record "
            f"({here / recorded - 1:+.0%})")
    if drifted(here, recorded, noise):
        line += (f": past the record's x{max(DRIFT, noise):.2f} tolerance, the machine has changed since the record "
                 "was made; make it again (notebook 00) before quoting either")
    return line


def knee_beside_the_record(record: MachineRecord, knee: int | None, growth: dict, *, noise: float = 1.0) -> str:
    """A re-measured batch sweep's knee beside the record's. ``growth`` maps batch -> step over
    batch 1's. The knee is a threshold on the growth, so two runs whose growth agrees within the
    drift rule can still put it on either side of the line: the comparison is made on the growth,
    and a knee that moved only because the growth sat on the line is said to be one."""
    shared = [(b, g) for b, g in record.growth if b in growth]
    if not shared:
        raise ValueError(f"growth={sorted(growth)!r} shares no batch with the record's {[b for b, _ in record.growth]}")
    lines = [beside_the_record(f"the step at batch {b} over batch 1's", growth[b], g, unit="x", fmt=".2f",
                               noise=noise)
             for b, g in shared if b <= max(knee or 0, record.knee or 0, 2)]
    same = knee == record.knee
    moved = [b for b, g in shared if (growth[b] >= batching.KNEE_FACTOR) != (g >= batching.KNEE_FACTOR)]
    agree = not any(drifted(growth[b], g, noise) for b, g in shared)
    where = f"batch {knee}" if knee else "past the sweep"
    was = f"batch {record.knee}" if record.knee else "past the sweep"
    line = f"knee: {where} re-measured here, {was} in the record"
    if same:
        lines.append(line + ": the same")
    elif agree:
        which = f"batches {', '.join(map(str, moved))} sit" if len(moved) > 1 else f"batch {moved[0]} sits"
        lines.append(line + f": the growth agrees within the drift rule, and {which} near the "
                     f"x{batching.KNEE_FACTOR:g} line, on one side in one run and on the other in the next: the "
                     "same machine")
    else:
        lines.append(line + ", and the growth itself drifted: the machine changed since the record was made; "
                     "make it again (notebook 00) before quoting either")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- making and reading it
def _path(here: Machine):
    key = f"{hardware.processor_summary()}|{here.device}|{here.config.name}|{here.dtype}|{platform.node()}"
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    return cache_dir("course") / f"record-{here.config.name}-{digest}.json"


def make(here: Machine, *, refresh_ceilings: bool = False) -> MachineRecord:
    """Measure the record on ``here`` (the ceilings again with ``refresh_ceilings``) and save it."""
    import flax
    import jax

    spec = hardware.measure_ceilings(here.dtype, refresh=True, verbose=False) if refresh_ceilings else here.spec
    model = lesson_model(here)
    sizes = here.sizes
    speeds = two_speeds(model, sizes.prompt_len)
    gap = speeds.gap(here.config, spec)
    if roofline.beats_ceiling(gap.mfu, 1.0) or roofline.beats_ceiling(gap.mbu, 1.0):
        # a phase faster than the roofline allows: a ceiling came from a busy spell (remeasure_if_beaten)
        spec = hardware.measure_ceilings(here.dtype, refresh=True, verbose=False)
        gap = speeds.gap(here.config, spec)
    sweep = batching.batch_sweep(model, sizes.batch_sizes, sizes.context)
    record = MachineRecord(
        made=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        processor=hardware.processor_summary(), load=os.getloadavg()[0],
        versions=f"Python {platform.python_version()}, jax {jax.__version__}, flax {flax.__version__}",
        preset=here.config.name, dtype=here.dtype, flops=spec.peak_flops(roofline.flop_dtype(here.config, None)),
        read_bandwidth=spec.bandwidth, call_overhead_s=spec.overhead_s,
        prompt_len=sizes.prompt_len, context=sizes.context,
        prefill_tokens_per_s=speeds.prefill_tokens_per_s, decode_tokens_per_s=speeds.decode_tokens_per_s,
        mfu=gap.mfu, mbu=gap.mbu, flip=_flip(here, spec, sizes.context),
        knee=roofline.measured_knee(sweep.records, batching.KNEE_FACTOR),
        growth=tuple((r.batch, r.step_seconds / sweep.at(1).step_seconds)
                     for r in sorted(sweep.records, key=lambda r: r.batch) if r.batch > 1))
    save(record, _path(here))
    return record


def _flip(here: Machine, spec, context: int) -> int | None:
    flip = roofline.predicted_flip(here.config, spec, here.dtype, context=context)
    return None if flip is None or not math.isfinite(flip) else int(round(flip))


def save(record: MachineRecord, path) -> None:
    from pallas_kernels.files import atomic_write_text

    atomic_write_text(path, json.dumps(dataclasses.asdict(record), indent=1))


def read(path) -> MachineRecord | None:
    """The record in ``path``, or None when there is none or it cannot be used (another version,
    a field missing or of the wrong kind): it is then made again."""
    try:
        data = json.loads(open(path).read())
        record = MachineRecord(**{**data, "growth": tuple(tuple(g) for g in data.get("growth", ()))})
    except (OSError, ValueError, TypeError):
        return None
    if record.version != VERSION or not (record.read_bandwidth > 0 and record.decode_tokens_per_s > 0):
        return None
    return record


def load(here: Machine) -> MachineRecord:
    """This machine's record for the course: the one saved by the run's first notebook, or, when
    there is none (a notebook opened out of order), made now."""
    return read(_path(here)) or make(here)
