"""Random arrays for weights, caches, kernels and measurements: scaled normal values, never zeros
(a kernel that skips zeros, or a benchmark over them, would time the wrong thing), the same for a
seed on every machine.

Small arrays are drawn by NumPy on the host and copied over: ``jax.random.normal`` is an XLA
program, compiled once per shape (~0.4 s on a busy 2-core CPU, more than the whole draw of a
million values by NumPy), and a sweep over sizes or a test over awkward shapes asks for a new
shape almost every time. Larger arrays are drawn on the device, where NumPy would be slower than
the compile (it draws ~20 M values a second on such a CPU). A caller that draws many arrays at
once (a model's weights) may choose for all of them (``on_host``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

HOST_MAX_ELEMENTS = 1 << 20


def normal(shape, dtype, seed, *, std: float = 1.0, on_host: bool | None = None) -> jax.Array:
    """``std * N(0, 1)`` values of ``shape`` in ``dtype`` (drawn in float32, scaled, then cast).
    ``seed``: an int, or a sequence of ints (a seed and the index of what it draws, say), or a
    ``jax.random`` key, which draws on the device (and works while traced: a model built under
    ``jax.eval_shape``). ``on_host``: NumPy or the device; None chooses by size
    (:data:`HOST_MAX_ELEMENTS`)."""
    shape = tuple(int(n) for n in shape)
    dt = jnp.dtype(dtype)
    if isinstance(seed, jax.Array) and jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key):
        return _normal_on_device(seed, shape=shape, std=float(std), dtype=dt)
    seeds = [int(s) for s in np.atleast_1d(seed)]
    if on_host is None:
        on_host = int(np.prod(shape)) <= HOST_MAX_ELEMENTS
    if on_host:
        x = np.random.default_rng(seeds).standard_normal(shape, dtype=np.float32) * np.float32(std)
        return jnp.asarray(x.astype(dt))   # ml_dtypes casts to bfloat16 on the host
    key = jax.random.key(seeds[0])
    for s in seeds[1:]:
        key = jax.random.fold_in(key, s)
    return _normal_on_device(key, shape=shape, std=float(std), dtype=dt)


@functools.partial(jax.jit, static_argnames=("shape", "std", "dtype"))
def _normal_on_device(key, *, shape, std, dtype):
    return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
