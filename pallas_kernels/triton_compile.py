"""Compile this repository's Pallas kernels for real NVIDIA GPUs on a machine without one.

    python -m pallas_kernels.triton_compile [--target sm_90|sm_80|all] [--json PATH] [--markdown]

(the kernel benchmark's GPU shapes; every kernel the model launches: ``make triton-report``,
i.e. ``python -m inference_lab.triton_report``, which builds on this module).

On an NVIDIA GPU, ``pallas_call`` lowers to Triton IR (TTIR) that XLA hands to its own copy
of Triton. Here the same TTIR is produced on a CPU and given to the ``triton`` package
(``pip install triton``: the compiler needs no GPU), which takes it through its NVIDIA
pipeline to PTX and a cubin. That reports what only a compile can: the shared memory each
program needs, its registers and spills, and whether it fits the device at all.

How (each step is public jax/Triton behaviour, except the two private jax names marked below):

1. **Capture** (:func:`capture_kernels`). ``fn`` is traced and lowered for CUDA,
   ``jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))``, under an *abstract*
   GPU (an ``AbstractMesh`` over an ``AbstractDevice``; ``jax._src.mesh``, private: there is
   no public export yet) with the kernels' ``"pallas"`` mode allowed. Nothing runs and
   nothing is allocated, so ``jax.ShapeDtypeStruct`` arguments are enough. Every Pallas
   kernel becomes a ``stablehlo.custom_call @__gpu$xla.gpu.triton`` whose backend config
   carries the kernel's name, ``num_warps``, ``num_stages``, the grid (``grid_x/y/z``) and
   the TTIR module as MLIR bytecode (``ir``): exactly what XLA compiles on a GPU. The
   bytecode is parsed with jaxlib's Triton dialect (``jax._src.lib.triton``, private) and
   printed as TTIR text.
2. **Compile** (:func:`compile_kernel`). ``triton.compile(path.ttir, target=GPUTarget("cuda",
   90 or 80, 32), options={"num_warps", "num_stages"})`` runs Triton's passes (layouts,
   software pipelining over ``num_stages`` shared-memory buffers) and writes PTX and a cubin;
   ``metadata.shared`` is the dynamic shared memory a program needs. Registers and spills
   come from running the ``ptxas`` that Triton itself uses for that architecture, with
   Triton's flags and ``-v``, on the PTX (about 1 s per kernel in all).
3. **Check** against the device: shared memory per block and registers per block (limits in
   :data:`TARGETS`, with sources), spills, and an estimate of resident programs per SM.

What this proves and what it does not: a kernel that compiles here with Triton 3.9 for
``sm_90a``/``sm_80`` is valid TTIR that a current Triton takes through the full NVIDIA
pipeline, and its resource use is what that Triton produces. XLA compiles the same TTIR with
*its own bundled Triton* (:func:`versions` names both) and its own ``ptxas``, so figures can
differ a little and a version gap is reported as a warning. Speed and numerics still need a GPU.

``triton`` is imported lazily: ``pallas_kernels`` imports fine without it, and the functions
that need it raise :class:`TritonUnavailable` with what to install.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import warnings
from typing import Callable, Iterable, Sequence

TRITON_PIN = "3.9.0"
CUSTOM_CALL_TARGET = "__gpu$xla.gpu.triton"   # the custom call Pallas' Triton lowering emits


# ----------------------------------------------------------------------------- targets
@dataclasses.dataclass(frozen=True)
class Target:
    """One GPU architecture to compile for, with the limits a launch must respect.

    Limits per compute capability from NVIDIA's CUDA C++ Programming Guide, table
    "Technical Specifications per Compute Capability" (8.0 and 9.0): shared memory per SM /
    per block (opt-in maximum) 164 KB / 163 KB on 8.0 and 228 KB / 227 KB on 9.0; 64 K 32-bit
    registers per SM and at most 255 per thread; 64 resident warps and 32 resident blocks per
    SM. The guide also says 1 KB of shared memory per block is reserved by the system
    (counted in the occupancy estimate). SM counts: H200 (and H100 SXM) 132, A100 108
    (NVIDIA's H100/H200 and A100 datasheets).
    """

    name: str                  # "sm_90"
    capability: int            # 90
    device_kind: str           # what the abstract device is called when lowering
    gpu: str                   # the GPU the SM count is for
    sms: int
    shared_per_block: int      # bytes a block may use (opt-in maximum)
    shared_per_sm: int
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    reserved_shared_per_block: int = 1024


TARGETS: dict[str, Target] = {
    "sm_90": Target("sm_90", 90, "NVIDIA H200", "H200", 132, 227 * 1024, 228 * 1024),
    "sm_80": Target("sm_80", 80, "NVIDIA A100-SXM4-80GB", "A100", 108, 163 * 1024, 164 * 1024),
}
NEAR_LIMIT = 0.9   # shared memory above this fraction of the per-block limit is flagged


def get_target(target: str | Target) -> Target:
    if isinstance(target, Target):
        return target
    if target not in TARGETS:
        raise ValueError(f"target={target!r} is unknown; use one of {', '.join(TARGETS)}")
    return TARGETS[target]


# ----------------------------------------------------------------------------- versions
class TritonUnavailable(ImportError):
    """The ``triton`` package (the compiler; no GPU needed) is not installed."""


def _require_triton():
    try:
        import triton
    except ImportError as e:
        raise TritonUnavailable(
            "compiling Pallas kernels on a CPU needs the `triton` package, which is not installed "
            f"here ({e}); install it with `pip install triton=={TRITON_PIN}` (Linux wheels, no GPU "
            "needed), or run `make setup`, whose dev extra includes it"
        ) from None
    return triton


def triton_problem() -> str | None:
    """None when the ``triton`` package here is the series these checks are written for
    (``TRITON_PIN``'s major.minor), otherwise why not: absent, or another version (the GPU image
    carries torch's Triton, whose parser and ptxas may not take this jaxlib's Triton IR)."""
    try:
        version = _require_triton().__version__
    except TritonUnavailable as e:
        return str(e)
    if version.split(".")[:2] != TRITON_PIN.split(".")[:2]:
        return (f"triton {version} is installed; these checks are written for triton "
                f"{TRITON_PIN} (pip install triton=={TRITON_PIN}, or make setup)")
    return None


# The Triton that XLA bundles is built from a commit of Triton's main branch, not a release, and
# carries no version string. For jaxlib 0.11.2 it was placed by comparing the names of the
# Triton passes compiled into the CUDA 12 plugin (jax-cuda12-pjrt 0.11.2) with those of the
# triton 3.6.0, 3.7.1, 3.8.0 and 3.9.0 wheels: XLA's has three NVIDIA passes that 3.8.0 lacks
# and 3.9.0 has (hoisting mbarrier lifetimes, normalising warp-specialised while loops, CLC
# lowering), and still has `triton-nvidia-gpu-plan-cta`, which 3.9.0 dropped, while lacking
# five passes 3.9.0 added (CGA layouts, membar, CTA locality, TMEM wait insertion, to-CLC).
XLA_TRITON = {
    "0.11.2": "a Triton main-branch commit between 3.8.0 and 3.9.0",
}


def versions() -> dict:
    """Versions that matter for the compile: jax, jaxlib, the ``triton`` package, XLA's Triton."""
    import jax
    import jaxlib

    try:
        triton_version = _require_triton().__version__
    except TritonUnavailable:
        triton_version = None
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "triton": triton_version,
        "xla_triton": XLA_TRITON.get(jaxlib.__version__, f"unknown for jaxlib {jaxlib.__version__}"),
    }


def version_warning(v: dict | None = None) -> str | None:
    """A warning when the Triton used here is not the one XLA compiles with on a GPU (always,
    today: XLA bundles its own)."""
    v = versions() if v is None else v
    if v["triton"] is None:
        return None
    if v["xla_triton"] == v["triton"]:
        return None
    return (f"WARNING: compiled with the triton package {v['triton']}; on a GPU, XLA (jaxlib "
            f"{v['jaxlib']}) compiles these kernels with its own bundled Triton, "
            f"{v['xla_triton']}, and its own ptxas: shared memory and registers there may differ. "
            "Strong evidence, not proof.")


# ----------------------------------------------------------------------------- capture
@dataclasses.dataclass(frozen=True)
class Kernel:
    """One Pallas kernel as XLA would receive it: TTIR text and launch parameters."""

    name: str                      # the pallas_call's name ("matmul", ...)
    ttir: str
    num_warps: int
    num_stages: int
    grid: tuple[int, int, int]     # (x, y, z) programs
    operands: tuple[str, ...]      # e.g. "64x2048xbf16"
    results: tuple[str, ...]
    context: str = ""              # where it was captured (set by the caller)

    @property
    def programs(self) -> int:
        return math.prod(self.grid)

    @property
    def key(self) -> str:
        """Identity for de-duplication: same TTIR, warps, stages and grid compile the same."""
        h = hashlib.sha256(self.ttir.encode())
        h.update(f"|{self.num_warps}|{self.num_stages}|{self.grid}".encode())
        return h.hexdigest()[:16]

    @property
    def shapes(self) -> str:
        """The operands, repeats folded: ``64x4096x8x128xbf16 x2`` for K and V."""
        parts: list[list] = []
        for o in self.operands:
            if parts and parts[-1][0] == o:
                parts[-1][1] += 1
            else:
                parts.append([o, 1])
        return ", ".join(o if n == 1 else f"{o} x{n}" for o, n in parts)


@contextlib.contextmanager
def abstract_gpu(target: str | Target = "sm_90"):
    """Lower for an abstract NVIDIA GPU of ``target``'s kind on a machine without one.

    Inside: an abstract one-device mesh whose device is that GPU (what Pallas' Triton
    lowering asks for the compute capability), and the kernels' ``"pallas"`` mode allowed
    (``"auto"`` resolves to it too), since only lowering happens: nothing can run.
    """
    import jax
    from jax._src import mesh as mesh_lib  # private: AbstractDevice has no public export yet

    from pallas_kernels import mode as mode_mod

    t = get_target(target)
    if not hasattr(mode_mod, "_gpu_support"):
        raise RuntimeError("pallas_kernels.mode no longer has _gpu_support(), which abstract_gpu() "
                           "overrides to allow mode='pallas' while lowering; update triton_compile.py")
    device = mesh_lib.AbstractDevice(device_kind=t.device_kind, num_cores=None, platform="cuda")
    mesh = mesh_lib.AbstractMesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,),
                                 abstract_device=device)
    saved = mode_mod._gpu_support
    mode_mod._gpu_support = lambda: (True, f"abstract {t.device_kind} (lowering only, nothing runs)")
    try:
        with jax.sharding.use_abstract_mesh(mesh), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Triton backend is deprecated.*")
            yield t
    finally:
        mode_mod._gpu_support = saved


def _walk(op):
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                yield child.operation
                yield from _walk(child.operation)


def _ttir_text(bytecode: bytes) -> str:
    from jax._src.lib.mlir import ir
    from jax._src.lib.triton import dialect as tt_dialect  # private: jaxlib's Triton dialect

    ctx = ir.Context()
    tt_dialect.register_dialect(ctx)
    ctx.load_all_available_dialects()
    with ctx:
        return ir.Module.parse(bytecode).operation.get_asm()


def _type_str(t) -> str:
    s = str(t)
    m = re.fullmatch(r"tensor<(.*)>", s)
    return m.group(1) if m else s


def kernels_in_module(module, context: str = "") -> list[Kernel]:
    """Every Triton custom call in a lowered StableHLO ``module`` (in program order)."""
    from jax._src.lib.mlir import ir

    found = []
    for op in _walk(module.operation):
        if op.name != "stablehlo.custom_call":
            continue
        attrs = op.attributes
        if ir.StringAttr(attrs["call_target_name"]).value != CUSTOM_CALL_TARGET:
            continue
        cfg = ir.DictAttr(attrs["mhlo.backend_config"])
        num = lambda k: ir.IntegerAttr(cfg[k]).value  # noqa: E731
        found.append(Kernel(
            name=ir.StringAttr(cfg["name"]).value,
            ttir=_ttir_text(ir.StringAttr(cfg["ir"]).value_bytes),
            num_warps=num("num_warps"), num_stages=num("num_stages"),
            grid=(num("grid_x"), num("grid_y"), num("grid_z")),
            operands=tuple(_type_str(v.type) for v in op.operands),
            results=tuple(_type_str(r.type) for r in op.results),
            context=context,
        ))
    return found


def capture_kernels(fn: Callable, *args, target: str | Target = "sm_90", context: str = "",
                    **kwargs) -> list[Kernel]:
    """The Pallas kernels ``fn(*args, **kwargs)`` would launch on an NVIDIA GPU of ``target``.

    ``args`` may be arrays or ``jax.ShapeDtypeStruct`` pytrees (nothing is allocated or run);
    ``kwargs`` are bound as static Python values. One entry per kernel call site in the
    lowered program, in program order (a kernel inside a loop body appears once).
    """
    import jax

    bound = functools.partial(fn, **kwargs) if kwargs else fn
    with abstract_gpu(target):
        lowered = jax.jit(bound).trace(*args).lower(lowering_platforms=("cuda",))
    return kernels_in_module(lowered.compiler_ir("stablehlo"), context)


def unique(kernels: Iterable[Kernel]) -> list[tuple[Kernel, list[Kernel]]]:
    """Group identical kernels: ``[(first, all occurrences)]`` in order of first appearance."""
    groups: dict[str, list[Kernel]] = {}
    for k in kernels:
        groups.setdefault(k.key, []).append(k)
    return [(ks[0], ks) for ks in groups.values()]


# ----------------------------------------------------------------------------- compile
class CompileError(RuntimeError):
    """Triton (or ptxas) rejected a kernel."""


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What compiling one kernel for one target gave, and how it fits the device."""

    kernel: Kernel
    target: Target
    shared: int                 # bytes of (dynamic) shared memory per program
    registers: int              # per thread
    spill_stores: int           # bytes per thread
    spill_loads: int
    stack: int                  # bytes of stack frame per thread
    ptx_version: str
    ptx_target: str             # the PTX's .target, e.g. sm_90a
    ptxas: str                  # the ptxas that assembled it
    triton_version: str
    errors: tuple[str, ...]     # limits broken: the kernel cannot launch on this device
    warnings: tuple[str, ...]   # spills, near a limit, fewer programs than SMs
    flags: tuple[str, ...] = () # the warnings in a word or two, for tables

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def threads(self) -> int:
        return 32 * self.kernel.num_warps

    @property
    def blocks_per_sm(self) -> int:
        """Resident programs per SM, estimated the way NVIDIA's occupancy calculator does
        (registers allocated per warp in units of 256; 1 KB of shared memory reserved per block)."""
        t, warps = self.target, self.kernel.num_warps
        regs_per_warp = -(-max(self.registers, 1) * 32 // 256) * 256
        by_regs = (t.regs_per_sm // regs_per_warp) // warps
        by_smem = t.shared_per_sm // (self.shared + t.reserved_shared_per_block)
        return max(0, min(by_regs, by_smem, t.max_warps_per_sm // warps, t.max_blocks_per_sm))

    @property
    def waves(self) -> float:
        """Programs / (SMs x resident programs per SM): below 1 the GPU is not filled."""
        per_wave = self.target.sms * max(self.blocks_per_sm, 1)
        return self.kernel.programs / per_wave

    def as_dict(self) -> dict:
        k = self.kernel
        return {
            "kernel": k.name, "context": k.context, "operands": list(k.operands),
            "results": list(k.results), "target": self.target.name,
            "grid": list(k.grid), "programs": k.programs, "num_warps": k.num_warps,
            "num_stages": k.num_stages, "shared_bytes": self.shared, "registers": self.registers,
            "spill_stores": self.spill_stores, "spill_loads": self.spill_loads, "stack": self.stack,
            "blocks_per_sm": self.blocks_per_sm, "waves": round(self.waves, 3),
            "ptx_version": self.ptx_version, "ptx_target": self.ptx_target, "ptxas": self.ptxas, "triton": self.triton_version,
            "ok": self.ok, "errors": list(self.errors), "warnings": list(self.warnings),
            "key": k.key,
        }


def _ptxas_path_and_arch(capability: int) -> tuple[str, str]:
    """The ptxas Triton uses for this architecture (3.9: the CUDA 13 one for sm_90 and up, the
    CUDA 12.9 one below, which rejects the newer PTX), and Triton's ``--gpu-name``."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

        return get_ptxas(capability).path, sm_arch_from_capability(capability)
    except ImportError:  # older/newer layout: the wheel's binaries by name
        import triton

        bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
        name = "ptxas-blackwell" if capability >= 90 else "ptxas"
        return os.path.join(bin_dir, name), f"sm_{capability}{'a' if capability >= 90 else ''}"


def _ptxas_usage(ptx: str, capability: int) -> dict:
    """Registers, spills and stack per thread, from ``ptxas -v`` with Triton's own flags."""
    ptxas, arch = _ptxas_path_and_arch(capability)
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [ptxas, "-lineinfo", "-v", "--regAllocOptLevel=2", f"--gpu-name={arch}", src,
               "-o", os.path.join(d, "k.cubin")]
        run = subprocess.run(cmd, capture_output=True, text=True)
    log = run.stdout + run.stderr
    if run.returncode:
        raise CompileError(f"ptxas ({os.path.basename(ptxas)}) failed: {log.strip()[-800:]}")
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if not regs or not spill:
        raise CompileError(f"could not read registers/spills from ptxas -v output: {log.strip()[-400:]}")
    return {"registers": int(regs.group(1)), "stack": int(spill.group(1)),
            "spill_stores": int(spill.group(2)), "spill_loads": int(spill.group(3)),
            "ptxas": _ptxas_release(ptxas)}


@functools.lru_cache(maxsize=None)
def _ptxas_release(ptxas: str) -> str:
    out = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
    release = re.search(r"release ([\d.]+)", out)
    return f"{os.path.basename(ptxas)} {release.group(1) if release else '?'}"


def _check_limits(k: Kernel, t: Target, shared: int, regs: int, spill_st: int, spill_ld: int):
    """(errors, warnings, short flags): errors mean the kernel cannot launch on ``t``."""
    errors, notes, flags = [], [], []
    if shared > t.shared_per_block:
        errors.append(f"shared memory {shared / 1024:.0f} KB > {t.shared_per_block // 1024} KB per block on {t.name}")
    elif shared > NEAR_LIMIT * t.shared_per_block:
        notes.append(f"shared memory {shared / 1024:.0f} KB is within 10% of the {t.shared_per_block // 1024} KB limit")
        flags.append("smem near limit")
    threads = 32 * k.num_warps
    if threads > 1024:
        errors.append(f"{threads} threads per block > 1024")
    if regs * threads > t.regs_per_sm:
        errors.append(f"{regs} registers x {threads} threads > {t.regs_per_sm} registers per SM")
    if regs >= t.max_regs_per_thread:
        notes.append(f"{regs} registers per thread: at the {t.max_regs_per_thread} limit")
        flags.append("regs at limit")
    if spill_st or spill_ld:
        notes.append(f"spills {spill_st} B stored / {spill_ld} B loaded per thread (local memory)")
        flags.append("SPILLS")
    if k.programs < t.sms:
        notes.append(f"{k.programs} programs for {t.sms} SMs: the grid does not fill the GPU")
        flags.append("grid < SMs")
    return tuple(errors), tuple(notes), tuple(flags)


def compile_kernel(kernel: Kernel, target: str | Target = "sm_90") -> Compiled:
    """Compile ``kernel`` with Triton for ``target`` ("sm_90" or "sm_80") and check its limits.

    Raises :class:`CompileError` if Triton or ptxas rejects it, :class:`TritonUnavailable`
    without the ``triton`` package. Results are cached by Triton (``~/.triton/cache`` or
    ``TRITON_CACHE_DIR``); ptxas runs again each call (fast).
    """
    triton = _require_triton()
    from triton.backends.compiler import GPUTarget

    t = get_target(target)
    options = {"num_warps": kernel.num_warps, "num_stages": kernel.num_stages,
               "enable_fp_fusion": True}   # Triton's default, said explicitly (3.9 warns otherwise)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"{kernel.name}.ttir")
        with open(path, "w") as f:
            f.write(kernel.ttir)
        try:
            # Triton prints a long reproducer on a ptxas failure; keep it out of reports.
            with contextlib.redirect_stdout(sys.stderr):
                compiled = triton.compile(path, target=GPUTarget("cuda", t.capability, 32), options=options)
        except Exception as e:  # noqa: BLE001 - any failure inside Triton is a compile error
            msg = str(e).strip().splitlines()
            raise CompileError(f"{kernel.name} ({kernel.context or kernel.shapes}) failed to compile "
                               f"for {t.name}: {type(e).__name__}: {' '.join(msg[:3])[:600]}") from e
    ptx = compiled.asm["ptx"]
    usage = _ptxas_usage(ptx, t.capability)
    shared = int(compiled.metadata.shared)
    version = re.search(r"^\s*\.version\s+([\d.]+)", ptx, re.MULTILINE)
    arch = re.search(r"^\s*\.target\s+(\w+)", ptx, re.MULTILINE)
    errors, notes, flags = _check_limits(kernel, t, shared, usage["registers"],
                                         usage["spill_stores"], usage["spill_loads"])
    return Compiled(kernel=kernel, target=t, shared=shared, registers=usage["registers"],
                    spill_stores=usage["spill_stores"], spill_loads=usage["spill_loads"],
                    stack=usage["stack"], ptx_version=version.group(1) if version else "?",
                    ptx_target=arch.group(1) if arch else "?",
                    ptxas=usage["ptxas"], triton_version=triton.__version__,
                    errors=errors, warnings=notes, flags=flags)


# ----------------------------------------------------------------------------- report
@dataclasses.dataclass(frozen=True)
class Row:
    """One line of a report: a unique kernel, where it is used, and its compile (or error)."""

    kernel: Kernel
    contexts: tuple[str, ...]      # every place it was captured
    calls: int                     # call sites in the lowered programs
    result: Compiled | None
    error: str | None = None

    def as_dict(self) -> dict:
        out = {"contexts": list(self.contexts), "calls": self.calls}
        if self.result is not None:
            out.update(self.result.as_dict())
        else:
            k = self.kernel
            out.update({"kernel": k.name, "operands": list(k.operands), "grid": list(k.grid),
                        "programs": k.programs, "num_warps": k.num_warps,
                        "num_stages": k.num_stages, "ok": False, "error": self.error})
        return out


def compile_all(kernels: Iterable[Kernel], target: str | Target = "sm_90",
                progress: Callable[[str], None] | None = None) -> list[Row]:
    """Compile each unique kernel once; compile errors become rows, not exceptions."""
    rows = []
    groups = unique(kernels)
    for i, (k, same) in enumerate(groups):
        contexts = tuple(dict.fromkeys(x.context for x in same if x.context))
        if progress:
            progress(f"[{i + 1}/{len(groups)}] {get_target(target).name} {k.name} {k.shapes}")
        try:
            rows.append(Row(k, contexts, len(same), compile_kernel(k, target)))
        except CompileError as e:
            rows.append(Row(k, contexts, len(same), None, str(e)))
    return rows


def _kb(n: int) -> str:
    return f"{n / 1024:.0f}"


def format_table(rows: Sequence[Row], *, markdown: bool = False, max_context: int = 44) -> str:
    """One line per unique kernel: name, context, grid programs, warps, stages, shared memory
    (KB), registers, spills (bytes stored/loaded per thread), resident programs per SM,
    waves, and a verdict."""
    head = ["kernel", "context", "shapes", "programs", "warps", "stages", "smem KB", "regs",
            "spill st/ld", "blocks/SM", "waves", "verdict"]
    lines = []
    for r in rows:
        k = r.kernel
        ctx = r.contexts[0] if r.contexts else ""
        if len(r.contexts) > 1:
            ctx += f" (+{len(r.contexts) - 1})"
        if len(ctx) > max_context:
            ctx = ctx[: max_context - 1] + "…"
        if r.result is None:
            cells = [k.name, ctx, k.shapes, str(k.programs), str(k.num_warps), str(k.num_stages),
                     "-", "-", "-", "-", "-", "COMPILE ERROR"]
        else:
            c = r.result
            verdict = ("CANNOT LAUNCH: " + "; ".join(c.errors) if c.errors
                       else "ok" + (f" ({', '.join(c.flags)})" if c.flags else ""))
            cells = [k.name, ctx, k.shapes, str(k.programs), str(k.num_warps), str(k.num_stages),
                     _kb(c.shared), str(c.registers), f"{c.spill_stores}/{c.spill_loads}",
                     str(c.blocks_per_sm), f"{c.waves:.2f}", verdict]
        lines.append(cells)
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in lines]
        return "\n".join(out)
    widths = [max(len(h), *(len(c[i]) for c in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(c) for c in lines])


def report(cases: Iterable[tuple[str, Callable, tuple]], targets: Sequence[str] = ("sm_90",), *,
           progress: Callable[[str], None] | None = None) -> dict:
    """Capture every case ``(context, fn, args)``, de-duplicate, compile for each target.

    Returns ``{"versions", "warning", "targets": {name: [Row, ...]}}``. Kernels are lowered per
    target (the abstract device is that target's GPU).
    """
    cases = list(cases)
    out = {"versions": versions(), "warning": version_warning(), "targets": {}}
    for name in targets:
        kernels: list[Kernel] = []
        for context, fn, args in cases:
            if progress:
                progress(f"lowering {context} for {name}")
            kernels += capture_kernels(fn, *args, target=name, context=context)
        out["targets"][name] = compile_all(kernels, name, progress=progress)
    return out


def print_report(result: dict, *, markdown: bool = False, file=None) -> None:
    file = file or sys.stdout
    v = result["versions"]
    print(f"jax {v['jax']}, jaxlib {v['jaxlib']}, triton package {v['triton']}, "
          f"XLA's bundled Triton: {v['xla_triton']}", file=file)
    if result.get("warning"):
        print(result["warning"], file=file)
    for name, rows in result["targets"].items():
        t = get_target(name)
        n_bad = sum(1 for r in rows if r.result is None or not r.result.ok)
        print(f"\n{name} ({t.gpu}: {t.sms} SMs, {t.shared_per_block // 1024} KB shared memory per block): "
              f"{len(rows)} unique kernels, {sum(r.calls for r in rows)} call sites, "
              f"{n_bad} that cannot launch", file=file)
        print(format_table(rows, markdown=markdown), file=file)
        for r in rows:
            if r.error:
                print(f"  ERROR {r.error}", file=file)


def write_json(result: dict, path: str) -> None:
    data = {"versions": result["versions"], "warning": result["warning"],
            "targets": {n: [r.as_dict() for r in rows] for n, rows in result["targets"].items()}}
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def failures(result: dict) -> list[str]:
    """Human-readable lines for every kernel that failed to compile or cannot launch."""
    bad = []
    for name, rows in result["targets"].items():
        for r in rows:
            if r.result is None:
                bad.append(f"{name}: {r.error}")
            elif not r.result.ok:
                bad.append(f"{name}: {r.kernel.name} {r.kernel.shapes}: {'; '.join(r.result.errors)}")
    return bad


# ----------------------------------------------------------------------------- kernel shapes
def benchmark_cases() -> list[tuple[str, Callable, tuple]]:
    """The GPU shapes of ``python -m pallas_kernels.bench`` (bf16), as ``(context, fn, args)``:
    matmul 4096^3 and 8192^3, decode-shaped matmul M = 1/16/64 with K = N = 8192, causal flash
    attention B4 T4096 H16 D128, decode attention 32q/8kv heads D128 B64 over 4096 keys."""
    import jax
    import jax.numpy as jnp

    import pallas_kernels as pk

    S, bf16 = jax.ShapeDtypeStruct, jnp.bfloat16
    mm = lambda a, b: pk.matmul(a, b, mode="pallas")  # noqa: E731
    cases = [(f"bench matmul {n}^3", mm, (S((n, n), bf16), S((n, n), bf16))) for n in (4096, 8192)]
    cases += [(f"bench matmul M{m} K8192 N8192", mm, (S((m, 8192), bf16), S((8192, 8192), bf16)))
              for m in (1, 16, 64)]
    q = S((4, 4096, 16, 128), bf16)
    cases.append(("bench flash B4 T4096 H16 D128 causal",
                  lambda q, k, v: pk.flash_attention(q, k, v, causal=True, mode="pallas"), (q, q, q)))
    kc = S((64, 4096, 8, 128), bf16)
    cases.append(("bench decode B64 Hq32/Hkv8 D128 L4096",
                  lambda q, k, v, n: pk.decode_attention(q, k, v, n, mode="pallas"),
                  (S((64, 32, 128), bf16), kc, kc, S((64,), jnp.int32))))
    return cases


def main(argv: list[str] | None = None, cases: Callable[[], list] = benchmark_cases,
         prog: str = "python -m pallas_kernels.triton_compile", what: str = "the kernel benchmark's GPU shapes") -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=f"Compile the Pallas kernels at {what} with Triton for NVIDIA GPUs, on "
                               "this machine (no GPU needed), and print one row per unique kernel.")
    parser.add_argument("--target", choices=[*TARGETS, "all"], action="append",
                        help="GPU architecture (repeatable; default sm_90; 'all' = every target)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    targets = args.target or ["sm_90"]
    targets = list(TARGETS) if "all" in targets else list(dict.fromkeys(targets))
    try:
        _require_triton()
    except TritonUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if problem := triton_problem():   # another triton version: try anyway, and say so
        print(f"warning: {problem}", file=sys.stderr)
    say = None if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    result = report(cases(), targets, progress=say)
    print_report(result, markdown=args.markdown)
    if args.json:
        write_json(result, args.json)
        print(f"\nwrote {args.json}")
    bad = failures(result)
    for line in bad:
        print(f"FAIL {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
