"""What a kernel plan needs to know about the GPU: how many SMs it has.

A plan sizes its grid against the SM count so every SM gets work (decode matmuls split K until
there are at least two programs per SM; decode attention splits the cache until there are about
eight). ``num_sms=None`` reads the
default device; where there is no GPU (a CPU, or an abstract device used to lower kernels for
CUDA on a CPU) the H200's count is assumed, stated here so a reader knows what was planned for.
"""

from __future__ import annotations

import functools

DEFAULT_NUM_SMS = 132  # NVIDIA H200 SXM and H100 SXM: 132 SMs (NVIDIA Hopper architecture whitepaper)
A100_NUM_SMS = 108     # NVIDIA A100: 108 SMs (NVIDIA A100 Tensor Core GPU architecture whitepaper)


@functools.lru_cache(maxsize=1)
def _device_sms() -> int | None:
    import jax

    try:
        dev = jax.devices()[0]
    except RuntimeError:
        return None
    if dev.platform != "gpu":
        return None
    count = getattr(dev, "core_count", None)  # jax's GPU devices report their SM count here
    return int(count) if count else None


def num_sms(num_sms: int | None = None) -> int:
    """``num_sms`` if given, else the default device's SM count, else :data:`DEFAULT_NUM_SMS`."""
    if num_sms is not None:
        if isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms < 1:
            raise ValueError(f"num_sms={num_sms!r} must be a positive integer (or None to read the device)")
        return num_sms
    return _device_sms() or DEFAULT_NUM_SMS
