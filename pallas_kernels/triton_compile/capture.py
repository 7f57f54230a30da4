"""Capture: the Triton IR of every Pallas kernel a function launches, lowered for an abstract GPU."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import math
import re
import warnings
from typing import Callable, Iterable


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
    device = mesh_lib.AbstractDevice(device_kind=t.device_kind, num_cores=None, platform="cuda")
    mesh = mesh_lib.AbstractMesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,),
                                 abstract_device=device)
    with mode_mod.assume_gpu(t.device_kind, divmod(t.capability, 10)), jax.sharding.use_abstract_mesh(mesh), \
            warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Triton backend is deprecated.*")
        yield t


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
