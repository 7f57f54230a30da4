"""Quantized weights for the lab's model: which matrices, in which format, and the array-like
that carries one through the model's pure functions.

``Transformer.quantized("int8")`` (or ``("int4", 32)``) is the usual way in: it records the
scheme in the model's config (``ModelConfig.quantization``/``group_size``, where the roofline
reads the stored bytes) and calls ``quantize``. ``quantize(params, "int8")`` returns a :meth:`Transformer.params
<inference_lab.model.transformer.Transformer.params>` dict in which every matrix a decode step
streams (each layer's ``w_qkv``, ``w_o``, ``w_gate_up``, ``w_down``, and the output ``head``) is
a :class:`QuantizedWeight`; the norms stay float (a few KB), and so does an untied ``embed``
(a step gathers B of its rows: it is never streamed). The formats are
:mod:`pallas_kernels.quantization`'s: int8 with a scale per output column, int4 with a scale
per group of ``group_size`` input rows.

A :class:`QuantizedWeight` has the ``shape`` and ``dtype`` of the float weight it replaces, so
code that reads a weight's shape (head counts, the KV cache's dtype) works unchanged; the
model's matmuls see it and call ``pk.quantized_matmul`` instead of ``pk.matmul``. It is a jax
pytree (its ``q`` and ``scales`` are the leaves), so the same jitted programs take it.

``activations``: how the matmul treats the activations, ``"auto"`` (the kernel's choice: int8
per row on the XLA path, where XLA:CPU's int8 dot is fast and its mixed int8 x float dot is
slow; float in the Pallas kernel), ``"float"`` (weight-only everywhere) or ``"int8"``.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from inference_lab.base.config import INT4_GROUP_SIZES, QUANTIZATIONS
from pallas_kernels import quantization

ACTIVATIONS = ("auto", "float", "int8")
MATRICES = ("w_qkv", "w_o", "w_gate_up", "w_down")   # per layer
STREAMED = (*MATRICES, "head")                          # every matrix a step streams: what gets quantized
DEFAULT_GROUP_SIZE = 32


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
    """A weight of logical ``shape`` (input rows first) stored as ``q`` and ``scales`` of its 2-D
    view ``[shape[0], prod(shape[1:])]``: int8 (``group_size`` None) or packed int4."""

    q: jax.Array
    scales: jax.Array
    shape: tuple = dataclasses.field(metadata=dict(static=True))
    float_dtype: str = dataclasses.field(metadata=dict(static=True))
    group_size: int | None = dataclasses.field(default=None, metadata=dict(static=True))
    activations: str = dataclasses.field(default="auto", metadata=dict(static=True))

    @property
    def dtype(self):
        """The float dtype of the weight this stands for (the model's dtype)."""
        return jnp.dtype(self.float_dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def bits(self) -> int:
        return 8 if self.group_size is None else 4

    @property
    def nbytes(self) -> int:
        """Bytes stored: the integers and the scales."""
        return int(self.q.nbytes + self.scales.nbytes)

    def dequantize(self, columns=None):
        """The float weight it stands for, in its dtype and shape; with ``columns`` (int array of
        any shape) only those columns of the 2-D view, as ``[shape[0], *columns.shape]`` (how a
        tied model's embedding gathers token rows from a quantized head)."""
        if columns is None:
            w = quantization.dequantize(self.q, self.scales, self.group_size)
            return w.reshape(self.shape).astype(self.dtype)
        flat = columns.reshape(-1)
        w = quantization.dequantize(self.q[:, flat], self.scales[..., flat], self.group_size)
        return w.reshape(self.shape[0], *columns.shape).astype(self.dtype)


def quantize_weight(w, scheme: str, group_size: int | None = None, *, name: str = "weight",
                    activations: str = "auto") -> QuantizedWeight:
    """One float weight (input rows first) -> a :class:`QuantizedWeight` (``scheme`` "int8"/"int4")."""
    shape = tuple(int(d) for d in w.shape)
    w2 = jnp.asarray(w, jnp.float32).reshape(shape[0], -1)
    if scheme == "int8":
        q, scales = quantization.quantize_int8(w2)
        group_size = None
    else:
        try:
            q, scales = quantization.quantize_int4(w2, group_size)
        except ValueError as err:   # name the layer that cannot be packed
            raise ValueError(f"{name}: {err}") from None
    return QuantizedWeight(q, scales, shape, jnp.dtype(w.dtype).name, group_size, activations)


def check_scheme(scheme: str, group_size, activations: str = "auto") -> None:
    """One-line errors for a scheme name, group size and activation mode."""
    if scheme not in QUANTIZATIONS:
        raise ValueError(f"quantization={scheme!r} must be one of {', '.join(QUANTIZATIONS)}")
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations={activations!r} must be one of {', '.join(ACTIVATIONS)}")
    if scheme == "int4":
        if isinstance(group_size, bool) or group_size not in INT4_GROUP_SIZES:
            raise ValueError(f"group_size={group_size!r} is not an int4 group size; use one of "
                             f"{', '.join(map(str, INT4_GROUP_SIZES))}")
    elif group_size is not None:
        raise ValueError(f"group_size={group_size!r} applies to int4 only; {scheme} takes group_size=None")


def group_size_for(scheme: str, group_size: int | None) -> int | None:
    """The group size ``scheme`` uses: :data:`DEFAULT_GROUP_SIZE` for int4 when none is given."""
    return DEFAULT_GROUP_SIZE if scheme == "int4" and group_size is None else group_size


def quantize(params: dict, scheme: str, group_size: int | None = None, *, activations: str = "auto") -> dict:
    """A params dict with every streamed matrix quantized (``scheme`` "int8", "int4" or "none":
    the dict unchanged). int4 needs ``group_size`` (32, 64 or 128) to divide every matrix's input
    rows; the error names the first matrix it does not. Already-quantized params are refused."""
    group_size = group_size_for(scheme, group_size)
    check_scheme(scheme, group_size, activations)
    if scheme == "none":
        return params
    if is_quantized(params):
        raise ValueError("params are already quantized; quantize the float model's params")
    out = dict(params)
    out["head"] = quantize_weight(params["head"], scheme, group_size, name="head", activations=activations)
    out["layers"] = [{name: (quantize_weight(w, scheme, group_size, name=f"layers.{i}.{name}", activations=activations)
                             if name in MATRICES else w) for name, w in layer.items()}
                     for i, layer in enumerate(params["layers"])]
    return out


def is_quantized(params: dict) -> bool:
    return isinstance(params.get("head"), QuantizedWeight)


def dequantize(params: dict) -> dict:
    """The float params the quantized ones stand for (what a quantized model computes with,
    when its activations stay float): the twin for checking a quantized path."""
    return {k: ([{n: (w.dequantize() if isinstance(w, QuantizedWeight) else w) for n, w in layer.items()}
                 for layer in v] if k == "layers" else (v.dequantize() if isinstance(v, QuantizedWeight) else v))
            for k, v in params.items()}


def stored_shapes(shape: tuple, scheme: str, group_size: int | None) -> dict[str, tuple[tuple[int, ...], str]]:
    """What a weight of float ``shape`` is stored as: {"q": (shape, dtype), "scales": (shape, dtype)}."""
    k, n = shape[0], math.prod(shape[1:])
    if scheme == "int8":
        return {"q": ((k, n), "int8"), "scales": ((n,), "float32")}
    return {"q": ((k // 2, n), "uint8"), "scales": ((k // group_size, n), "float32")}


def check_scales(name: str, scales, source: str) -> None:
    """A scale tensor must be finite and positive (quantization never makes a zero step): a NaN,
    an infinity or a value <= 0 is a damaged file, and would turn every output it touches wrong."""
    s = np.asarray(scales)
    if not (np.isfinite(s).all() and (s > 0).all()):
        raise ValueError(f"{source}: scale tensor {name!r} holds {'non-finite' if not np.isfinite(s).all() else 'zero or negative'} "
                         "values; the file is damaged: quantize the float model again")
