"""The optional Hopper sections of notebooks 02 and 03: what the Mosaic GPU kernels add to the
readable Triton-style ones, how each tier would cut the same work, and (once a GPU run has
measured it) how much that buys.

Every number here comes from the two tiers' ``plan()`` functions (pure arithmetic on shapes)
or from a measured benchmark file; the Mosaic kernels are checked for correctness under GPU
interpret mode, which simulates shared memory, barriers, TMA and ``wgmma`` on any machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp

import pallas_kernels as pk
from inference_lab.base.random_arrays import normal
from pallas_kernels.mosaic import decode_attention as mosaic_decode
from pallas_kernels.mosaic import matmul as mosaic_matmul
from pallas_kernels.testing import decode_attention_f64, matmul_f64, rel_err

H200_SMS = 132
# Where a GPU run's benchmark lands when someone records it (make gpu-check, then copy bench.json).
MEASURED = Path(__file__).resolve().parents[2] / "docs" / "measurements" / "h200-bench.json"

WHAT_HOPPER_ADDS = (
    ("TMA", "a copy engine moves whole tiles between HBM and shared memory: no thread spends "
            "instructions on address arithmetic or loads, and edges past the array read as zeros"),
    ("wgmma", "a warpgroup (4 warps) issues one matrix instruction over a 64-row tile held in shared "
              "memory, asynchronously: the tensor cores keep working while the next tile arrives"),
    ("warp specialisation", "one warpgroup only issues TMA copies (the producer), one or two only do "
                            "math (the consumers); a ring of shared-memory slots with barriers between them"),
    ("persistent grid", "one CTA per SM loops over work units, so set-up is paid once per SM and the "
                        "last wave never leaves SMs idle"),
)


def what_hopper_adds() -> str:
    return "\n".join(f"{name:<22}{what}" for name, what in WHAT_HOPPER_ADDS)


def matmul_plans(m: int, k: int, n: int, num_sms: int = H200_SMS) -> str:
    """How each tier cuts ``[m, k] @ [k, n]`` (bf16) on a GPU with ``num_sms`` SMs."""
    t = pk.matmul_plan(m, k, n, "bfloat16", num_sms=num_sms)
    h = mosaic_matmul.plan(m, k, n, jnp.bfloat16, num_sms=num_sms)
    c, hc = t.config, h.config
    return "\n".join([
        f"[{m}, {k}] @ [{k}, {n}] in bf16 on {num_sms} SMs",
        f"  Triton tier: {t.programs:,} programs of {c.block_m}x{c.block_n} outputs, K in steps of {c.block_k}"
        f"{f', split {t.grid[1]} ways' if t.grid[1] > 1 else ''}; {c.num_warps} warps, {c.num_stages} stages",
        f"  Mosaic tier: {h.num_ctas} persistent CTAs running {h.units:,} units of {hc.tile_m}x{hc.cta_n} outputs"
        f"{f' (K split {h.k_splits} ways)' if h.k_splits > 1 else ''}, K in steps of {hc.tile_k}; "
        f"1 producer + {hc.consumers} consumer warpgroup(s), a ring of {hc.stages} slots, "
        f"{h.smem_bytes() // 1024} KiB of shared memory",
    ])


def decode_attention_plans(batch: int, s_max: int, hq: int, hkv: int, d: int, num_sms: int = H200_SMS) -> str:
    """How each tier cuts one decode step of attention over an ``s_max``-slot cache."""
    t = pk.decode_attention_plan(batch, s_max, hkv, d, num_sms=num_sms)
    h = mosaic_decode.plan(batch, s_max, hq, hkv, d, num_sms=num_sms)
    return "\n".join([
        f"decode attention, batch {batch}, {s_max:,} cached keys, {hq} query / {hkv} KV heads of {d}, {num_sms} SMs",
        f"  Triton tier: {t.programs:,} programs ({t.num_splits} splits x {hkv} KV heads x {batch}), "
        f"{t.chunk} keys each, loaded {t.config.block_k} at a time by the threads",
        f"  Mosaic tier: {h.num_ctas:,} CTAs ({h.splits} split(s) x {hkv} KV heads x {batch}), {h.chunk} keys each, "
        f"TMA copies of {h.config.block_k} keys into a ring of {h.config.stages} slots; the G = {hq // hkv} "
        f"query heads of a group are the rows of one 64-row wgmma tile",
    ])


def mosaic_check(seed: int = 0) -> dict:
    """The Hopper matmul and decode attention under GPU interpret mode vs float64 NumPy (a few
    seconds on a CPU: the simulator runs every warpgroup, barrier and TMA copy)."""
    a = normal((5, 128), "bfloat16", (seed, 0))
    b = normal((128, 192), "bfloat16", (seed, 1))
    q = normal((2, 8, 64), "bfloat16", (seed, 2))
    kc = normal((2, 64, 2, 64), "bfloat16", (seed, 3))
    vc = normal((2, 64, 2, 64), "bfloat16", (seed, 4))
    lengths = jnp.array([1, 64], jnp.int32)
    return {
        "Mosaic matmul 5x128 @ 128x192 (bf16)": rel_err(pk.matmul(a, b, mode="mosaic_interpret"), matmul_f64(a, b)),
        "Mosaic decode attention lengths 1/64 (bf16)": rel_err(
            pk.decode_attention(q, kc, vc, lengths, mode="mosaic_interpret"), decode_attention_f64(q, kc, vc, lengths)),
    }


def measured_tiers(kernel: str, path: Path = MEASURED) -> str:
    """The two tiers side by side from a recorded GPU benchmark (``kernel``: "matmul",
    "matmul_decode", "flash_attention" or "decode_attention"), or a line saying none exists yet."""
    if not path.is_file():
        return ("no GPU measurement recorded yet: `make gpu-check` on an H200 writes bench.json, "
                "which goes to docs/measurements/h200-bench.json")
    result = json.loads(path.read_text())
    rows = [r for r in result.get("rows", []) if r.get("kernel") == kernel and "seconds" in r]
    meta = result.get("meta", {})
    lines = [f"measured on {meta.get('device', '?')}, {meta.get('date', '?')}, jax {meta.get('jax', '?')}"]
    for r in rows:
        figure = f"{r['tflops']:.0f} TFLOP/s" if "tflops" in r else f"{r['tbps']:.2f} TB/s"
        lines.append(f"  {r['shape'][:36]:<38}{r['impl']:<26}{figure}")
    return "\n".join(lines)
