"""One name per Mosaic GPU kernel, taken from its contents: a guarded workaround for jax 0.11.2.

Why
---
jaxlib compiles a Mosaic GPU kernel once per *hash of its module* (the custom call's
``kernel_hash``: SHA-256 of the module's bytecode) and keeps the compiled kernel under that hash.
jax 0.11.2's Pallas lowering hands every module to ``get_or_set_dump_options``, which stamps it with
``mosaic_gpu.dump_basename = "<name>_<N>"``, N from a process-wide counter: a file name for the
optional MLIR dumps (``MOSAIC_GPU_DUMP_TO``) that ends up inside the bytecode. Two identical
kernels (layer 0's and layer 1's QKV projection) therefore hash differently, and the ``base``
model's decode step compiled 81 Mosaic kernels where 6 are distinct; the same program lowered in
another order (the probe's prefill before its decode) got other numbers, so even the persistent
compilation cache missed. The upstream report is in ``docs/upstream/mosaic_gpu_dump_basename.md``.

What
----
:func:`install` wraps ``jax.experimental.mosaic.gpu.core.lower_mgpu_module`` (the call the Pallas
lowering makes right before it asks for the dump options) so that a module without a basename
gets one made of its own contents: ``mosaic_<sha256 of the module, 16 hex digits>``. The counter is
then never consulted; identical kernels carry identical names, so identical bytecode and one
compile, in any order and in any process. Dumps still get one file name per distinct kernel.

Guarded: nothing is wrapped unless the function exists and takes the module first, the attribute
is set only where it is missing, and ``tests/test_model_lowers_for_cuda.py`` fails if the model's decode
step again compiles more Mosaic kernels than it has distinct ones (say, a jax upgrade that moves
the stamp elsewhere).
"""

from __future__ import annotations

import functools
import hashlib
import inspect

from jax.experimental.mosaic.gpu import core
from jaxlib.mlir import ir   # the MLIR bindings jax builds its modules with

ATTRIBUTE = "mosaic_gpu.dump_basename"
PREFIX = "mosaic_"


def content_name(module) -> str:
    """The basename this workaround gives an MLIR ``module``: a hash of its bytecode."""
    digest = hashlib.sha256(module.operation.get_asm(binary=True)).hexdigest()
    return PREFIX + digest[:16]


def _named_first(lower):
    @functools.wraps(lower)
    def lower_with_content_name(module, *args, **kwargs):
        attributes = module.operation.attributes
        if ATTRIBUTE not in attributes:
            attributes[ATTRIBUTE] = ir.StringAttr.get(content_name(module))
        return lower(module, *args, **kwargs)

    lower_with_content_name.pallas_kernels_names_by_content = True
    return lower_with_content_name


@functools.lru_cache(maxsize=1)
def install() -> bool:
    """Wrap jax's Mosaic GPU module lowering once per process; True if it is wrapped."""
    lower = getattr(core, "lower_mgpu_module", None)
    if lower is None or getattr(lower, "pallas_kernels_names_by_content", False):
        return lower is not None
    params = list(inspect.signature(lower).parameters)
    if not params or params[0] != "module":
        return False     # a jax whose lowering changed shape: leave it alone (the test says so)
    core.lower_mgpu_module = _named_first(lower)
    return True
