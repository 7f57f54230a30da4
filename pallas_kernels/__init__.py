"""Pallas kernels for LLM inference: a matmul, flash attention (prefill) and decode attention.

Each kernel lives in its own file with its wrapper; ``reference`` holds the plain-jnp twins
with the same signatures and numerics, and ``mode`` decides how a call executes.
"""

from pallas_kernels import mode, reference
from pallas_kernels.decode_attention import decode_attention
from pallas_kernels.flash_attention import flash_attention
from pallas_kernels.matmul import matmul

__all__ = ["matmul", "flash_attention", "decode_attention", "reference", "mode"]
