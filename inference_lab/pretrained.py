"""The trained model the lab ships: a small byte-level model that writes Shakespeare-like text.

    from inference_lab import generate, pretrained
    model = pretrained.load()                      # kernels="auto", as Transformer
    print(generate(model, "ROMEO:", 200))

The weights live in the package (``inference_lab/weights/shakespeare.safetensors``, shape:
the ``shakespeare`` preset); nothing is ever downloaded. ``weights/README.md`` says how they
were trained (:mod:`inference_lab.train`), on what, and how well. The random-weight presets
remain the lab's speed measurements' models: how long a matmul takes does not depend on the
values in it. This one is for seeing the same prefill/decode machinery produce real text.

:func:`load` checks the file before building the model: every tensor the config needs must
be there with the right shape and dtype, and nothing else, so a wrong or damaged file fails
with a message naming the tensor rather than deep inside a forward pass.
"""

from __future__ import annotations

import json
from pathlib import Path

from inference_lab.config import ModelConfig

PRESET = "shakespeare"
WEIGHTS_PATH = Path(__file__).resolve().parent / "weights" / "shakespeare.safetensors"

# safetensors' dtype names for the config's dtypes
_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16"}


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor a file written by ``Transformer.save`` holds for ``cfg``: name -> (shape,
    safetensors dtype). The layout of :mod:`inference_lab.model`'s docstring, layers flattened
    as ``layers.{i}.{name}``."""
    d, v, f, dh = cfg.d_model, cfg.vocab_size, cfg.d_ff, cfg.head_dim
    hkv, g = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads
    dt = _ST_DTYPES[cfg.dtype]
    out = {"head": ((d, v), dt), "final_norm": ((d,), dt)}
    if not cfg.tie_embeddings:
        out["embed"] = ((v, d), dt)
    layer = {"attn_norm": (d,), "w_qkv": (d, hkv, g + 2, dh), "w_o": (cfg.n_heads * dh, d),
             "mlp_norm": (d,), "w_gate_up": (d, 2, f), "w_down": (f, d)}
    for i in range(cfg.n_layers):
        out.update({f"layers.{i}.{name}": (shape, dt) for name, shape in layer.items()})
    return out


def check_file(path) -> ModelConfig:
    """The config stored in the safetensors file at ``path``, after checking that its tensors
    are exactly the ones that config needs (names, shapes, dtypes). Reads only the header.
    Raises ``ValueError`` naming the first problem found."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"weights file {str(path)!r} does not exist")
    try:
        handle = safe_open(str(path), framework="numpy")
    except Exception as e:  # safetensors raises its own error types for a damaged header
        raise ValueError(f"weights file {str(path)!r} is not a readable safetensors file ({e})") from None
    with handle as f:
        meta = f.metadata() or {}
        if "config" not in meta:
            raise ValueError(f"weights file {str(path)!r} has no inference_lab config in its metadata; "
                             "it was not written by Transformer.save")
        try:
            cfg = ModelConfig(**json.loads(meta["config"]))
        except (TypeError, ValueError) as e:
            raise ValueError(f"weights file {str(path)!r} has an invalid config in its metadata ({e})") from None
        have = {name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype()) for name in f.keys()}
    want = expected_tensors(cfg)
    where = f"weights file {str(path)!r} (config {cfg.name!r})"
    missing = [n for n in want if n not in have]
    if missing:
        shape, dt = want[missing[0]]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"{where} lacks tensor {missing[0]!r}{more}: expected shape {list(shape)} dtype {dt}")
    extra = sorted(n for n in have if n not in want)
    if extra:
        raise ValueError(f"{where} holds tensor {extra[0]!r} that its config does not use"
                         + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    for name, (shape, dt) in want.items():
        got_shape, got_dt = have[name]
        if got_shape != shape:
            raise ValueError(f"{where}: tensor {name!r} has shape {list(got_shape)}, expected {list(shape)}")
        if got_dt != dt:
            raise ValueError(f"{where}: tensor {name!r} has dtype {got_dt}, expected {dt} (config dtype {cfg.dtype})")
    return cfg


def load(kernels: str = "auto", path=None):
    """The trained model as a :class:`~inference_lab.model.Transformer` (``kernels`` as there).

    ``path=None`` loads the weights shipped in the package; another path loads any file
    written by ``Transformer.save`` or ``python -m inference_lab train``. Never downloads.
    """
    from inference_lab.model import Transformer

    shipped = path is None
    path = WEIGHTS_PATH if shipped else Path(path)
    if shipped and not path.is_file():
        raise ValueError(
            f"the shipped weights {str(path)!r} are missing: this copy of inference_lab was installed "
            "without its package data, or the file was deleted. Reinstall the package, or train them "
            "again with the command in inference_lab/weights/README.md (nothing is downloaded)")
    cfg = check_file(path)
    if shipped and cfg != ModelConfig.preset(PRESET):
        raise ValueError(f"the shipped weights {str(path)!r} were trained for {cfg}, but the "
                         f"{PRESET!r} preset is now {ModelConfig.preset(PRESET)}; make them agree")
    return Transformer.load(path, kernels=kernels)
