"""Tune the decode kernels per shape: every candidate config of both tiers, timed, the best kept.

    python scripts/tune_decode.py [--quick] [--budget-s 400] [--json tuned.json]     (on a GPU)

A decode kernel streams bytes, and what lets it stream them at the read ceiling is shape-specific:
how many programs (CTAs) keep loads in flight, how deep the pipeline is, how finely K or the cache
length is split. The plans pick these by rule (``pallas_kernels/{triton,mosaic}/*.py``: ``plan``);
this script times the alternatives on the machine at hand, at the shapes the issue's targets name:
every decode projection of ``base`` and ``llama3_8b`` at one row (and 64 unless ``--quick``),
decode attention B64 over 4,096 cached keys and B1 over 32,768 (32 query / 8 KV heads of 128),
contiguous and paged (blocks of 64). For each shape and tier it prints the plan's own config, the
best candidate, both as TB/s and as a share of the read ceiling, and XLA's figure beside them, and
says which tier wins the shape. ``--json`` keeps every timing; the winners are what to write into
the plans' rules (and into ``mode.choose_tier`` where a tier loses its shape).

Timed like the kernel benchmark (:func:`pallas_kernels.bench.time_fn`: many calls in one program).
A candidate that does not compile or run (shared memory, registers) is recorded and skipped.
``--budget-s`` stops trying new candidates when the time is up (each is a compile: ~1 s).
Without a GPU the kernels run under the interpreters on tiny shapes: a rehearsal of the script
(tests/test_benchmark_scripts.py), never a result.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import sys
import warnings

import jax
import jax.numpy as jnp

import pallas_kernels as pk
from pallas_kernels import bench
from pallas_kernels.ceilings import device_ceilings
from pallas_kernels.files import atomic_write_text, check_output_path
from pallas_kernels.mode import mosaic_supported, pallas_supported
from pallas_kernels.mosaic import decode_attention as mosaic_decode
from pallas_kernels.mosaic import matmul as mosaic_matmul
from pallas_kernels.mosaic import paged_decode_attention as mosaic_paged
from pallas_kernels.timing import timed_call

ATTENTION = [(64, 32, 8, 128, 4096), (1, 32, 8, 128, 32768)]   # (B, Hq, Hkv, D, cached keys)


# ----------------------------------------------------------------------------- candidates
def matmul_candidates(m: int, k: int, n: int, tier: str, quick: bool) -> list:
    """Configs to try for ``[m, k] @ [k, n]`` on one tier: the plan's own first (None), then a grid
    around it (tile widths, K blocks and splits, warps, pipeline depth)."""
    out = [None]
    if tier == "mosaic":
        default = mosaic_matmul.plan(m, k, n).config
        splits = sorted({default.k_splits, max(1, default.k_splits // 2), default.k_splits * 2})
        for consumers, stages, s in itertools.product((1, 2), (4, 6) if quick else (4, 6, 8), splits):
            cfg = dataclasses.replace(mosaic_matmul.DECODE_CONFIG, consumers=consumers, stages=stages, k_splits=s)
            if mosaic_matmul.smem_bytes(cfg) <= mosaic_matmul.C.HOPPER_SMEM_BYTES:
                out.append(cfg)
        return out
    default = pk.matmul_plan(m, k, n, "bfloat16").config
    tiles = ((32, 256), (64, 256), (64, 128)) if quick else ((32, 256), (64, 256), (64, 128), (128, 128), (32, 512))
    splits = sorted({default.split_k, max(1, default.split_k // 2), default.split_k * 2})
    for (bn, bk), s, warps, stages in itertools.product(tiles, splits, (4, 8), (3,) if quick else (3, 5)):
        out.append(pk.MatmulConfig(default.block_m, bn, bk, s, warps, stages))
    return out


def attention_candidates(b: int, s: int, hkv: int, d: int, tier: str, paged: bool, quick: bool) -> list:
    """Configs to try for decode attention (contiguous or paged) on one tier, the plan's own first."""
    if tier == "mosaic":
        if paged:   # the launcher picks the split; the pages a row holds bound it
            return [None] + [mosaic_paged.MosaicPagedDecodeConfig(splits=x) for x in (1, 2, 4, 8, 16, 32)
                             if x <= s // 64]
        splits = mosaic_decode.plan(b, s, 32, hkv, d).splits
        return [None] + [mosaic_decode.MosaicDecodeConfig(block_k=bk, stages=st, splits=x)
                         for bk, st, x in itertools.product((64, 128), (2, 4) if quick else (2, 3, 4),
                                                            sorted({max(1, splits // 2), splits, splits * 2}))
                         if _mosaic_decode_fits(bk, st, d)]
    if paged:
        default = pk.paged_decode_attention_plan(b, s // 64, 64, hkv).config
        return [None] + [pk.PagedDecodeAttentionConfig(x, w, st)
                         for x, w, st in itertools.product(sorted({max(1, default.num_splits // 2), default.num_splits,
                                                                   default.num_splits * 2}), (4, 8), (2, 3))]
    default = pk.decode_attention_plan(b, s, hkv, d).config
    return [None] + [pk.DecodeAttentionConfig(bk, x, w, st)
                     for bk, x, w, st in itertools.product((32, 64, 128) if not quick else (64, 128),
                                                           sorted({max(1, default.num_splits // 2), default.num_splits,
                                                                   default.num_splits * 2}), (4, 8), (2, 3))]


def _mosaic_decode_fits(block_k: int, stages: int, d: int) -> bool:
    """Q + stages x (K + V) + P + the f32 output tile within a Hopper CTA's shared memory."""
    rows, two = mosaic_decode.ROWS, 2
    smem = rows * d * two + stages * 2 * block_k * d * two + rows * block_k * two + rows * d * 4
    return smem <= mosaic_decode.C.HOPPER_SMEM_BYTES


# ----------------------------------------------------------------------------- cases and timing
@dataclasses.dataclass
class Case:
    """One shape to tune: its label, bytes streamed per call, and per tier a function of a config."""

    kernel: str
    shape: str
    nbytes: int
    args: tuple
    run: dict            # tier -> fn(config) -> a callable of args
    candidates: dict     # tier -> [config or None]
    xla: object          # XLA's own version of the call (the peer)


def cases(gpu: bool, quick: bool, tiers: list) -> list:
    """The shapes the targets name (on a CPU: tiny stand-ins for a rehearsal)."""
    dtype = jnp.bfloat16   # the Mosaic tier takes bf16 only (interpreted too)
    keys = iter(jax.random.split(jax.random.key(0), 64))
    rand = lambda shape: jax.random.normal(next(keys), shape, jnp.float32).astype(dtype)   # noqa: E731
    itemsize = jnp.dtype(dtype).itemsize
    out = []
    projections = ([(f"{model} {name}", k, n) for model, p in bench.DECODE_PROJECTIONS.items() for name, (k, n) in p.items()]
                   if gpu else [("square", 128, 128)])
    for (label, k, n), m in itertools.product(projections, (1,) if quick or not gpu else (1, 64)):
        run = {t: (lambda cfg, t=t: lambda x, w: pk.matmul(x, w, mode=_mode(t), config=cfg)) for t in tiers}
        cands = {t: matmul_candidates(m, k, n, t, quick or not gpu)[: None if gpu else 2] for t in tiers}
        out.append(Case("matmul", f"{label} M{m} K{k} N{n}", k * n * itemsize, (rand((m, k)), rand((k, n))), run, cands,
                        bench.xla_matmul))
    for b, hq, hkv, d, length in (ATTENTION if gpu else [(2, 4, 2, 64, 256)]):
        q, kc, vc = rand((b, hq, d)), rand((b, length, hkv, d)), rand((b, length, hkv, d))
        lengths = jnp.full((b,), length, jnp.int32)
        nbytes = 2 * b * length * hkv * d * itemsize
        shape = f"B{b} Hq{hq}/Hkv{hkv} D{d} L{length}"
        run = {t: (lambda cfg, t=t: lambda q, k, v, n: pk.decode_attention(q, k, v, n, mode=_mode(t), config=cfg))
               for t in tiers}
        cands = {t: attention_candidates(b, length, hkv, d, t, False, quick or not gpu)[: None if gpu else 2] for t in tiers}
        out.append(Case("decode_attention", shape, nbytes, (q, kc, vc, lengths), run, cands,
                        lambda q, k, v, n: pk.reference.decode_attention(q, k, v, n)))
        pages = length // 64
        order = jax.random.permutation(next(keys), b * pages) + 1            # block 0: the null block
        kp, vp = rand((b * pages + 1, 64, hkv, d)), rand((b * pages + 1, 64, hkv, d))
        tables = order.reshape(b, pages).astype(jnp.int32)
        run = {t: (lambda cfg, t=t: lambda q, k, v, tb, n: pk.paged_decode_attention(q, k, v, tb, n, mode=_mode(t),
                                                                                     config=cfg)) for t in tiers}
        cands = {t: attention_candidates(b, length, hkv, d, t, True, quick or not gpu)[: None if gpu else 2] for t in tiers}
        out.append(Case("paged_decode_attention", shape + " blocks of 64", nbytes, (q, kp, vp, tables, lengths), run,
                        cands, lambda q, k, v, t, n: pk.reference.paged_decode_attention(q, k, v, t, n)))
        del q, kc, vc, kp, vp
    return out


def _mode(tier: str) -> str:
    """The kernel mode that runs ``tier`` here (the interpreters where nothing compiles)."""
    if pallas_supported():
        return tier
    return "mosaic_interpret" if tier == "mosaic" else "interpret"


def tune(case: Case, *, gpu: bool, repeats: int, deadline) -> dict:
    """Every candidate of every tier of ``case`` timed; ``{"kernel", "shape", "nbytes", "xla_s", "tiers":
    {tier: {"default_s", "best_s", "best", "tried": [...]}}}`` (seconds per call)."""
    xla_s, _ = bench.time_fn(case.xla, *case.args, repeats=repeats, gpu=gpu)
    result = {"kernel": case.kernel, "shape": case.shape, "nbytes": case.nbytes, "xla_s": xla_s, "tiers": {}}
    for tier, candidates in case.candidates.items():
        tried = []
        for cfg in candidates:
            if cfg is not None and deadline():
                tried.append({"config": repr(cfg), "error": "not tried: --budget-s spent"})
                continue
            try:
                seconds, _ = bench.time_fn(case.run[tier](cfg), *case.args, repeats=repeats, gpu=gpu)
                tried.append({"config": "plan" if cfg is None else repr(cfg), "seconds": seconds})
            except Exception as err:  # noqa: BLE001 - a config that does not fit is a result, not a failure
                tried.append({"config": repr(cfg), "error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"})
        timed_ok = [t for t in tried if "seconds" in t]
        best = min(timed_ok, key=lambda t: t["seconds"]) if timed_ok else None
        default = next((t for t in tried if t["config"] == "plan" and "seconds" in t), None)
        result["tiers"][tier] = {"default_s": default and default["seconds"], "best_s": best and best["seconds"],
                                 "best": best and best["config"], "tried": tried}
    return result


def report_line(r: dict, read_ceiling: float) -> str:
    """One case: each tier's plan and best (TB/s, % of the read ceiling), XLA, and who wins."""
    def rate(seconds):
        return f"{r['nbytes'] / seconds / 1e12:6.3f} TB/s {100 * r['nbytes'] / seconds / read_ceiling:4.0f}%"

    parts = []
    for tier, t in r["tiers"].items():
        if t["best_s"] is None:
            parts.append(f"{tier}: nothing ran")
            continue
        plan = rate(t["default_s"]) if t["default_s"] else "failed"
        parts.append(f"{tier}: plan {plan}, best {rate(t['best_s'])} ({t['best']})")
    ran = {tier: t["best_s"] for tier, t in r["tiers"].items() if t["best_s"]}
    winner = min(ran, key=ran.get) if ran else "-"
    ahead = f"x{r['xla_s'] / ran[winner]:.2f} XLA" if ran else ""
    return f"{r['kernel']:<23}{r['shape']:<40} xla {rate(r['xla_s'])} | " + " | ".join(parts) + f" | wins: {winner} {ahead}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/tune_decode.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer candidates, batch 1 only")
    ap.add_argument("--budget-s", type=float, default=400.0, help="stop trying new candidates after this long")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--tiers", default=None, help="comma-separated: triton,mosaic (default: what this device compiles)")
    ap.add_argument("--json", metavar="PATH", help="write every timing to PATH")
    ap.add_argument("--force", action="store_true", help="replace the --json file if it exists")
    args = ap.parse_args(argv)
    path = None
    if args.json:
        try:
            path = check_output_path(args.json, force=args.force, flag="--json")
        except ValueError as err:
            print(f"tune_decode: error: {err}", file=sys.stderr)
            return 2
    gpu = pallas_supported()
    tiers = (["triton", "mosaic"] if mosaic_supported() else ["triton"]) if gpu else ["triton", "mosaic"]
    if args.tiers:
        tiers = [t for t in args.tiers.split(",") if t in ("triton", "mosaic")]
        if not tiers or len(tiers) != len(args.tiers.split(",")):
            print(f"tune_decode: error: --tiers {args.tiers!r}: name triton and/or mosaic", file=sys.stderr)
            return 2
    repeats = args.repeats or (5 if gpu else 1)
    spent = [0.0]

    def deadline() -> bool:
        return spent[0] > args.budget_s

    ceil = device_ceilings(n=8192 if gpu else 256, nbytes=(1 << 30) if gpu else (1 << 22),
                           dtype=jnp.bfloat16 if gpu else jnp.float32, repeats=3 if gpu else 1)
    print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}; read ceiling "
          f"{ceil['bandwidth'] / 1e12:.3f} TB/s [{ceil['bandwidth_method']}]")
    if not gpu:
        print(bench.NOT_REPRESENTATIVE)
    results = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Triton backend is deprecated.*")
        for case in cases(gpu, args.quick, tiers):
            seconds, r = timed_call(functools.partial(tune, gpu=gpu, repeats=repeats, deadline=deadline), case)
            spent[0] += seconds
            results.append(r)
            print(report_line(r, ceil["bandwidth"]))
    if path is not None:
        atomic_write_text(path, json.dumps({"device": jax.devices()[0].device_kind, "jax": jax.__version__,
                                            "read_ceiling": ceil["bandwidth"], "results": results}, indent=1))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
