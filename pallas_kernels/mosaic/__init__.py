"""The Hopper tier: the three kernels written for Mosaic GPU (sm_90: TMA, wgmma, warpgroups).

Same math and numerics as the Triton-style kernels in ``pallas_kernels.triton``. Each module
puts its kernel first, then its entry points (the kernel's launcher, which assumes validated
arguments, and ``unsupported``: what this tier cannot or should not take), then its frozen config
dataclass and ``plan(...)``::

    from pallas_kernels.mosaic import matmul
    matmul.plan(1, 2048, 3072).grid      # the modules, not the functions, live here
    matmul.matmul(a, b, interpret=True)  # GPU interpret mode on a CPU

Nothing is imported here: the Mosaic GPU compiler loads only when one of these modules is (the
public kernels import them only for a call that runs this tier, :func:`pallas_kernels.mode.choose_tier`).
"""
