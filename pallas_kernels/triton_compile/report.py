"""The report: every kernel compiled for each target, one row each, and the command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Callable, Iterable, Sequence

from pallas_kernels.triton_compile.capture import TARGETS, Kernel, Target, capture_kernels, get_target, unique
from pallas_kernels.triton_compile.compiler import (Compiled, CompileError, TritonUnavailable, require_triton,
                                                    compile_kernel, triton_problem, version_warning, versions)


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
    mm = lambda a, b: pk.matmul(a, b, mode="triton")  # noqa: E731
    cases = [(f"bench matmul {n}^3", mm, (S((n, n), bf16), S((n, n), bf16))) for n in (4096, 8192)]
    cases += [(f"bench matmul M{m} K8192 N8192", mm, (S((m, 8192), bf16), S((8192, 8192), bf16)))
              for m in (1, 16, 64)]
    q = S((4, 4096, 16, 128), bf16)
    cases.append(("bench flash B4 T4096 H16 D128 causal",
                  lambda q, k, v: pk.flash_attention(q, k, v, causal=True, mode="triton"), (q, q, q)))
    kc = S((64, 4096, 8, 128), bf16)
    cases.append(("bench decode B64 Hq32/Hkv8 D128 L4096",
                  lambda q, k, v, n: pk.decode_attention(q, k, v, n, mode="triton"),
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
        require_triton()
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
