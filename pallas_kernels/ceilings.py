"""This device's two ceilings, measured: matmul FLOP/s and memory bandwidth; and the floor
under them, the fixed cost of one call.

The one implementation: the kernel benchmark (:mod:`pallas_kernels.bench`) calls it at its
sizes, and ``inference_lab.base.hardware.measure_ceilings`` caches it per machine for the lessons.
A ceiling is what the device *can* do, so the fastest of several repeats estimates it.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp


def _rand(key, shape, dtype):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def best_seconds(fn, *args, repeats: int, donate_first: bool = False) -> float:
    """Shortest wall time of an already-jitted ``fn(*args)`` over ``repeats``, after a warm-up.

    A ceiling is what the device *can* do, so the fastest repeat estimates it: on a noisy
    machine a median would fold other programs' load into the ceiling itself. With
    ``donate_first`` the first argument is donated, so each call is fed the last result.
    """
    out = jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        if donate_first:
            args = (out,) + tuple(args[1:])
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return min(times)


def device_ceilings(*, n: int, nbytes: int, dtype, repeats: int) -> dict:
    """This device's two ceilings, measured (the one implementation; ``inference_lab.base.hardware``
    caches and wraps it):

    - matmul: ``[n, n] @ [n, n]`` in ``dtype`` with f32 accumulation (f32 at full precision,
      no TF32), jitted by XLA; ``2 n^3`` FLOPs per call;
    - bandwidth: the faster of a sum over an ``nbytes`` float32 buffer (bytes read) and an
      in-place ``x *= 1.0001`` of it, donated so nothing new is allocated (bytes read + written).
      Decode mostly reads, and a CPU reads faster than it copies; on a GPU the two agree.
    """
    dtype = jnp.dtype(dtype)
    prec = jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None
    k1, k2 = jax.random.split(jax.random.key(0))
    a, b = _rand(k1, (n, n), dtype), _rand(k2, (n, n), dtype)  # random, never zeros
    mm = jax.jit(lambda a, b: jnp.dot(a, b, precision=prec, preferred_element_type=jnp.float32).astype(a.dtype))
    flops = 2.0 * n ** 3 / best_seconds(mm, a, b, repeats=repeats)
    del a, b
    x = _rand(jax.random.key(1), (nbytes // 4,), jnp.float32)
    t_read = best_seconds(jax.jit(jnp.sum), x, repeats=repeats + 2)
    t_copy = best_seconds(jax.jit(lambda x: x * 1.0001, donate_argnums=0), x, repeats=repeats + 2,
                          donate_first=True)
    return {
        "matmul_flops": flops, "bandwidth": max(nbytes / t_read, 2.0 * nbytes / t_copy),
        "matmul_method": (f"measured: XLA jnp.dot {n}x{n}x{n} {dtype.name}"
                          f"{' (precision HIGHEST)' if prec else ''}, f32 accumulation, best of {repeats}"),
        "bandwidth_method": (f"measured: the faster of a sum over a {nbytes // 2**20} MiB float32 buffer "
                             f"(read counted) and an in-place x *= 1.0001 on it (read + write counted), "
                             f"best of {repeats + 2}"),
    }


def call_overhead(*, calls: int = 300) -> dict:
    """The fixed cost of one call on this device: the median wall time of a trivial jitted op
    (``x + 1`` on a float32 scalar), dispatched and waited for (``block_until_ready``).

    No bytes to speak of and one FLOP: what is left is dispatch, launch and synchronisation,
    which every call pays however small its work. The median (not the minimum): it is a cost
    every call pays, not a ceiling only the luckiest call reaches.
    """
    import statistics

    f = jax.jit(lambda x: x + 1)
    x = jnp.float32(1)
    for _ in range(10):  # compile and warm the dispatch path
        x = jax.block_until_ready(f(x))
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        x = jax.block_until_ready(f(x))
        times.append(time.perf_counter() - t0)
    return {"seconds": statistics.median(times),
            "method": f"measured: median wall time of a jitted x + 1 on a float32 scalar, {calls} calls"}
