"""Compile: one captured kernel through the `triton` package to PTX, then ptxas for registers and spills."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import subprocess
import sys
import tempfile

from pallas_kernels.triton_compile.capture import NEAR_LIMIT, TRITON_PIN, Kernel, Target, get_target


class TritonUnavailable(ImportError):
    """The ``triton`` package (the compiler; no GPU needed) is not installed."""


def require_triton():
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
        version = require_triton().__version__
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
        triton_version = require_triton().__version__
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
    triton = require_triton()
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
