"""The model's kernels timed alone, beside the model: so a lesson can put the model's curve
beside its building block's.

The matmul points call the entry point the model calls, ``pallas_kernels.matmul``, in the mode
the model runs (``kernels=model.kernels``: XLA's kernel on a CPU, the Pallas kernel on a GPU),
and every record says which. The reading and square-matmul points time the three regimes of
notebook 04 (a call's fixed cost, a stream's bytes, a matmul's FLOPs). All of them are points
of :func:`inference_lab.measure.timing.measure_points`: the same timer, warm-ups, round-robin
repeats and skips as the model's own measurements.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

import pallas_kernels as pk
from inference_lab.base import checks, random_arrays
from inference_lab.model import quantize, transformer, weights
from inference_lab.measure.timing import measure_points
from pallas_kernels.timing import timed


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
    kernels: str = "reference"   # the pallas_kernels mode it ran in: "reference" is XLA's own kernel
    spread: float | None = None
    stored_bytes: int | None = None   # the weights' bytes as stored, when not k * n * itemsize (quantized)

    def describe(self) -> str:
        return self.label or f"[m, {self.k}] @ [{self.k}, {self.n}] {self.dtype} ({_ran(self.kernels)})"

    @property
    def weight_bytes(self) -> int:
        if self.stored_bytes is not None:
            return self.stored_bytes
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


def _ran(kernels: str) -> str:
    return "XLA's kernel" if kernels == "reference" else f"the Pallas kernel, mode {kernels!r}"


class _KernelPointBase:
    """What every kernel point shares: no ceilings, a [m, k] activation, its record."""

    phase = "kernel"
    dtype = None   # no ceilings: a kernel point's record is its time

    def release(self) -> None:
        self.args = None

    stored_bytes = None

    def record(self, samples, spec) -> KernelPoint:
        return KernelPoint(self.m, self.k, self.n, self.dtype_name, samples.median, self.label_text,
                           self.kernels, samples.spread, self.stored_bytes)


class MatmulPoint(_KernelPointBase):
    """``pk.matmul`` of ``m`` random rows against one random ``[k, n]`` weight, in ``kernels``
    mode (the model's), jitted."""

    def __init__(self, m: int, *, k: int, n: int, dtype="float32", kernels: str = "auto", seed: int = 0):
        self.m, self.k, self.n = checks.count("m", m), checks.count("k", k), checks.count("n", n)
        self.dtype_name = jnp.dtype(dtype).name
        self.kernels = pk.mode.resolve_mode(kernels)
        self.seed, self.label_text, self.args = seed, "", None
        self.batch, self.size = self.m, self.k * self.n

    @property
    def label(self) -> str:
        return f"matmul m {self.m}"

    def memory_needed(self) -> int:
        return (self.k * self.n + self.m * (self.k + self.n)) * jnp.dtype(self.dtype_name).itemsize

    def prepare(self) -> None:
        dt = jnp.dtype(self.dtype_name)
        w = random_arrays.normal((self.k, self.n), dt, (self.seed, self.m, 0))   # random, never zeros
        x = random_arrays.normal((self.m, self.k), dt, (self.seed, self.m, 1))
        self.fn = jax.jit(lambda x, w: pk.matmul(x, w, mode=self.kernels))
        self.args = (x, w)

    def run(self) -> float:
        return timed(self.fn, *self.args)


class ModelMatmulsPoint(_KernelPointBase):
    """``m`` rows through every matmul weight of ``model`` (each layer's, and the output head;
    the embedding table is only gathered, so it is left out), in one jitted call, through the
    entry point and mode the model uses: a decode step of batch ``m`` minus everything that is
    not a matmul (attention and its KV cache, norms, sampling). ``chained=True``: each product
    waits for the one before, as in the model (on a CPU with free cores XLA otherwise runs
    independent ones at the same time, which a model's layers never can)."""

    def __init__(self, model, m: int, *, seed: int = 0, chained: bool = False):
        self.model, self.m, self.seed, self.chained = model, checks.count("m", m), seed, checks.flag("chained", chained)
        flat = weights.flatten(model.params())
        self.weights = [w for name, w in flat.items() if name.rpartition(".")[2] in quantize.STREAMED]
        if not self.weights:
            raise ValueError("the model has no weight matrices")
        dt = self.weights[0].dtype
        self.dtype_name, self.kernels = dt.name, model.kernels
        self.k, self.n = sum(math.prod(w.shape) for w in self.weights), 1
        self.stored_bytes = sum(int(w.nbytes) for w in self.weights)
        fmt = dt.name if model.cfg.quantization == "none" else model.cfg.quantization
        self.label_text = (f"the model's {len(self.weights)} weight matrices alone "
                           f"({self.stored_bytes / 1e6:,.0f} MB, {fmt}, {_ran(self.kernels)})")
        self.batch, self.size, self.args = self.m, self.k, None

    @property
    def label(self) -> str:
        return f"model matmuls m {self.m}"

    def memory_needed(self) -> int:
        return sum(self.m * w.shape[0] for w in self.weights) * jnp.dtype(self.dtype_name).itemsize

    def prepare(self) -> None:
        dt, mode = jnp.dtype(self.dtype_name), self.kernels
        widths = sorted({w.shape[0] for w in self.weights})
        xs = {k: random_arrays.normal((self.m, k), dt, (self.seed, k, self.m)) for k in widths}
        # through the model's own matmul: pk.matmul, or pk.quantized_matmul for a quantized weight
        self.fn = jax.jit(functools.partial(_chain if self.chained else _side_by_side, mode=mode))
        self.args = (xs, self.weights)

    def run(self) -> float:
        return timed(self.fn, *self.args)


def _side_by_side(xs, ws, *, mode):
    """Every matrix times its activations, independent of each other (XLA may overlap them)."""
    return [transformer.dense(xs[w.shape[0]], w, mode) for w in ws]


def _chain(xs, ws, *, mode):
    """The same products, each waiting for the one before (as a model's layers do): its input
    carries a vanishing share (1e-30) of the previous output, so no two can run at once."""
    out, prev = [], None
    for w in ws:
        x = xs[w.shape[0]]
        if prev is not None:
            x = x + 1e-30 * prev[:, :1]
        prev = transformer.dense(x, w, mode)
        out.append(prev)
    return out


def matmul_sweep(ms=(1, 2, 4, 8, 16, 32), *, k: int = 4096, n: int = 4096, dtype="float32", kernels: str = "auto",
                 repeats: int | None = None, seed: int = 0) -> list:
    """Time the matmul of ``m`` rows against one ``[k, n]`` weight for each ``m``, side by side,
    through ``pk.matmul`` in ``kernels`` mode (pass the model's, ``model.kernels``).

    The kernel a model's decode step is made of, alone: ``m`` is the batch (decode) or the
    prompt length (prefill). Pick a weight larger than the processor's last-level cache, so
    every call streams it from memory as a decode step streams its weights (the lessons size it
    from the cache this machine reports). Which kernel runs depends on ``m`` (on a CPU, XLA takes
    a matrix-vector path for ``m = 1`` and a packed matrix-matrix path above), and that choice,
    not the roofline, shapes the curve."""
    ms = list(ms)
    if not ms:
        raise ValueError("ms is empty; give row counts, e.g. (1, 2, 4, 8)")
    points = [MatmulPoint(m, k=k, n=n, dtype=dtype, kernels=kernels, seed=seed) for m in ms]
    return list(measure_points(points, repeats=repeats, ceilings=None, desc="matmul"))


def model_matmuls_sweep(model, ms=(1, 2, 4, 8, 16, 32), *, repeats: int | None = None, seed: int = 0) -> list:
    """The model's own weight matrices multiplied alone (:class:`ModelMatmulsPoint`) for each
    ``m``, side by side. If this curve has the model's shape, the matmul kernels, not the rest,
    set it. Returns :class:`KernelPoint` rows (``k`` = all the weights)."""
    ms = list(ms)
    if not ms:
        raise ValueError("ms is empty; give row counts, e.g. (1, 2, 4, 8)")
    return list(measure_points([ModelMatmulsPoint(model, m, seed=seed) for m in ms], repeats=repeats,
                               ceilings=None, desc="model matmuls"))
