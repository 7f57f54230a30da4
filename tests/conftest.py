"""Shared pytest set-up: GPU-marked tests run only where compiled Pallas can."""

import pytest


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    from pallas_kernels import mode

    if mode.pallas_supported():
        return
    reason = "needs an NVIDIA GPU of compute capability >= 8.0 (" + mode.describe() + ")"
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))
