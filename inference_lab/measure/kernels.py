"""Measurements for experiments that compare points: timed side by side, and the kernel alone.

A lesson's claim often rests on a *ratio* (batch 2's step over batch 1's, a long prompt's
time over a short one's). On a shared machine a burst of load during one point's repeats
would bend that ratio, so the functions here time their points round-robin: every point
takes one repeat in turn, and a burst slows all of them a little rather than one a lot.
Everything else follows :mod:`inference_lab.measure.timing`: random inputs, a warm-up that
compiles, ``block_until_ready``, medians, costs from :mod:`inference_lab.analytic.roofline`.

:func:`matmul_sweep` times the kernel a model is made of, one matmul against one weight,
alone: so a lesson can put the model's curve beside its kernel's.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from inference_lab.runtime import engine
from inference_lab.analytic import roofline
from inference_lab.model.kv_cache import KVCache
from inference_lab.measure.timing import _ceilings, _check_size, _machine, _random_cache, _random_tokens, _repeats, _tp
from inference_lab.measure.records import DecodeRecord, PrefillRecord

__all__ = ["measure_decode_points", "measure_prefill_points", "KernelPoint", "matmul_sweep", "model_matmuls_sweep"]


def _round_robin(run, n: int, repeats: int) -> list:
    """Median seconds of ``run(i)`` for each of ``n`` points: one untimed warm-up each (it
    compiles), then ``repeats`` rounds in which every point runs once, in turn."""
    for i in range(n):
        run(i)
    times = [[] for _ in range(n)]
    for _ in range(repeats):
        for i in range(n):
            times[i].append(run(i))
    return [statistics.median(t) for t in times]


def measure_decode_points(model, points, steps: int = 16, *, repeats: int | None = None,
                          ceilings="auto", seed: int = 0) -> list:
    """Decode records for several ``(batch, context)`` points, timed side by side.

    The repeats go round-robin (point 1, point 2, ..., point 1, point 2, ...), so a burst of
    load from another program slows every point a little instead of one point a lot: what an
    experiment that compares points (their *ratios*) needs on a shared machine. Otherwise as
    :func:`measure_decode`: a warm-up per point, median of ``repeats``, costs from the roofline.
    """
    points = [(_check_size("batch", b), _check_size("context", c)) for b, c in points]
    if not points:
        raise ValueError("points is empty; give (batch, context) pairs, e.g. [(1, 256), (4, 256)]")
    steps, repeats = _check_size("steps", steps), _repeats(repeats)
    cfg, spec = model.cfg, _ceilings(model, ceilings)
    state = {}
    for i, (b, c) in enumerate(points):
        state[i] = [_random_cache(cfg, b, c + steps, c, seed), _random_tokens(cfg, (b,), seed + 1)]

    def run(i):
        b, c = points[i]
        cache, first = state[i]
        jax.block_until_ready(cache.k)
        t0 = time.perf_counter()
        out, cache = engine.decode_loop(model, first, cache, steps)
        jax.block_until_ready((out, cache.k, cache.v))
        seconds = time.perf_counter() - t0
        ks, vs = cache._donate("measure_decode_points")
        lengths = np.full((b,), c, np.int32)
        state[i][0] = KVCache(ks, vs, jnp.asarray(lengths), host_lengths=lengths)
        return seconds

    medians = _round_robin(run, len(points), repeats)
    records = []
    for i, (b, c) in enumerate(points):
        step_seconds = medians[i] / steps
        costs = [roofline.decode_cost(cfg, b, c + j, tp=_tp(model)) for j in range(steps)]
        nbytes, flops = sum(x.bytes for x in costs) / steps, sum(x.flops for x in costs) / steps
        records.append(DecodeRecord(
            **_machine(model), batch=b, context=c, step_seconds=step_seconds, decode_tokens_per_s=b / step_seconds,
            bytes_per_step=nbytes, flops_per_step=flops,
            mbu=nbytes / step_seconds / spec.bandwidth if spec is not None else None,
            mfu=flops / step_seconds / spec.peak_flops(cfg.dtype) if spec is not None else None,
            steps=steps, repeats=repeats))
    return records


@dataclasses.dataclass(frozen=True)
class KernelPoint:
    """One timed matmul ``[m, k] @ [k, n]``: the weight-shaped operand is ``[k, n]``. (For a
    set of matrices, :func:`model_matmuls_sweep`: ``k`` counts all their weights, ``n`` is 1.)"""

    m: int
    k: int
    n: int
    dtype: str
    seconds: float   # median of the repeats
    label: str = ""

    def describe(self) -> str:
        return self.label or f"[m, {self.k}] @ [{self.k}, {self.n}] {self.dtype}"

    @property
    def weight_bytes(self) -> int:
        return self.k * self.n * np.dtype(self.dtype).itemsize

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n

    @property
    def weight_bytes_per_s(self) -> float:
        """How fast the kernel streams the weight: its bytes over the time (the decode view)."""
        return self.weight_bytes / self.seconds

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds


def matmul_sweep(ms=(1, 2, 4, 8, 16, 32), *, k: int = 4096, n: int = 4096, dtype="float32",
                 repeats: int | None = None, seed: int = 0) -> list:
    """Time the matmul of ``m`` rows against one ``[k, n]`` weight for each ``m``, side by side.

    The kernel a model's decode step is made of, alone: ``m`` is the batch (decode) or the
    prompt length (prefill). The weight (64 MiB in f32 at the default size) is larger than a
    CPU's caches, so every call streams it from memory, as a decode step streams its weights.
    Which kernel XLA picks depends on ``m`` (on a CPU: a matrix-vector path for ``m = 1``,
    a packed matrix-matrix path above), and that choice, not the roofline, shapes the curve.
    """
    ms = [_check_size("m", m) for m in ms]
    if not ms:
        raise ValueError("ms is empty; give row counts, e.g. (1, 2, 4, 8)")
    repeats = _repeats(repeats)
    dt = jnp.dtype(dtype)
    keys = jax.random.split(jax.random.key(seed), len(ms) + 1)
    w = jax.random.normal(keys[0], (k, n), jnp.float32).astype(dt)   # random, never zeros
    xs = [jax.random.normal(kk, (m, k), jnp.float32).astype(dt) for kk, m in zip(keys[1:], ms)]
    prec = jax.lax.Precision.HIGHEST if dt == jnp.float32 else None
    f = jax.jit(lambda x, w: jnp.dot(x, w, precision=prec, preferred_element_type=jnp.float32).astype(dt))

    def run(i):
        t0 = time.perf_counter()
        jax.block_until_ready(f(xs[i], w))
        return time.perf_counter() - t0

    return [KernelPoint(m, k, n, dt.name, t) for m, t in zip(ms, _round_robin(run, len(ms), repeats))]


def measure_prefill_points(model, prompt_lengths, *, batch: int = 1, repeats: int | None = None,
                           ceilings="auto", seed: int = 0) -> list:
    """Prefill records for several prompt lengths, timed side by side (round-robin, as
    :func:`measure_decode_points`): for experiments that compare the lengths' times."""
    lengths = [_check_size("prompt_len", t) for t in prompt_lengths]
    if not lengths:
        raise ValueError("prompt_lengths is empty; give at least one length")
    batch, repeats = _check_size("batch", batch), _repeats(repeats)
    cfg, spec = model.cfg, _ceilings(model, ceilings)
    tokens = [_random_tokens(cfg, (batch, t), seed) for t in lengths]

    def run(i):
        cache = KVCache.create(cfg, batch, lengths[i])   # outside the timed region
        jax.block_until_ready(cache.k)
        t0 = time.perf_counter()
        logits, cache = engine.prefill(model, tokens[i], cache)
        jax.block_until_ready((logits, cache.k, cache.v))
        return time.perf_counter() - t0

    records = []
    for t, seconds in zip(lengths, _round_robin(run, len(lengths), repeats)):
        cost = roofline.prefill_cost(cfg, batch, t, tp=_tp(model))
        records.append(PrefillRecord(**_machine(model), batch=batch, prompt_len=t, seconds=seconds,
                                     prefill_tokens_per_s=batch * t / seconds, flops=cost.flops, bytes=cost.bytes,
                                     mfu=cost.flops / seconds / spec.peak_flops(cfg.dtype) if spec is not None else None,
                                     repeats=repeats))
    return records


def model_matmuls_sweep(model, ms=(1, 2, 4, 8, 16, 32), *, repeats: int | None = None, seed: int = 0) -> list:
    """The model's own weight matrices, multiplied alone: for each ``m``, ``m`` rows through
    every matmul weight of the model (each layer's, and the output head; the embedding table
    is only gathered, so it is left out), in one jitted call, timed side by side.

    What a decode step of batch ``m`` is, minus everything that is not a matmul (attention
    and its KV cache, norms, sampling): if this curve has the model's shape, the matmul
    kernels, not the rest, set it. Returns :class:`KernelPoint` rows (``k`` = all the weights).
    """
    ms = [_check_size("m", m) for m in ms]
    if not ms:
        raise ValueError("ms is empty; give row counts, e.g. (1, 2, 4, 8)")
    repeats = _repeats(repeats)
    leaves = jax.tree_util.tree_flatten_with_path(model.params())[0]
    ws = [w.reshape(w.shape[0], -1) for path, w in leaves
          if w.ndim >= 2 and "embed" not in jax.tree_util.keystr(path)]
    if not ws:
        raise ValueError("the model has no weight matrices")
    dt = ws[0].dtype
    prec = jax.lax.Precision.HIGHEST if dt == jnp.float32 else None
    f = jax.jit(lambda xs, ws: [jnp.dot(xs[w.shape[0]], w, precision=prec, preferred_element_type=jnp.float32)
                                for w in ws])
    key = jax.random.key(seed)
    inputs = [{k: jax.random.normal(jax.random.fold_in(key, k * 1000 + m), (m, k), jnp.float32).astype(dt)
               for k in {w.shape[0] for w in ws}} for m in ms]

    def run(i):
        t0 = time.perf_counter()
        jax.block_until_ready(f(inputs[i], ws))
        return time.perf_counter() - t0

    total = sum(int(w.size) for w in ws)
    label = f"the model's {len(ws)} weight matrices alone ({total * dt.itemsize / 1e6:,.0f} MB, {dt.name})"
    return [KernelPoint(m, total, 1, dt.name, t, label) for m, t in zip(ms, _round_robin(run, len(ms), repeats))]
