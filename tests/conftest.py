"""Shared pytest set-up: the order the files are handed out, the unit tests' compiler settings,
and GPU-marked tests run only where compiled Pallas can."""

import os

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


def _is_lesson_or_browser(item) -> bool:
    return item.path.suffix == ".ipynb" or "browser" in item.path.parts


# The unit tests compile with XLA's optimizations off (jax_disable_most_optimizations: LLVM at
# -O0), on a CPU only: they check results, never speed, and much of their time was XLA compiling.
# Measured in a fresh clone, cold caches, the unit tests alone on two workers (AMD EPYC, 2 cores):
# 501 s with the optimizations, 413 s without. The flag is part of the persistent cache's key, so
# their programs never stand in for the lessons'. The servers and scripts they start inherit it
# through the environment, which the notebooks' kernels and the browser tests' JupyterLab, whose
# programs are timed, must not: pytest_runtest_setup sets it for a unit test and clears it for a
# lesson or a browser test (a worker runs a file to its end, and a file's kernel or server starts
# at its first test). Ceilings: a unit test reads the lessons' and measures (unoptimized, slower
# reads) into a file of its own (hardware.measure_ceilings), in one spell: the spread spells that
# catch a shared host's fast spells (pallas_kernels.ceilings.READ_SPELLS, ~16 s) are notebook
# 00's business, and no test asserts a ceiling's value.
UNOPTIMIZED = "JAX_DISABLE_MOST_OPTIMIZATIONS"


def pytest_configure(config):
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        return                                      # pytest-xdist's controller: it runs no test
    import jax

    from pallas_kernels import ceilings

    ceilings.READ_SPELLS = 1
    if jax.default_backend() != "cpu" or os.environ.get(UNOPTIMIZED):
        return
    jax.config.update("jax_disable_most_optimizations", True)   # this process runs only unit tests' programs
    config.unit_tests_unoptimized = True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if not getattr(item.config, "unit_tests_unoptimized", False):
        return
    if _is_lesson_or_browser(item):
        os.environ.pop(UNOPTIMIZED, None)
    else:
        os.environ[UNOPTIMIZED] = "1"


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


@pytest.fixture
def xla_optimized():
    """A unit test that times a model (the course record's test) compiles as a lesson does: its
    timed loops run ~4x longer unoptimized (35 s in place of 9 s for that test). What it
    compiles before this fixture's turn may still be reused unoptimized (jax's in-memory cache
    does not key on the flag): it asserts no rate's size."""
    import jax

    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    yield
    jax.config.update("jax_disable_most_optimizations", before)
