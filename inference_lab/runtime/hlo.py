"""Reading compiled programs: what XLA will actually run for a decode step.

A jitted function's ``.lower(...).compile().as_text()`` is the optimised HLO module. These
helpers count what matters for decode speed in it: copies of cache-sized buffers (each one is
a full extra read and write of the KV cache per step) and the collectives of a
tensor-parallel step. The tests and the probe use them; a learner can too.
"""

from __future__ import annotations

import re

import numpy as np

from inference_lab.model.kv_cache import KVCache
from inference_lab.runtime import generation

# One HLO instruction: "%name = <type> opcode(operands), attributes". The type is an array
# ("f32[2,64,4,32]{3,2,1,0}") or a tuple of them ("(f32[2,512]{1,0}, s32[2]{0})").
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\([^=]*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)"
                          r"\s+([a-z][a-z\-]*)\(")
_ARRAY = re.compile(r"([a-z0-9]+)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLED = re.compile(r"(?:body|condition)=%?([\w.\-]+)|branch_computations=\{([^}]*)\}")
_CALL_TO_APPLY = re.compile(r"\scall\(.*to_apply=%?([\w.\-]+)")   # only a `call` runs its to_apply as code;
                                                                    # reducers of reduce/all-reduce/sort are inside those ops
_INDEX_COMMENT = re.compile(r"/\*index=\d+\*/")                   # XLA's markers inside long tuple types
_FUSION_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_ALIAS = re.compile(r"\{[0-9,]*\}:\s*\((\d+),")
# Instructions that launch no device work of their own.
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id",
         "replica-id", "opt-barrier", "while", "call", "conditional", "copy-done", "all-reduce-done"}
# Ways to write part of a buffer in place: a cache-sized output made by one of these is the cache
# itself, updated, not a new copy of it.
_IN_PLACE = {"dynamic-update-slice", "scatter"}


def _computations(hlo_text: str) -> tuple[dict, str | None]:
    """{computation name: its instruction lines} and the name of the ENTRY computation."""
    comps, entry, current = {}, None, None
    for line in hlo_text.splitlines():
        if line and not line[0].isspace():
            m = _HEADER.match(line)
            if m and "=" not in line.split("(")[0]:
                current = m.group(2)
                comps[current] = []
                if m.group(1):
                    entry = current
                continue
        if current is not None and line.strip() and line.strip() != "}":
            comps[current].append(line)
    return comps, entry


def _top_level_lines(hlo_text: str):
    """Instruction lines that run as their own kernels or loops: the ENTRY computation and the
    bodies of its loops, calls and branches, but never the insides of fusions."""
    comps, entry = _computations(hlo_text)
    todo, seen = [entry] if entry else [], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        for line in comps[name]:
            line = _INDEX_COMMENT.sub("", line)
            yield line
            for m in _CALLED.finditer(line):
                todo.extend(n.strip().lstrip("%") for n in (m.group(1) or m.group(2)).split(","))
            todo.extend(_CALL_TO_APPLY.findall(line))


def _elements(type_text: str) -> int:
    """Largest element count among the arrays of an instruction's result type."""
    best = 0
    for _, dims in _ARRAY.findall(type_text):
        best = max(best, int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1)
    return best


def hlo_ops(hlo_text: str):
    """(opcode, result type, largest output element count, line) for every top-level
    instruction of ``jitted.lower(...).compile().as_text()``."""
    out = []
    for line in _top_level_lines(hlo_text):
        m = _INSTRUCTION.match(line)
        if m:
            out.append((m.group(3), m.group(2), _elements(m.group(2)), line.strip()))
    return out


def _in_place_fusions(hlo_text: str) -> set:
    """Names of the computations that update one of their inputs in place: the ROOT is a
    dynamic-update-slice or a scatter of a parameter that nothing else in the computation reads.

    A fusion that also reads the buffer it updates (``x.at[0].add(v)`` is a slice of ``x``, an
    add, and an update of ``x``) is not emitted in place by XLA:GPU (its in-place rule admits no
    other reader, ``CanEmitFusedDynamicUpdateSliceInPlaceForGpu``): it writes the whole array, a
    full read and write of it every time. Counted as such here on any backend, since the same
    program structure reaches every backend's fusion passes."""
    found = set()
    for name, lines in _computations(hlo_text)[0].items():
        root = next((line for line in lines if line.strip().startswith("ROOT")), None)
        m = root and _INSTRUCTION.match(_INDEX_COMMENT.sub("", root))
        if not m or m.group(3) not in _IN_PLACE:
            continue
        target = re.search(r"\(\s*(%?[\w.\-]+)", root[m.end() - 1:])
        if not target:
            continue
        use = re.compile(re.escape(target.group(1)) + r"(?![\w.\-])")
        defined = any(re.match(r"\s*" + re.escape(target.group(1)) + r"\s*=.*\sparameter\(", line) for line in lines)
        if defined and sum(len(use.findall(line)) for line in lines) == 2:   # its definition and the update
            found.add(name)
    return found


def count_cache_copies(hlo_text: str, cache_elements: int) -> int:
    """How many instructions of a compiled program write a new buffer at least as large as one
    layer's K (or V) cache. A decode step that updates its donated cache in place has none;
    each one found is a full cache read + write per step (the KV-cache trap described in
    docs/architecture.md): a ``copy``, a transpose, or any fusion that produces a cache-sized
    result other than an in-place update (a fusion that updates one of its inputs and reads it
    nowhere else, :func:`_in_place_fusions`) or a kernel whose output is aliased to its input.
    Whatever XLA names the fusion, on any backend.
    """
    in_place = _in_place_fusions(hlo_text)
    n = 0
    for op, _, size, line in hlo_ops(hlo_text):
        if size < cache_elements or op in _FREE or op in _IN_PLACE:
            continue
        if op == "custom-call" and "output_to_operand_aliasing" in line:
            continue  # an in-place kernel (e.g. decode attention writing the new K/V)
        if op == "fusion":
            called = _FUSION_CALLS.search(line)
            if called and called.group(1) in in_place:
                continue
        n += 1
    return n


def count_kernels(hlo_text: str) -> int:
    """Instructions of a compiled program that each launch device work (fusions, custom calls
    such as Pallas kernels, library calls, copies, collectives...), loop bodies included once."""
    return sum(1 for op, *_ in hlo_ops(hlo_text) if op not in _FREE)


def count_pallas_calls(hlo_text: str) -> int:
    """Triton-tier Pallas custom calls written in a program lowered or compiled for an NVIDIA GPU
    (each written call once: :func:`gpu_kernel_launches` follows nested functions)."""
    return hlo_text.count("__gpu$xla.gpu.triton")


# A function of a lowered (StableHLO) module: "func.func public @main(" ... up to its closing "  }".
_FUNC = re.compile(r"^  func\.func (?:public |private )?@([\w.$\-]+)\(")
_FUNC_CALL = re.compile(r"\bcall @([\w.$\-]+)\(")
# What makes two Pallas kernels the same compiled kernel: a Mosaic GPU module's hash (jaxlib compiles
# once per hash), a Triton kernel's IR with its warps and stages (its grid is a launch parameter).
_MOSAIC_KERNEL = re.compile(r'custom_call @mosaic_gpu\w*\(.*?kernel_hash = "((?:[^"\\]|\\.)*)"')
_TRITON_KERNEL = re.compile(r'custom_call @__gpu\$xla\.gpu\.triton\(.*? ir = "((?:[^"\\]|\\.)*)"'
                            r'(?=.*?num_stages = (\d+))(?=.*?num_warps = (\d+))')


def gpu_kernel_launches(lowered_text: str) -> dict:
    """``{(tier, identity): launches}`` of the Pallas kernels in a program lowered for an NVIDIA GPU
    (``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",)).as_text()``; StableHLO).

    ``tier`` is ``"mosaic"`` or ``"triton"``; ``identity`` what decides whether two launches are one
    compiled kernel (a Mosaic GPU module's ``kernel_hash``, a Triton kernel's IR, warps and stages).
    A kernel written once in a function that the program calls 16 times counts 16 launches, so
    ``sum(...values())`` is the launches of one run of the program and ``len(...)`` the kernels a
    GPU compiles for it. Loop bodies count once (a decode loop's step)."""
    bodies = _lowered_functions(lowered_text)
    launches: dict = {}

    def count(name: str, times: int, path: tuple) -> None:
        if name in path:
            raise ValueError(f"{name} calls itself: not a lowered jax program")
        for line in bodies.get(name, ()):
            found = ([("mosaic", m.group(1)) for m in _MOSAIC_KERNEL.finditer(line)]
                     + [("triton", m.groups()) for m in _TRITON_KERNEL.finditer(line)])
            for key in found:
                launches[key] = launches.get(key, 0) + times
            for callee in _FUNC_CALL.findall(line):
                count(callee, times, path + (name,))

    if "main" not in bodies:
        raise ValueError("no @main function: pass the text of a lowered program (.lower(...).as_text())")
    count("main", 1, ())
    return launches


def _lowered_functions(lowered_text: str) -> dict:
    """{function name: its body's lines} of a lowered (StableHLO) module."""
    bodies, current = {}, None
    for line in lowered_text.splitlines():
        m = _FUNC.match(line)
        if m:
            current = bodies.setdefault(m.group(1), [])
        elif line.startswith("  }"):
            current = None
        elif current is not None:
            current.append(line)
    return bodies


# One top-level operation of a lowered function: its results ("%12" or "%12:2") and its op name
# (stablehlo.reshape, "stablehlo.scatter", stablehlo.custom_call @target, call @fn, return).
_LOWERED_OP = re.compile(r'^    (?:(%[\w]+)(?::\d+)? = )?"?([\w.]+)"?(?: @([\w.$\-]+))?')
_VALUE = re.compile(r"%[\w]+")
# What a cache may go through without being copied: a view, an update in place (as the operand
# updated), a kernel that reads it, the function's return.
_CACHE_VIEWS = {"stablehlo.reshape", "stablehlo.bitcast_convert"}
_CACHE_UPDATES = {"stablehlo.scatter", "stablehlo.dynamic_update_slice"}


def lowered_cache_copies(lowered_text: str, cache_type: str) -> dict:
    """``{operation: uses}`` of the cache arguments of a lowered program's ``@main`` (those of
    type ``cache_type``, such as ``"tensor<2049x16x8x64xbf16>"``) by anything that makes a new
    array out of them: a gather of a request's rows, a slice, a transpose, a convert, a call into
    a function. Followed through views (reshape) and in-place updates (scatter, dynamic update
    slice, as the operand updated), whose results are the cache again; a Pallas kernel reading it
    (a custom call) and the return are no copy. Empty for a step that reads and writes its cache
    in place, on the program as lowered (before XLA's passes: a copy XLA adds to keep a donated
    buffer alive shows in the compiled program, :func:`count_cache_copies`)."""
    main = _lowered_functions(lowered_text).get("main")
    if main is None:
        raise ValueError("no @main function: pass the text of a lowered program (.lower(...).as_text())")
    header = next(line for line in lowered_text.splitlines() if _FUNC.match(line) and "@main(" in line)
    cache = set(re.findall(r"(%arg\d+): " + re.escape(cache_type), header))
    if not cache:
        raise ValueError(f"@main takes no argument of type {cache_type}")
    copies: dict = {}
    for line in main:
        m = _LOWERED_OP.match(line)
        if not m:
            continue                                          # inside a region (a scatter's update)
        result, op, target = m.groups()
        operands = line[m.end():]
        for end in (" {", " <{", " : ", ") : "):
            if end in operands:
                operands = operands[:operands.index(end) + 1]
        used = [v for v in _VALUE.findall(operands) if v in cache]
        if not used:
            continue
        if op in _CACHE_VIEWS or (op in _CACHE_UPDATES and _VALUE.findall(operands)[0] in cache):
            cache.add(result)
        elif op not in ("stablehlo.custom_call", "return", "func.return", "stablehlo.return"):
            name = f"{op} @{target}" if target else op
            copies[name] = copies.get(name, 0) + len(used)
    return copies


def aliased_parameters(hlo_text: str) -> set:
    """Numbers of the entry parameters whose buffers a compiled program reuses for an output
    (the module's ``input_output_alias``): what donation achieved, on any backend."""
    header = hlo_text.split("\n", 1)[0]
    if "input_output_alias={" not in header:
        return set()
    section = header.split("input_output_alias={", 1)[1].split(" }", 1)[0]
    return {int(x) for x in _ALIAS.findall(section)}


def parameters_shaped(hlo_text: str, shape) -> set:
    """Numbers of the entry parameters whose array has exactly ``shape``."""
    comps, entry = _computations(hlo_text)
    want = ",".join(str(int(d)) for d in shape)
    found = set()
    for line in comps.get(entry, []):
        m = re.search(r"=\s*[a-z0-9]+\[([0-9,]*)\](?:\{[^}]*\})?\s+parameter\((\d+)\)", line)
        if m and m.group(1) == want:
            found.add(int(m.group(2)))
    return found


def count_all_reduces(hlo_text: str) -> int:
    """All-reduce instructions in a compiled program (an async start/done pair counts once)."""
    return sum(1 for op, *_ in hlo_ops(hlo_text) if op in ("all-reduce", "all-reduce-start"))


def compiled_decode_text(model, cache: KVCache, *, steps: int | None = None) -> str:
    """The compiled HLO text of :func:`~inference_lab.runtime.generation.decode_step`
    (``steps=None``) or of the jitted ``decode_loop`` of ``steps`` steps, for these shapes.
    Nothing runs; the cache is only used for its shapes (it is not donated)."""
    return generation.lower_decode(model, cache, steps=steps).compile().as_text()
