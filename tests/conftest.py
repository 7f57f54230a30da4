"""Shared pytest set-up: GPU-marked tests run only where compiled Pallas can."""

import pytest


# The longest files run first: `make test` and `make unit-test` hand whole files (a notebook is
# one) to the workers in collection order, and a long file collected last (the speculative
# lesson, the serving tests that start three servers) would run alone at the end while the other
# worker idles. Measured in a fresh clone (cold compile caches), longest first.
LONGEST_FIRST = ("08_speculative_decoding.ipynb", "test_serving_engine.py", "test_speculative.py",
                 "test_lessons.py", "07_serving_economics.ipynb", "09_serving_engine.ipynb",
                 "01_one_model_two_speeds.ipynb", "test_parallel.py", "test_mosaic_kernels.py",
                 "test_pretrained.py", "05_batching.ipynb", "test_kernels.py", "04_arithmetic_intensity.ipynb",
                 "test_probe.py")


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
