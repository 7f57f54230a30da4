"""Inference Lab: measure prefill and decode on your own hardware.

The names below are loaded on first use, so ``import inference_lab`` stays quick and the
GPU image (which has no ipywidgets) can import everything but ``widgets``.
"""

from __future__ import annotations

import importlib

from inference_lab.disk_cache import enable_compilation_cache

enable_compilation_cache()

_LAZY = {
    "ModelConfig": "inference_lab.config",
    "Transformer": "inference_lab.model",
    "KVCache": "inference_lab.kv_cache",
    "prefill": "inference_lab.engine",
    "decode_step": "inference_lab.engine",
    "decode_loop": "inference_lab.engine",
    "generate": "inference_lab.engine",
}
_SUBMODULES = ("config", "tokenizer", "model", "kv_cache", "parallel", "engine", "hlo", "streaming", "hardware",
               "roofline", "measure", "records", "economics", "simulator", "serving_metrics", "vllm_bench",
               "probe", "pretrained", "train", "plots", "widgets", "lessons")

__all__ = list(_LAZY) + list(_SUBMODULES)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"inference_lab.{name}")
    raise AttributeError(f"module 'inference_lab' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
