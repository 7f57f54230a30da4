"""Small helpers shared by the Mosaic GPU kernels: SM count, interpret parameters, dtype check,
and the one-jitted-entry rule every kernel of the tier follows (:func:`one_entry`)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import device
from pallas_kernels.mosaic import kernel_names

# Identical kernels get identical modules, so jaxlib compiles each distinct kernel once.
kernel_names.install()

# Largest dynamic shared memory one CTA may use on Hopper (sm_90): 227 KiB.
HOPPER_SMEM_BYTES = 227 * 1024
MMA_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def device_num_sms() -> int:
    """SMs of the default device if it is a GPU, else the H200's 132 (:mod:`pallas_kernels.device`)."""
    return device.num_sms()


def hopper_available() -> bool:
    """True when the default device is an sm_90 GPU (Hopper: wgmma exists only there)."""
    try:
        dev = jax.devices()[0]
    except RuntimeError:
        return False
    cc = getattr(dev, "compute_capability", None)
    return dev.platform == "gpu" and cc is not None and str(cc).split(".")[0] == "9"


def interpret_params(interpret):
    """What ``plgpu.kernel(interpret=...)`` takes: ``True`` -> default ``InterpretGPUParams()``
    (GPU interpret mode on a CPU), a ``plgpu.InterpretGPUParams`` (e.g. with
    ``detect_races=True``) as is, ``False`` -> ``None`` (compile for the GPU)."""
    if isinstance(interpret, plgpu.InterpretGPUParams):
        return interpret
    return plgpu.InterpretGPUParams() if interpret else None


def check_mma_dtype(x, name: str, kernel: str) -> None:
    """The tensor-core tier takes bf16/f16 only; say so in one line naming the fix."""
    if jnp.dtype(x.dtype) not in MMA_DTYPES:
        raise ValueError(
            f"{name} has dtype {x.dtype}; the Mosaic GPU {kernel} takes bfloat16 or float16 "
            f"(cast with .astype(jnp.bfloat16), or use pallas_kernels.{kernel} for float32)"
        )


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return cdiv(a, b) * b


def swizzled(minor_elems: int, dtype) -> tuple:
    """SMEM transforms (8-row tiling + the widest swizzle) for a tile whose rows hold
    ``minor_elems`` elements of ``dtype``: the layout TMA writes and wgmma reads."""
    itemsize = jnp.dtype(dtype).itemsize
    swizzle = plgpu.find_swizzle(minor_elems * itemsize * 8)
    return (plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle))


def one_entry(*static: str):
    """``jax.jit`` with ``static`` as static arguments: how every kernel of this tier is entered.

    Lowering one Mosaic GPU kernel costs ~0.2 s of Python (its whole MLIR module is built and
    serialised). Under one jitted entry, the 16 layers' identical calls of a model trace once and
    lower once per program: jax lowers a nested jitted call to one function that every call site
    calls (the ``base`` decode step: 6 Mosaic lowerings instead of 81)."""
    return functools.partial(jax.jit, static_argnames=static)
