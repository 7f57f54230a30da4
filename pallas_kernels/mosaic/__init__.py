"""The Hopper tier: the three kernels written for Mosaic GPU (sm_90: TMA, wgmma, warpgroups).

Same math and numerics as the Triton-style kernels one directory up. Each module documents
its grid, tiles and pipeline and exposes a frozen config dataclass, ``plan(...)`` and a
low-level entry point that assumes validated arguments::

    from pallas_kernels.mosaic import matmul
    matmul.plan(1, 2048, 3072).grid      # the modules, not the functions, live here
    matmul.matmul(a, b, interpret=True)  # GPU interpret mode on a CPU
"""

from pallas_kernels.mosaic import decode_attention, flash_attention, matmul

__all__ = ["matmul", "flash_attention", "decode_attention"]
