"""This device's ceilings, measured: matmul FLOP/s, the rate it can *read* memory, the rate it
can copy, and the floor under them all, the fixed cost of one call.

The one implementation: the kernel benchmark (:mod:`pallas_kernels.bench`) calls it at its
sizes, and ``inference_lab.base.hardware.measure_ceilings`` caches it per machine for the lessons.
A ceiling is what the device *can* do, so each is the best sample of its repeats
(:mod:`pallas_kernels.timing`).

Why the bandwidth ceiling is a *read*: a decode step streams the weights and the KV cache and
writes almost nothing (one new K/V row per layer, a few logits), so the rate its MBU is measured
against must be the rate this device reads. A copy (read + write counted) is reported beside it
and is not the same number: on one core of the 2-core CPUs this project runs on, a copy moves
30-36 GB/s where a read moves 22-27. A core can only keep so many cache-line misses in flight,
and that, not the memory bus, caps how fast it reads (Little's law: bytes in flight / latency);
stores drain through separate write buffers without blocking the loads, so a copy adds its
writes on top (docs/benchmarks.md has the figures). The read ceiling is the best of three
read-only kernels over one buffer (a sum, row sums of a 2-D view, a matrix-vector product), each
of which reads every byte once: whichever XLA happens to compile best on this machine.

On a GPU three things differ (:func:`device_ceilings`): every ceiling is timed over several calls
inside one program (a call's dispatch is ~10% of one read of 1 GiB on an H200), a fourth read
kernel joins (a vector-matrix product, decode's own shape), and the read ceiling is never below
the copy's rate. The first H200 run of the lab measured its read ceiling at 2.68-3.02 TB/s and its
matmul ceiling at 603-618 TFLOP/s, where a copy moved ~4.3 TB/s and XLA's bf16 matmul reached
782 TFLOP/s in another run: a ceiling below what the device did elsewhere inflates every MBU.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from pallas_kernels.timing import InOneProgram, round_robin, timed, timed_call

READ_ROWS = 4096   # the 2-D view the row-sum and matrix-vector kernels read: [READ_ROWS, n / READ_ROWS]
MIN_BYTES_PER_CALL = 64 * 2**20   # a smaller buffer is read several times per timed call
# On a GPU a call's dispatch (~10-30 us) is ~10% of one read of 1 GiB (~0.25 ms): every ceiling
# there is timed over several reads or calls in one program instead (GPU_CALLS of them).
GPU_CALLS = 16
READ_SPELLS = 4        # on a CPU the matmul and read ceilings are the best of this many spells ...
SPELL_PAUSE_S = 4.0    # ... this far apart: a shared host's read rate can move between two levels every
                       # few seconds (~35 and ~55 GB/s on this project's 2-core hosts, 2026-12-05), and a
                       # two-thread matmul beside another busy process ran at 58.5 GFLOP/s where the same
                       # CPU's model prefill reached 176 (CI, 2026-12-05): a ceiling from one busy spell is none
GPU_MATMUL_SIZES = (4096, 8192, 16384)   # XLA's best of these square matmuls is the GPU's matmul ceiling


def _rand(key, shape, dtype):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def _on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def _read_kernels():
    """(name, fn(x, v, u)) for each read-only kernel over a float32 buffer ``x`` (``v``: a vector
    of ``x.size / READ_ROWS``, ``u``: one of ``READ_ROWS``; arguments, so that XLA cannot turn
    the products into sums). Each reads every byte of ``x`` once; whichever XLA compiles best on
    this device sets the ceiling. A GPU adds the vector-matrix product, a decode step's shape,
    which XLA streamed at 4.31 TB/s on an H200 where its reductions read 2.7-3.0 (a CPU reads it
    no faster than the other three, so the lessons' "fastest of three" stays three there)."""
    hi = jax.lax.Precision.HIGHEST
    kernels = [("sum", lambda x, v, u: jnp.sum(x)),
               ("row sums", lambda x, v, u: jnp.sum(x.reshape(READ_ROWS, -1), axis=1)),
               ("matrix-vector", lambda x, v, u: jnp.dot(x.reshape(READ_ROWS, -1), v, precision=hi))]
    if _on_gpu():
        kernels.append(("vector-matrix", lambda x, v, u: jnp.dot(u, x.reshape(READ_ROWS, -1), precision=hi)))
    return kernels


def read_bandwidth(nbytes: int, *, repeats: int) -> dict:
    """The rate this device reads a float32 buffer of about ``nbytes``: the best of the read-only
    kernels (see the module docstring), timed round-robin. Returns ``{"bytes_per_s", "nbytes",
    "by_kernel": {name: bytes/s}, "method"}``.

    Each timed call reads the buffer ``reads`` times inside one program
    (:class:`pallas_kernels.timing.InOneProgram`): at least :data:`MIN_BYTES_PER_CALL` a call, so
    that a buffer that fits in a cache is re-read as a decode loop re-reads its weights (and reads
    at the cache's rate, which is what a model whose weights fit there streams at), and on a GPU
    at least :data:`GPU_CALLS` reads, so that a call's dispatch is not counted as reading time."""
    n = max(READ_ROWS, int(nbytes) // 4 // READ_ROWS * READ_ROWS)
    reads = min(256, -(-MIN_BYTES_PER_CALL // (n * 4)))
    if _on_gpu():
        reads = max(reads, GPU_CALLS)
    v = _rand(jax.random.key(2), (n // READ_ROWS,), jnp.float32)
    u = _rand(jax.random.key(4), (1, READ_ROWS), jnp.float32)
    runs, names = [], []
    for i, (name, kernel) in enumerate(_read_kernels()):
        looped = InOneProgram(kernel, (_rand(jax.random.key(10 + i), (n,), jnp.float32), v, u))  # never zeros
        runs.append(lambda looped=looped: looped(reads))
        names.append(name)
    samples = round_robin(runs, repeats)
    rates = {name: reads * n * 4 / s.best for name, s in zip(names, samples)}
    shown = ", ".join(f"{name} {rate / 1e9:,.1f}" for name, rate in rates.items())
    again = f", read {reads} times per call in one program" if reads > 1 else ""
    kernels = {3: "three", 4: "four"}[len(rates)]
    return {"bytes_per_s": max(rates.values()), "nbytes": n * 4, "by_kernel": rates,
            "method": (f"measured: the fastest of {kernels} read-only kernels over a {_size(n * 4)} float32 "
                       f"buffer{again} ({shown} GB/s), best of {repeats}")}


def copy_bandwidth(nbytes: int, *, repeats: int) -> dict:
    """Read + write bytes per second of an in-place ``x *= 1.0001`` over a float32 buffer of
    ``nbytes``, donated so nothing new is allocated (each call is fed the last result); on a GPU
    :data:`GPU_CALLS` of them in one program (a loop over the donated buffer), so that dispatch is
    not counted."""
    n = nbytes // 4
    times = GPU_CALLS if _on_gpu() else 1
    step = jax.jit(lambda x: jax.lax.fori_loop(0, times, lambda i, x: x * 1.0001, x), donate_argnums=0)
    state = [_rand(jax.random.key(3), (n,), jnp.float32)]

    def run():
        seconds, y = timed_call(step, state.pop())
        state.append(y)
        return seconds

    best = round_robin([run], repeats)[0].best
    again = f", {times} times per call in one program" if times > 1 else ""
    return {"bytes_per_s": 2.0 * n * 4 * times / best,
            "method": (f"measured: an in-place x *= 1.0001 over a {_size(n * 4)} float32 buffer{again}, read + "
                       f"write counted, best of {repeats}")}


def matmul_flops(n: int, dtype, *, repeats: int) -> dict:
    """FLOP/s of XLA's own ``a @ b`` for ``[n, n] @ [n, n]`` in ``dtype`` (its output in ``dtype``,
    accumulated in f32; f32 at full precision, no TF32), best of ``repeats``; on a GPU the best of
    :data:`GPU_MATMUL_SIZES` (XLA's best shape), :data:`GPU_CALLS` products a call in one program.
    ``{"flops_per_s", "n", "method"}``."""
    dtype = jnp.dtype(dtype)
    prec = jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None
    sizes = GPU_MATMUL_SIZES if _on_gpu() else (n,)
    calls = GPU_CALLS if _on_gpu() else 1
    best = {}
    for size in sizes:
        k1, k2 = jax.random.split(jax.random.key(size))
        looped = InOneProgram(lambda a, b: jnp.matmul(a, b, precision=prec),
                              (_rand(k1, (size, size), dtype), _rand(k2, (size, size), dtype)))   # never zeros
        best[size] = 2.0 * size ** 3 * calls / round_robin([lambda: looped(calls)], repeats)[0].best
    size = max(best, key=best.get)
    shown = ", ".join(f"{s}: {f / 1e12:,.0f}" for s, f in best.items()) if len(best) > 1 else ""
    return {"flops_per_s": best[size], "n": size,
            "method": (f"measured: XLA a @ b {size}x{size}x{size} {dtype.name}"
                       f"{' (precision HIGHEST)' if prec else ''}, best of {repeats}"
                       + (f"; the best of {len(best)} sizes ({shown} TFLOP/s), {calls} products a call in one program"
                          if shown else ""))}


def spaced(measure, *, times: int, pause_s: float, enough=None) -> list:
    """``measure()`` up to ``times`` times, ``pause_s`` seconds apart, stopping early once
    ``enough(results so far)`` is true: the one way the lab measures a ceiling on a shared host,
    whose rates move between spells of seconds (another program, or another tenant, busy too).
    The ceilings here take the best of spells; ``inference_lab.lessons.course_record.recheck``
    reads again this way before it calls a ceiling stale."""
    results = []
    while len(results) < times and not (enough and results and enough(results)):
        if results:
            time.sleep(pause_s)
        results.append(measure())
    return results


def device_ceilings(*, n: int, nbytes: int, dtype, repeats: int, spells: int | None = None) -> dict:
    """This device's ceilings, measured (the one implementation; ``inference_lab.base.hardware``
    caches and wraps it):

    - matmul: :func:`matmul_flops`, ``[n, n] @ [n, n]`` in ``dtype`` (on a GPU XLA's best size);
    - bandwidth: what this device *reads*, :func:`read_bandwidth` over ``nbytes`` (the ceiling
      every MBU is against: decode reads);
    - copy bandwidth: :func:`copy_bandwidth` over ``nbytes`` (reported beside it).

    On a CPU the matmul and the read are measured in ``spells`` (:data:`READ_SPELLS`) spells
    :data:`SPELL_PAUSE_S` apart (:func:`spaced`) and each ceiling is the best spell's: a shared
    host's rates move from second to second, and a ceiling from one busy spell is one the lessons'
    own model then beats.

    On a GPU the read ceiling is never below the copy's rate: thousands of warps keep enough loads
    in flight that HBM, not a core's latency, sets the pace, and a copy reads every byte it writes,
    so a read kernel slower than a copy's read + write says the kernel is poor, not the memory (on
    an H200 XLA's reductions read 2.7-3.0 TB/s where a copy moved 4.3). There the copy's rate is the
    ceiling and the method says so. On a CPU core a copy can move more bytes than a read (Little's
    law, the module docstring): there the read stands.
    """
    spells = (1 if _on_gpu() else READ_SPELLS) if spells is None else spells
    # a noisy host: the read takes more samples for its best one
    measured = spaced(lambda: (matmul_flops(n, dtype, repeats=repeats), read_bandwidth(nbytes, repeats=repeats + 6)),
                      times=spells, pause_s=SPELL_PAUSE_S)
    matmul = max((m for m, _ in measured), key=lambda m: m["flops_per_s"])
    read = max((r for _, r in measured), key=lambda r: r["bytes_per_s"])
    if spells > 1:
        matmul = dict(matmul, method=f"{matmul['method']}; the best of {spells} spells {SPELL_PAUSE_S:g} s apart ("
                                     + ", ".join(f"{m['flops_per_s'] / 1e9:,.1f}" for m, _ in measured) + " GFLOP/s)")
        read = dict(read, method=f"{read['method']}; the best of {spells} such reads {SPELL_PAUSE_S:g} s apart ("
                                 + ", ".join(f"{r['bytes_per_s'] / 1e9:,.1f}" for _, r in measured) + " GB/s)")
    copy = copy_bandwidth(nbytes, repeats=repeats + 2)
    bandwidth, method = read_ceiling(read, copy, gpu=_on_gpu())
    return {
        "matmul_flops": matmul["flops_per_s"], "bandwidth": bandwidth, "copy_bandwidth": copy["bytes_per_s"],
        "read_bandwidth": read["bytes_per_s"],
        "matmul_method": matmul["method"],
        "bandwidth_method": method,
        "copy_method": copy["method"],
    }


def read_ceiling(read: dict, copy: dict, *, gpu: bool) -> tuple[float, str]:
    """``(bytes/s, method)`` of the read ceiling from :func:`read_bandwidth` and
    :func:`copy_bandwidth`: the read, except on a GPU where the copy moved more (see
    :func:`device_ceilings`), which then sets it and says so."""
    if gpu and copy["bytes_per_s"] > read["bytes_per_s"]:
        return copy["bytes_per_s"], (
            f"the in-place copy's read + write rate ({copy['method']}), since on a GPU no read can be "
            f"slower than it and the read-only kernels reached {read['bytes_per_s'] / 1e9:,.0f} GB/s "
            f"({read['method']})")
    return read["bytes_per_s"], read["method"]


def call_overhead(*, calls: int = 300) -> dict:
    """The fixed cost of one call on this device: the median wall time of a trivial jitted op
    (``x + 1`` on a float32 scalar), dispatched and waited for (``block_until_ready``).

    No bytes to speak of and one FLOP: what is left is dispatch, launch and synchronisation,
    which every call pays however small its work. The median (not the minimum): it is a cost
    every call pays, not a ceiling only the luckiest call reaches.
    """
    f = jax.jit(lambda x: x + 1)
    x = jnp.float32(1)
    samples = round_robin([lambda: timed(f, x)], calls, warmups=10)[0]
    return {"seconds": samples.median,
            "method": f"measured: median wall time of a jitted x + 1 on a float32 scalar, {calls} calls"}


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.3g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:,.3g} MiB"
