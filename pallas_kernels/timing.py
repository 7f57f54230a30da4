"""The one timer. Every time the lab reports (its lessons, sweeps, probe, kernel benchmark and
ceilings) is a :class:`Samples` that :func:`round_robin` took.

The rules, in one place:

- each point runs once untimed first: it compiles, and it leaves caches and allocations as a
  warm server's would be;
- a timed run is measured by the point itself, around the work that counts, and waits for the
  device (``jax.block_until_ready``) before it stops its clock (:func:`timed` does both);
- several points are timed **round-robin**: point 1, point 2, ..., then point 1 again. On a
  shared machine a burst of load from another program then slows every point a little rather
  than one point a lot, so ratios between points (what the lessons' claims rest on) survive it;
- every sample is kept. A cost that every call pays is reported as the median; a ceiling, what
  the hardware *can* do, as the best sample (a median would fold other programs' load into the
  ceiling); the spread says how noisy the run was.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class Samples:
    """The timed runs of one point, in seconds, in the order they ran."""

    seconds: tuple

    def __post_init__(self):
        if not self.seconds:
            raise ValueError("Samples needs at least one timed run")

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def spread(self) -> float:
        """Upper over lower quartile of the runs (1.0: every run took the same time). A quiet
        machine gives a few percent; a busy one much more."""
        if len(self.seconds) < 4:
            return max(self.seconds) / min(self.seconds)
        q1, _, q3 = statistics.quantiles(self.seconds, n=4, method="inclusive")
        return q3 / q1


def timed(fn: Callable, *args) -> float:
    """Seconds of one call ``fn(*args)``, waiting for the device to finish what it returned."""
    return timed_call(fn, *args)[0]


def timed_call(fn: Callable, *args) -> tuple:
    """``(seconds, result)`` of one call ``fn(*args)``, waiting for the device to finish it: for
    a run that feeds its result to the next one (a donated buffer, a cache)."""
    import jax

    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0, out


def round_robin(runs: Sequence[Callable[[], float]], repeats: int, *, warmups: int = 1,
                tick: Callable[[], None] | None = None) -> list:
    """Time each of ``runs`` (zero-argument callables that run their point once and return the
    seconds it took) ``repeats`` times, in turn, after ``warmups`` untimed runs each. Returns one
    :class:`Samples` per run, in order. ``tick()`` is called after every run (a progress bar)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be a positive integer")
    for run in runs:
        for _ in range(warmups):
            run()
            if tick is not None:
                tick()
    times = [[] for _ in runs]
    for _ in range(repeats):
        for i, run in enumerate(runs):
            times[i].append(float(run()))
            if tick is not None:
                tick()
    return [Samples(tuple(t)) for t in times]
