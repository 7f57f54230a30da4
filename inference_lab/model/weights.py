"""The weights file, and the check that every tensor is the one the config needs.

:meth:`Transformer.save <inference_lab.model.transformer.Transformer.save>` writes a safetensors file
holding every tensor under a flat name (``head``, ``layers.3.w_qkv``...) and the
:class:`~inference_lab.base.config.ModelConfig` in its metadata. :func:`read` refuses a file
before loading any tensor unless its config is valid and every tensor has the name, shape
and dtype that config implies (:func:`expected`): a missing or extra tensor, a transposed
matrix, a wrong dtype, or a config that disagrees with the tensors would otherwise load and
then generate wrong tokens silently, or fail much later inside a compiled program. The
error names the first mismatch and what the config expected.

A quantized model (:mod:`inference_lab.model.quantize`) is stored the same way, with each
quantized matrix as two tensors (``layers.3.w_qkv.q`` and ``layers.3.w_qkv.scales``); its scheme
is in its config (``quantization``, ``group_size``). Reading it checks every stored shape and
dtype against what the config implies, and that every scale is finite and positive.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from inference_lab.base.config import ModelConfig
from inference_lab.model import quantize

FORMAT = "inference_lab.Transformer/1"
LAYER_PARAMS = ("attn_norm", "w_qkv", "w_o", "mlp_norm", "w_gate_up", "w_down")
BIAS_PARAMS = ("b_qkv",)   # a layer's tensors too when its config has qkv_bias (Qwen2)
# safetensors' dtype codes <-> the config's dtype names
_FILE_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64",
                "I32": "int32", "I64": "int64", "I8": "int8", "U8": "uint8", "BOOL": "bool"}

_SHAPES = {  # what each tensor's shape is made of, for the error message
    "embed": "[vocab_size, d_model]", "head": "[d_model, vocab_size]", "final_norm": "[d_model]",
    "attn_norm": "[d_model]", "mlp_norm": "[d_model]",
    "w_qkv": "[d_model, n_kv_heads, n_heads / n_kv_heads + 2, head_dim]",
    "w_o": "[n_heads * head_dim, d_model]", "w_gate_up": "[d_model, 2, d_ff]", "w_down": "[d_ff, d_model]",
    "b_qkv": "[n_kv_heads, n_heads / n_kv_heads + 2, head_dim]",
}


def layer_params(cfg: ModelConfig) -> tuple[str, ...]:
    """The names of one layer's tensors for ``cfg``: :data:`LAYER_PARAMS`, and the Q/K/V biases
    when ``cfg.qkv_bias``."""
    return LAYER_PARAMS + BIAS_PARAMS if cfg.qkv_bias else LAYER_PARAMS


def expected(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a model of ``cfg`` has, flat name -> shape, in the order of the file."""
    d, v, dh, f = cfg.d_model, cfg.vocab_size, cfg.head_dim, cfg.d_ff
    hkv, g = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads
    out = {} if cfg.tie_embeddings else {"embed": (v, d)}
    out.update(head=(d, v), final_norm=(d,))
    for i in range(cfg.n_layers):
        out.update({f"layers.{i}.attn_norm": (d,), f"layers.{i}.w_qkv": (d, hkv, g + 2, dh),
                    f"layers.{i}.w_o": (cfg.n_heads * dh, d), f"layers.{i}.mlp_norm": (d,),
                    f"layers.{i}.w_gate_up": (d, 2, f), f"layers.{i}.w_down": (f, d)})
        if cfg.qkv_bias:
            out[f"layers.{i}.b_qkv"] = (hkv, g + 2, dh)
    return out


def flatten(params: dict) -> dict:
    """A :meth:`Transformer.params` dict -> flat names (``layers.3.w_qkv``) -> arrays (a
    :class:`~inference_lab.model.quantize.QuantizedWeight` stays one entry)."""
    flat = {k: v for k, v in params.items() if k != "layers"}
    for i, lp in enumerate(params.get("layers", [])):
        flat.update({f"layers.{i}.{k}": v for k, v in lp.items()})
    return flat


def _tensors(params: dict) -> dict:
    """The arrays a file holds: :func:`flatten`, with each quantized weight as ``name.q`` and
    ``name.scales``."""
    out = {}
    for name, x in flatten(params).items():
        if isinstance(x, quantize.QuantizedWeight):
            out.update({f"{name}.q": x.q, f"{name}.scales": x.scales})
        else:
            out[name] = x
    return out


def nest(flat: dict, cfg: ModelConfig) -> dict:
    """The inverse of :func:`flatten` (the names are assumed checked)."""
    params = {k: v for k, v in flat.items() if not k.startswith("layers.")}
    params["layers"] = [{name: flat[f"layers.{i}.{name}"] for name in layer_params(cfg)} for i in range(cfg.n_layers)]
    return params


def check(cfg: ModelConfig, found: dict, source: str) -> None:
    """``found``: flat name -> (shape, dtype name). Raises a ValueError at the first tensor
    that is missing, extra, of another shape or of another dtype than ``cfg`` implies."""
    want = expected(cfg)
    summary = (f"{cfg.name}: vocab_size={cfg.vocab_size}, d_model={cfg.d_model}, n_layers={cfg.n_layers}, "
               f"n_heads={cfg.n_heads}, n_kv_heads={cfg.n_kv_heads}, head_dim={cfg.head_dim}, d_ff={cfg.d_ff}, "
               f"tie_embeddings={cfg.tie_embeddings}, qkv_bias={cfg.qkv_bias}, dtype={cfg.dtype}")
    missing = [n for n in want if n not in found]
    if missing:
        raise ValueError(f"{source}: tensor {missing[0]!r} is missing ({len(missing)} of {len(want)} missing); "
                         f"the config ({summary}) needs it")
    extra = sorted(n for n in found if n not in want)
    if extra:
        raise ValueError(f"{source}: tensor {extra[0]!r} is not part of a model with this config ({summary}); "
                         "the tensors and the config disagree")
    for name, shape in want.items():
        have, dtype = found[name]
        have = tuple(int(x) for x in have)
        if have != shape:
            hint = ""
            if len(shape) > 1 and have == shape[::-1]:
                hint = " (transposed?)"
            elif sorted(have) == sorted(shape):
                hint = " (axes in another order?)"
            raise ValueError(f"{source}: tensor {name!r} has shape {have}{hint} but the config needs "
                             f"{shape} = {_SHAPES[name.rpartition('.')[2]]} ({summary})")
        if dtype != cfg.dtype:
            raise ValueError(f"{source}: tensor {name!r} is {dtype} but the config's dtype is {cfg.dtype}; "
                             "every tensor must be in the model's dtype")


def check_params(cfg: ModelConfig, params: dict, source: str = "params") -> None:
    """:func:`check` for a nested :meth:`Transformer.params` dict of arrays."""
    import numpy as np

    if not isinstance(params, dict):
        raise ValueError(f"{source} must be a dict like Transformer.params(), got {type(params).__name__}")
    if not isinstance(params.get("layers", []), (list, tuple)):
        raise ValueError(f"{source}['layers'] must be a list of per-layer dicts")
    found = {}
    for name, x in flatten(params).items():
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise ValueError(f"{source}: {name!r} is a {type(x).__name__}, not an array")
        found[name] = (tuple(x.shape), np.dtype(x.dtype).name)
        is_q = isinstance(x, quantize.QuantizedWeight)
        if name.rpartition(".")[2] in quantize.STREAMED and (
                (f"int{x.bits}", x.group_size) if is_q else ("none", None)) != (cfg.quantization, cfg.group_size):
            have = f"int{x.bits} (group_size={x.group_size})" if is_q else "float"
            raise ValueError(f"{source}: {name!r} is {have} but the config says quantization={cfg.quantization!r}, "
                             f"group_size={cfg.group_size}; use Transformer.quantized() to quantize a model")
        if is_q:   # its stored parts must fit the shape it claims
            scheme = f"int{x.bits}"
            for part, (shape, dtype) in quantize.stored_shapes(x.shape, scheme, x.group_size).items():
                have = getattr(x, part)
                if tuple(have.shape) != shape or np.dtype(have.dtype).name != dtype:
                    raise ValueError(f"{source}: {name}.{part} is {np.dtype(have.dtype).name} {tuple(have.shape)} "
                                     f"but a {scheme} weight of shape {x.shape} stores {dtype} {shape}")
    check(cfg, found, source)


def save(path, cfg: ModelConfig, params: dict) -> None:
    """Write ``params`` and ``cfg`` to a safetensors file, whole or not at all (written next
    to ``path`` under a temporary name, then renamed over it)."""
    from safetensors.flax import save_file

    from pallas_kernels.files import replacing

    metadata = {"config": json.dumps(dataclasses.asdict(cfg)), "format": FORMAT}
    with replacing(path) as tmp:
        save_file(_tensors(params), str(tmp), metadata=metadata)


def read(path) -> tuple[ModelConfig, dict]:
    """(config, params) from a file written by :func:`save`, checked before any tensor loads."""
    from safetensors import safe_open
    from safetensors.flax import load_file

    source = f"weights file {str(path)!r}"
    if not Path(path).is_file():
        raise ValueError(f"path={str(path)!r} is not a file; pass the file written by model.save(path)")
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            found = {}
            for name in f.keys():
                sl = f.get_slice(name)
                found[name] = (tuple(sl.get_shape()), _FILE_DTYPES.get(sl.get_dtype(), sl.get_dtype()))
    except Exception as err:  # safetensors raises its own SafetensorError (an Exception) for any damage
        raise ValueError(f"{source} is not a readable safetensors file ({str(err)[:120]}); "
                         "load only files written by Transformer.save") from None
    if "config" not in meta:
        raise ValueError(f"{source} has no inference_lab config in its metadata; "
                         "load only files written by Transformer.save")
    try:
        fields = json.loads(meta["config"])
        if not isinstance(fields, dict):
            raise ValueError(f"it is a JSON {type(fields).__name__}, not an object")
        cfg = ModelConfig(**fields)
    except (ValueError, TypeError, RecursionError) as err:
        raise ValueError(f"{source}: the config in its metadata is not a valid ModelConfig ({str(err)[:160]})") from None
    found = _as_float_view(found, cfg, source)
    check(cfg, found, source)
    tensors = load_file(str(path))
    bad = next((name for name, t in tensors.items() if not bool(all_finite(t))), None)
    if bad is not None:   # a NaN or infinite weight poisons every token after it
        raise ValueError(f"{source}: tensor {bad!r} holds NaN or infinite values; the file is damaged "
                         "(or training diverged): train again or load another file")
    if cfg.quantization != "none":
        tensors = _assemble(tensors, cfg, source)
    return cfg, nest(tensors, cfg)


def _as_float_view(found: dict, cfg: ModelConfig, source: str) -> dict:
    """A quantized file's ``name.q``/``name.scales`` pairs checked against the shapes its config
    (``quantization``, ``group_size``) implies, and replaced by the float ``name`` they stand for
    (for :func:`check`)."""
    scheme, group_size = cfg.quantization, cfg.group_size
    if scheme == "none":
        return found
    out = dict(found)
    for name, shape in expected(cfg).items():
        if name.rpartition(".")[2] not in quantize.STREAMED:
            continue
        for part, (want, dtype) in quantize.stored_shapes(shape, scheme, group_size).items():
            key = f"{name}.{part}"
            if key not in out:
                raise ValueError(f"{source}: tensor {key!r} is missing; a {scheme} file stores each matrix "
                                 f"as {name}.q and {name}.scales")
            have, have_dtype = out.pop(key)
            if tuple(int(x) for x in have) != want or have_dtype != dtype:
                raise ValueError(f"{source}: tensor {key!r} is {have_dtype} {tuple(have)} but {scheme} "
                                 f"(group_size={group_size}) of {name} {shape} ({cfg.name}) stores {dtype} {want}; "
                                 "the file was quantized for another model or scheme")
        out[name] = (shape, cfg.dtype)
    return out


def _assemble(tensors: dict, cfg: ModelConfig, source: str) -> dict:
    """Checked tensors of a quantized file -> flat names -> arrays and QuantizedWeights."""
    out = dict(tensors)
    for name, shape in expected(cfg).items():
        if name.rpartition(".")[2] in quantize.STREAMED:
            scales = out.pop(f"{name}.scales")
            quantize.check_scales(f"{name}.scales", scales, source)
            out[name] = quantize.QuantizedWeight(out.pop(f"{name}.q"), scales, shape, cfg.dtype, cfg.group_size)
    return out


def all_finite(t) -> bool:
    """Whether every value of the array ``t`` is finite (a jax or NumPy array, any float dtype).
    On the host with NumPy: a jax reduction would compile one program per tensor shape."""
    import numpy as np

    a = np.asarray(t)
    return bool(np.isfinite(a if a.dtype.kind == "f" else a.astype(np.float32)).all())


def cast(src, dst, dtype: str) -> None:
    """Write the model in ``src`` to ``dst`` with every tensor (and the config's ``dtype``) in
    ``dtype``: how a model trained in float32 is stored in bfloat16 (half the bytes)."""
    from inference_lab.base.config import DTYPES

    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} must be one of {', '.join(DTYPES)}")
    cfg, params = read(src)
    if cfg.quantization != "none":
        raise ValueError(f"src={str(src)!r} holds {cfg.quantization} weights; cast the float model's file, "
                         "then quantize it")
    save(dst, dataclasses.replace(cfg, dtype=dtype), astype(params, dtype))


def astype(params: dict, dtype) -> dict:
    """A :meth:`Transformer.params` dict with every array in ``dtype`` (new arrays)."""
    import jax.numpy as jnp

    return {k: ([{n: jnp.asarray(x, dtype) for n, x in layer.items()} for layer in v] if k == "layers"
                else jnp.asarray(v, dtype)) for k, v in params.items()}
