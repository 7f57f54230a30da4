"""Inference Lab: measure prefill and decode on your own hardware.

The package is folders, one per layer (docs/architecture.md): ``base`` (shapes, tokenizer,
hardware, the cache folder, progress, checks), ``analytic`` (costs, roofline, simulator,
prices), ``model`` (transformer, KV cache, tensor parallelism, weights), ``runtime`` (engine,
streaming, compiled programs), ``measure`` (timing, records, the probe), then ``lessons``,
``plots``, ``widgets`` and the commands.

The names below are the model's public API, loaded on first use, so ``import inference_lab``
imports no jax (the GPU image, which has no ipywidgets, can import everything but ``widgets``).
"""

from __future__ import annotations

import importlib

from inference_lab.base.disk_cache import enable_compilation_cache

enable_compilation_cache()

_PUBLIC = {
    "ModelConfig": "inference_lab.base.config",
    "Transformer": "inference_lab.model.transformer",
    "KVCache": "inference_lab.model.kv_cache",
    "prefill": "inference_lab.runtime.generation",
    "decode_step": "inference_lab.runtime.generation",
    "decode_loop": "inference_lab.runtime.generation",
    "generate": "inference_lab.runtime.generation",
}

__all__ = list(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'inference_lab' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
