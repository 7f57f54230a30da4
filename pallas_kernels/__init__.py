"""Pallas kernels for LLM inference: a matmul, flash attention (prefill), decode attention,
paged decode attention (the same, through a paged KV cache's block tables), ragged paged attention
(a serving iteration's prompt chunks and decode tokens at once, in place in a paged pool; Triton tier
only) and a quantized matmul (int8 or int4 weights, widened in registers; Triton tier only).

Two tiers of the same four kernels: the readable Triton-style kernels in
``pallas_kernels.triton`` (Ampere and newer, and the ones the lessons show) and the Hopper tier in
``pallas_kernels.mosaic`` (Mosaic GPU: TMA, wgmma, warp specialisation). The public functions
below take ``mode=`` and let :mod:`pallas_kernels.mode` choose the tier; each kernel file also
holds its frozen config class and ``plan(...)``, exported here as ``matmul_plan``,
``flash_attention_plan`` and ``decode_attention_plan``. ``reference`` holds the plain-jnp twins
with the same signatures and numerics.

Every name is loaded on first use: ``import pallas_kernels`` imports neither jax nor the Mosaic
GPU dialect, and the Mosaic tier is imported only when a call runs it.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "matmul": ("pallas_kernels.triton.matmul", "matmul"),
    "MatmulConfig": ("pallas_kernels.triton.matmul", "MatmulConfig"),
    "matmul_plan": ("pallas_kernels.triton.matmul", "plan"),
    "flash_attention": ("pallas_kernels.triton.flash_attention", "flash_attention"),
    "FlashAttentionConfig": ("pallas_kernels.triton.flash_attention", "FlashAttentionConfig"),
    "flash_attention_plan": ("pallas_kernels.triton.flash_attention", "plan"),
    "decode_attention": ("pallas_kernels.triton.decode_attention", "decode_attention"),
    "DecodeAttentionConfig": ("pallas_kernels.triton.decode_attention", "DecodeAttentionConfig"),
    "decode_attention_plan": ("pallas_kernels.triton.decode_attention", "plan"),
    "paged_decode_attention": ("pallas_kernels.triton.paged_decode_attention", "paged_decode_attention"),
    "PagedDecodeAttentionConfig": ("pallas_kernels.triton.paged_decode_attention", "PagedDecodeAttentionConfig"),
    "paged_decode_attention_plan": ("pallas_kernels.triton.paged_decode_attention", "plan"),
    "ragged_paged_attention": ("pallas_kernels.triton.ragged_paged_attention", "ragged_paged_attention"),
    "RaggedAttentionConfig": ("pallas_kernels.triton.ragged_paged_attention", "RaggedAttentionConfig"),
    "ragged_paged_attention_plan": ("pallas_kernels.triton.ragged_paged_attention", "plan"),
    "quantized_matmul": ("pallas_kernels.triton.quantized_matmul", "quantized_matmul"),
    "quantized_matmul_plan": ("pallas_kernels.triton.quantized_matmul", "plan"),
}
_SUBMODULES = ("mode", "reference", "quantization", "testing", "ceilings", "timing", "checks", "device", "files")

__all__ = list(_PUBLIC) + list(_SUBMODULES)


def __getattr__(name):
    if name in _PUBLIC:
        module, attr = _PUBLIC[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value   # looked up once
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"pallas_kernels.{name}")
    raise AttributeError(f"module 'pallas_kernels' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
