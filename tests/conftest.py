"""Shared pytest set-up: GPU-marked tests run only where compiled Pallas can."""

import pytest


# The longest test files run first: `make unit-test` hands whole files to two workers in collection
# order, and a long file collected last (the serving tests start three servers) would run alone
# at the end while the other worker idles.
LONGEST_FIRST = ("test_serving_engine.py", "test_parallel.py", "test_speculative.py", "test_probe.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # stable: the rest keep their order
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    from pallas_kernels import mode

    if mode.pallas_supported():
        return
    reason = "needs an NVIDIA GPU of compute capability >= 8.0 (" + mode.describe() + ")"
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))
