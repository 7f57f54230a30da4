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
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.timing import round_robin, timed, timed_call

READ_ROWS = 4096   # the 2-D view the row-sum and matrix-vector kernels read: [READ_ROWS, n / READ_ROWS]
MIN_BYTES_PER_CALL = 64 * 2**20   # a smaller buffer is read several times per timed call


def _rand(key, shape, dtype):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def best_seconds(fn, *args, repeats: int) -> float:
    """Shortest wall time of an already-jitted ``fn(*args)`` over ``repeats``, after a warm-up."""
    return round_robin([lambda: timed(fn, *args)], repeats)[0].best


def _read_kernels():
    """(name, fn(x, v)) for each read-only kernel over a float32 buffer ``x`` (``v``: a vector of
    ``x.size / READ_ROWS``, an argument so that XLA cannot turn the product into a sum)."""
    hi = jax.lax.Precision.HIGHEST
    return [("sum", lambda x, v: jnp.sum(x)),
            ("row sums", lambda x, v: jnp.sum(x.reshape(READ_ROWS, -1), axis=1)),
            ("matrix-vector", lambda x, v: jnp.dot(x.reshape(READ_ROWS, -1), v, precision=hi))]


def _reading(kernel, reads: int):
    """A jitted call that reads ``x`` with ``kernel`` ``reads`` times, returning (x, a scalar).

    One read per call for a large buffer. A small one is read again and again inside one
    ``fori_loop`` (as a decode loop re-reads its weights), so that the fixed cost of a call does
    not hide the rate; each read adds ``0 *`` its result to one element of ``x``, a real data
    dependence, so XLA cannot compute the read once outside the loop. ``x`` is donated and handed
    back, so nothing is copied."""
    def once(x, v):
        return x, kernel(x, v).reshape(-1)[0]

    def repeated(x, v):
        def body(i, carry):
            x, acc = carry
            s = kernel(x, v).reshape(-1)[0]
            return x.at[0].add(s * 0), acc + s
        return jax.lax.fori_loop(0, reads, body, (x, jnp.float32(0)))

    return jax.jit(once if reads == 1 else repeated, donate_argnums=0)


def read_bandwidth(nbytes: int, *, repeats: int) -> dict:
    """The rate this device reads a float32 buffer of about ``nbytes``: the best of the read-only
    kernels (see the module docstring), timed round-robin. Returns ``{"bytes_per_s", "nbytes",
    "by_kernel": {name: bytes/s}, "method"}``.

    A buffer that fits in a cache reads at the cache's rate, which is what a model whose weights
    fit there streams at; such a buffer is read repeatedly within one call (at least
    :data:`MIN_BYTES_PER_CALL` per call), as a decode loop re-reads its weights every step."""
    n = max(READ_ROWS, int(nbytes) // 4 // READ_ROWS * READ_ROWS)
    reads = min(256, -(-MIN_BYTES_PER_CALL // (n * 4)))
    v = _rand(jax.random.key(2), (n // READ_ROWS,), jnp.float32)
    runs, names = [], []
    for i, (name, kernel) in enumerate(_read_kernels()):
        fn = _reading(kernel, reads)
        state = [_rand(jax.random.key(10 + i), (n,), jnp.float32)]   # random, never zeros

        def run(fn=fn, state=state):
            seconds, (x, _) = timed_call(fn, state.pop(), v)
            state.append(x)
            return seconds

        runs.append(run)
        names.append(name)
    samples = round_robin(runs, repeats)
    rates = {name: reads * n * 4 / s.best for name, s in zip(names, samples)}
    shown = ", ".join(f"{name} {rate / 1e9:,.1f}" for name, rate in rates.items())
    again = f", read {reads} times per call" if reads > 1 else ""
    return {"bytes_per_s": max(rates.values()), "nbytes": n * 4, "by_kernel": rates,
            "method": (f"measured: the fastest of three read-only kernels over a {_size(n * 4)} float32 "
                       f"buffer{again} ({shown} GB/s), best of {repeats}")}


def copy_bandwidth(nbytes: int, *, repeats: int) -> dict:
    """Read + write bytes per second of an in-place ``x *= 1.0001`` over a float32 buffer of
    ``nbytes``, donated so nothing new is allocated (each call is fed the last result)."""
    n = nbytes // 4
    step = jax.jit(lambda x: x * 1.0001, donate_argnums=0)
    state = [_rand(jax.random.key(3), (n,), jnp.float32)]

    def run():
        seconds, y = timed_call(step, state.pop())
        state.append(y)
        return seconds

    best = round_robin([run], repeats)[0].best
    return {"bytes_per_s": 2.0 * n * 4 / best,
            "method": (f"measured: an in-place x *= 1.0001 over a {_size(n * 4)} float32 buffer, read + "
                       f"write counted, best of {repeats}")}


def device_ceilings(*, n: int, nbytes: int, dtype, repeats: int) -> dict:
    """This device's ceilings, measured (the one implementation; ``inference_lab.base.hardware``
    caches and wraps it):

    - matmul: ``[n, n] @ [n, n]`` in ``dtype`` with f32 accumulation (f32 at full precision,
      no TF32), jitted by XLA; ``2 n^3`` FLOPs per call;
    - bandwidth: what this device *reads*, :func:`read_bandwidth` over ``nbytes`` (the ceiling
      every MBU is against: decode reads);
    - copy bandwidth: :func:`copy_bandwidth` over ``nbytes`` (reported beside it, not used as a
      ceiling).
    """
    dtype = jnp.dtype(dtype)
    prec = jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None
    k1, k2 = jax.random.split(jax.random.key(0))
    a, b = _rand(k1, (n, n), dtype), _rand(k2, (n, n), dtype)  # random, never zeros
    mm = jax.jit(lambda a, b: jnp.dot(a, b, precision=prec, preferred_element_type=jnp.float32).astype(a.dtype))
    flops = 2.0 * n ** 3 / best_seconds(mm, a, b, repeats=repeats)
    del a, b
    read = read_bandwidth(nbytes, repeats=repeats + 6)   # a noisy host: more samples for the best one
    copy = copy_bandwidth(nbytes, repeats=repeats + 2)
    return {
        "matmul_flops": flops, "bandwidth": read["bytes_per_s"], "copy_bandwidth": copy["bytes_per_s"],
        "matmul_method": (f"measured: XLA jnp.dot {n}x{n}x{n} {dtype.name}"
                          f"{' (precision HIGHEST)' if prec else ''}, f32 accumulation, best of {repeats}"),
        "bandwidth_method": read["method"],
        "copy_method": copy["method"],
    }


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
