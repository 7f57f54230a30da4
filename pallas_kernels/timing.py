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
  ceiling); the spread says how noisy the run was;
- a kernel that takes microseconds is timed many calls at a time inside one compiled program
  (:class:`InOneProgram`), so the ~10-30 us of dispatch a call costs on a GPU is not its time.
"""

from __future__ import annotations

import contextlib
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


# jax's own monitoring events for the three stages of making a program (jax._src.dispatch names them)
COMPILE_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
                  "/jax/core/compile/backend_compile_duration": "compile"}


@contextlib.contextmanager
def compile_seconds():
    """Inside the block, the seconds jax spends making programs add up in the yielded dict
    ``{"trace", "lower", "compile", "programs"}``: tracing to a jaxpr, lowering to StableHLO (a
    Pallas kernel's whole Triton or Mosaic GPU lowering runs here), and the backend's compile (XLA,
    and on a GPU the kernels' own compiles), as jax's monitoring events report them: no clock of
    ours, so the first run's own running time is not in it. ``programs``: the programs made
    (compiled, or fetched from jax's persistent cache: its "compile" is then the fetch)."""
    import jax

    found = {"trace": 0.0, "lower": 0.0, "compile": 0.0, "programs": 0}

    def listen(event, seconds, **_):
        stage = COMPILE_EVENTS.get(event)
        if stage is not None:
            found[stage] += float(seconds)
            found["programs"] += stage == "compile"

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield found
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


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


class InOneProgram:
    """``fn(*args)`` called many times inside ONE jitted loop: a run for :func:`round_robin`
    (``InOneProgram(fn, args)(calls)`` returns the seconds of the whole loop; divide by ``calls``).

    Every call depends on the one before, so XLA can neither hoist the call out of the loop nor
    compute any work on an input (a transpose, a cast, a dequantisation) once for all calls: after
    each call, element 0 of every floating-point argument is *set* to its own first value plus
    ``0 *`` an element of the result (XLA does not fold ``x * 0`` for floats). A set, not an add:
    an add reads the element it writes, and XLA:GPU then rewrites the whole array instead of one
    element (``x.at[0].add`` made each call of a one-row matmul read and write its whole weight
    again: 3x the bytes, found by compiling the old loop for an H200 on a CPU, docs/benchmarks.md).

    What a call costs besides ``fn``: one one-element update per floating argument (a tiny kernel
    each on a GPU); the loop's own counter and test are paid once per ``unroll`` calls (the body
    holds ``unroll`` calls in a row). The floating-point arguments are copied once here, donated to
    every run and handed back, so a run copies nothing; their values never change (each set writes
    back the value that was there). ``calls`` is an argument of the compiled loop, not a constant:
    one compile for any count (a multiple of ``unroll``). ``lower(calls)`` gives the loop's
    ``jax.stages.Lowered`` (to read its compiled program).
    """

    def __init__(self, fn: Callable, args: Sequence, *, unroll: int = 1):
        import jax
        import jax.numpy as jnp

        self.unroll = int(unroll)
        self.args = list(args)
        self.carried = [i for i, a in enumerate(self.args) if jnp.issubdtype(a.dtype, jnp.floating)]
        for i in self.carried:   # ours to donate: the caller's arrays stay valid
            self.args[i] = jnp.array(self.args[i], copy=True)
        carried, unroll = self.carried, self.unroll

        def loop(rounds, *args):
            firsts = [args[i][(0,) * args[i].ndim] for i in carried]

            def one_call(xs):
                full = list(args)
                for i, x in zip(carried, xs):
                    full[i] = x
                out = jax.tree.leaves(fn(*full))[0].reshape(-1)[0].astype(jnp.float32)
                return [x.at[(0,) * x.ndim].set(first + (out * 0).astype(x.dtype)) for x, first in zip(xs, firsts)], out

            def body(_, carry):
                xs, _ = carry
                for _ in range(unroll):
                    xs, out = one_call(xs)
                return xs, out

            return jax.lax.fori_loop(0, rounds, body, ([args[i] for i in carried], jnp.float32(0)))

        self.jitted = jax.jit(loop, donate_argnums=tuple(1 + i for i in carried))

    def _rounds(self, calls: int):
        import jax.numpy as jnp

        if calls < 1 or calls % self.unroll:
            raise ValueError(f"calls={calls} must be a positive multiple of unroll={self.unroll}")
        return jnp.int32(calls // self.unroll)

    def lower(self, calls: int | None = None):
        return self.jitted.lower(self._rounds(self.unroll if calls is None else calls), *self.args)

    def __call__(self, calls: int = 1) -> float:
        seconds, (xs, _) = timed_call(self.jitted, self._rounds(calls), *self.args)
        for i, x in zip(self.carried, xs):
            self.args[i] = x
        return seconds


def seconds_per_call(fn: Callable, args: Sequence, *, repeats: int, target_s: float, unroll: int = 1,
                     max_calls: int = 4096, best: bool = False) -> tuple[float, int]:
    """``(seconds per call, calls per sample)`` of ``fn(*args)``, timed in one program
    (:class:`InOneProgram`): ``unroll`` calls first (they compile and say how long a call takes),
    then enough calls per sample for a sample to last about ``target_s``, ``repeats`` samples. The
    median sample (``best=True``: the best, for a ceiling) over the calls."""
    looped = InOneProgram(fn, args, unroll=unroll)
    first = round_robin([lambda: looped(unroll)], 1)[0].median / unroll
    calls = unroll * int(min(max_calls // unroll, max(1, target_s // max(first * unroll, 1e-7))))
    samples = round_robin([lambda: looped(calls)], repeats)[0]
    return (samples.best if best else samples.median) / calls, calls
