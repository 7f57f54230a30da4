"""Reading compiled programs: what XLA will actually run for a decode step.

A jitted function's ``.lower(...).compile().as_text()`` is the optimised HLO module. These
helpers count what matters for decode speed in it: copies of cache-sized buffers (each one is
a full extra read and write of the KV cache per step) and the collectives of a
tensor-parallel step. The tests and the probe use them; a learner can too.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

from inference_lab import engine, parallel
from inference_lab.kv_cache import KVCache

# One HLO instruction with an array result: "%name = f32[2,64,4,32]{3,2,1,0} copy(%p), ..."
_HLO_ARRAY_OP = re.compile(r"=\s*([a-z0-9]+)\[([0-9,]*)\](?:\{[^}]*\})?\s+([a-z][a-z\-]*)\(")
_HLO_ALL_REDUCE = re.compile(r"\sall-reduce(?:-start)?\(")


def _top_level_lines(hlo_text: str):
    """Instruction lines of a compiled HLO module's text, skipping the bodies of fusions
    (what runs is the fusion itself, listed in its caller)."""
    in_fusion = False
    for line in hlo_text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):  # a computation starts
            name = line.split()[1] if line.startswith("ENTRY") else line.split()[0]
            in_fusion = "fused" in name or "fusion" in name
        elif not in_fusion:
            yield line


def hlo_ops(hlo_text: str):
    """(opcode, output dtype, output element count, line) for every array-valued top-level
    instruction of ``jitted.lower(...).compile().as_text()``."""
    out = []
    for line in _top_level_lines(hlo_text):
        m = _HLO_ARRAY_OP.search(line)
        if m:
            dims = [int(d) for d in m.group(2).split(",") if d]
            out.append((m.group(3), m.group(1), int(np.prod(dims)) if dims else 1, line.strip()))
    return out


def count_cache_copies(hlo_text: str, cache_elements: int, *, relayouts: bool = False) -> int:
    """How many ``copy`` instructions in a compiled program move a buffer at least as large as
    one layer's K (or V) cache. A decode step that updates its donated cache in place has none;
    each one found is a full cache read + write per step (the KV-cache trap described in
    docs/architecture.md).

    ``relayouts=True`` also counts fusions whose root is a copy (XLA names them
    ``transpose_copy_fusion``, ``bitcast_copy_fusion``...): a cache-sized one is a kernel
    reading the cache in another layout, which also costs a full read + write per step.
    """
    n = 0
    for op, _, size, line in hlo_ops(hlo_text):
        if size < cache_elements:
            continue
        name = line.split("=")[0]
        if op in ("copy", "copy-start") or (relayouts and op == "fusion" and "copy" in name):
            n += 1
    return n


def count_all_reduces(hlo_text: str) -> int:
    """All-reduce instructions in a compiled program (an async start/done pair counts once)."""
    return sum(1 for line in _top_level_lines(hlo_text) if _HLO_ALL_REDUCE.search(line))


def compiled_decode_text(model, cache: KVCache, *, steps: int | None = None) -> str:
    """The compiled HLO text of :func:`decode_step` (``steps=None``) or of the jitted
    :func:`decode_loop` of ``steps`` steps, for these shapes. Nothing runs; the cache is
    only used for its shapes (it is not donated)."""
    engine._check_cache(model, cache, "compiled_decode_text()")
    b = cache.batch
    mesh = model.mesh
    ks, vs = parallel.place_cache(mesh, cache._k, cache._v)   # shapes/shardings as a real call
    args = (model.params(), jnp.zeros((b,), jnp.int32), cache._lengths, ks, vs)
    if steps is None:
        lowered = engine._decode_jit.lower(*args, cfg=model.cfg, mode=model.kernels, mesh=mesh)
    else:
        lowered = engine._decode_loop_jit.lower(*args, jax.random.key(0), None, steps=int(steps),
                                                top_k=None, cfg=model.cfg, mode=model.kernels, mesh=mesh)
    return lowered.compile().as_text()
