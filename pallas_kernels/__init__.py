"""Pallas kernels for LLM inference: a matmul, flash attention (prefill) and decode attention.

Each kernel lives in its own file with its wrapper, a frozen config class and a ``plan(...)``
that says which config and grid it will use for a shape (exported here as ``matmul_plan``,
``flash_attention_plan`` and ``decode_attention_plan``: the package's ``matmul`` is the
function, which hides the module of the same name). ``reference`` holds the plain-jnp twins
with the same signatures and numerics, and ``mode`` decides how a call executes.
"""

from pallas_kernels import mode, reference
from pallas_kernels.decode_attention import DecodeAttentionConfig, decode_attention
from pallas_kernels.decode_attention import plan as decode_attention_plan
from pallas_kernels.flash_attention import FlashAttentionConfig, flash_attention
from pallas_kernels.flash_attention import plan as flash_attention_plan
from pallas_kernels.matmul import MatmulConfig, matmul
from pallas_kernels.matmul import plan as matmul_plan

__all__ = ["matmul", "flash_attention", "decode_attention", "MatmulConfig", "FlashAttentionConfig",
           "DecodeAttentionConfig", "matmul_plan", "flash_attention_plan", "decode_attention_plan",
           "reference", "mode"]
