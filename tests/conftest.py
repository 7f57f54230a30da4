"""Shared pytest set-up: GPU-marked tests run only where compiled Pallas can."""

import pytest


# The order `make test` hands whole files (a notebook is one) to its two workers: notebook 00
# first, as a learner runs it (it measures the ceilings while the other worker's first notebook
# waits for them, hardware.measure_ceilings letting one process measure at a time, and it makes
# the course record the later notebooks read, so none of them makes it again); then the longest, since a long file handed out last (the speculative lesson, the serving
# tests that start three servers) would run alone at the end while the other worker idles
# (measured in a fresh clone, cold compile caches, longest first); then the other lessons; then
# the other unit tests.
LONGEST_FIRST = ("00_setup_check.ipynb", "08_speculative_decoding.ipynb", "test_serving_engine.py",
                 "test_speculative.py",
                 "test_lessons.py", "07_serving_economics.ipynb", "09_serving_engine.ipynb",
                 "10_paged_kv_cache.ipynb", "11_quantization.ipynb",
                 "01_one_model_two_speeds.ipynb", "test_parallel.py", "test_mosaic_kernels.py",
                 "test_pretrained.py", "05_batching.ipynb", "test_kernels.py", "04_arithmetic_intensity.ipynb",
                 "test_probe.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def place(item):
        if item.path.name in rank:
            return rank[item.path.name]
        return len(rank) + (0 if item.path.suffix == ".ipynb" else 1)

    items.sort(key=place)   # stable: within a group, files keep their order
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    from pallas_kernels import mode

    if mode.pallas_supported():
        return
    reason = "needs an NVIDIA GPU of compute capability >= 8.0 (" + mode.describe() + ")"
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _one_read_spell(monkeypatch):
    """A test that measures ceilings (in a fresh cache folder) reads once: the spread reads that
    catch a shared host's fast spells (pallas_kernels.ceilings.READ_SPELLS, ~16 s) are notebook
    00's business, and no test asserts a ceiling's value."""
    from pallas_kernels import ceilings

    monkeypatch.setattr(ceilings, "READ_SPELLS", 1)
