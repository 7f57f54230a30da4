"""Benchmark the kernels against XLA (and cuDNN / jax's own Pallas kernels where present).

    python -m pallas_kernels.bench [--quick] [--json PATH [--force]] [--repeats N]

First it measures this device's ceilings (a large matmul in the kernels' dtype; a
bandwidth-bound elementwise pass over a large array, read + write bytes counted), then times
each kernel and its peers and prints TFLOP/s (compute-bound shapes) or TB/s (memory-bound
shapes) with the percentage of the measured ceiling.

On an NVIDIA GPU the kernels run compiled (``mode="pallas"``) at the issue's target shapes
(bf16): matmul 4096^3 and 8192^3, decode-shaped matmul (M = 1/16/64, K = N = 8192), causal
flash attention B4 T4096 H16 D128, decode attention 32 query / 8 KV heads D128 B64 with 4096
cached keys. Elsewhere there is no compiled Pallas: the kernels run under the interpreter on
small shapes and the report says plainly that those numbers are not representative.

Timing is honest: every function is jitted, warmed up, synchronised with
``block_until_ready`` and timed as the median of several repeats, on random (non-zero) data.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
import warnings
from typing import Callable

import jax
import jax.numpy as jnp

import pallas_kernels as pk
from pallas_kernels.ceilings import device_ceilings
from pallas_kernels.files import atomic_write_text, check_output_path
from pallas_kernels.mode import pallas_supported

NOT_REPRESENTATIVE = (
    "NOT REPRESENTATIVE: no GPU here, so the Pallas kernels run under the interpreter "
    "(the grid becomes a sequential loop on the CPU) on small shapes; these numbers time "
    "the interpreter and XLA:CPU, not the kernels on hardware. Run on an NVIDIA GPU for real figures."
)


def time_fn(fn: Callable, *args, repeats: int = 10, warmup: int = 2) -> float:
    """Median seconds of ``jax.jit(fn)(*args)`` after ``warmup`` untimed calls."""
    f = jax.jit(fn)
    for _ in range(warmup):
        jax.block_until_ready(f(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _rand(key, shape, dtype):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def _bench_ceilings(gpu: bool, quick: bool, dtype, repeats: int) -> dict:
    """The benchmark's ceilings: :func:`pallas_kernels.ceilings.device_ceilings` at sizes for this device."""
    n = 8192 if gpu else (512 if quick else 1024)
    nbytes = (1 << 30) if gpu else ((1 << 24) if quick else (1 << 26))   # 1 GiB / 16 / 64 MiB
    return device_ceilings(n=n, nbytes=nbytes, dtype=dtype if gpu else jnp.float32, repeats=repeats)


def _jaxlib_version() -> str | None:
    try:
        import jaxlib

        return jaxlib.__version__
    except Exception:  # noqa: BLE001
        return None


def _visible_pairs(t: int, s: int, causal: bool) -> int:
    if not causal:
        return t * s
    return int(sum(min(s, i + (s - t) + 1) for i in range(t)))


def _try_import_jax_pallas_ops():
    """jax's own (deprecated) Triton Pallas kernels, as peers; None where unavailable."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from jax.experimental.pallas.ops.gpu import attention as jax_attention
            from jax.experimental.pallas.ops.gpu import decode_attention as jax_decode
        return jax_attention, jax_decode
    except Exception:  # noqa: BLE001 - any import problem just means "no peer"
        return None, None


def run(quick: bool = False, repeats: int | None = None, verbose: bool = True) -> dict:
    """Run the benchmark; returns ``{"meta", "ceilings", "rows"}`` (rows: one per kernel x impl)."""
    gpu = pallas_supported()
    mode = "pallas" if gpu else "interpret"
    dtype = jnp.bfloat16 if gpu else jnp.float32
    if repeats is None:
        repeats = (5 if quick else 20) if gpu else (2 if quick else 3)
    dev = jax.devices()[0]
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": getattr(dev, "device_kind", str(dev)), "platform": dev.platform,
        "jax": jax.__version__, "jaxlib": _jaxlib_version(),
        "kernel_mode": mode, "dtype": jnp.dtype(dtype).name, "quick": quick,
        "representative": gpu,
    }
    say = print if verbose else (lambda *a, **k: None)
    say(f"device: {meta['device']} ({dev.platform}), jax {jax.__version__}, kernels in mode={mode!r}")
    if not gpu:
        say(NOT_REPRESENTATIVE)
    ceil = _bench_ceilings(gpu, quick, dtype, max(3, repeats))
    say(f"ceilings: matmul {ceil['matmul_flops'] / 1e12:.3f} TFLOP/s [{ceil['matmul_method']}], "
        f"bandwidth {ceil['bandwidth'] / 1e12:.3f} TB/s [{ceil['bandwidth_method']}]")
    rows: list[dict] = []

    def record(kernel, shape, impl, fn, args, flops=None, nbytes=None, bound="compute"):
        try:
            t = time_fn(fn, *args, repeats=repeats)
        except Exception as e:  # noqa: BLE001 - a missing peer is reported, not fatal
            row = {"kernel": kernel, "shape": shape, "impl": impl, "error": f"{type(e).__name__}: {str(e)[:160]}"}
            rows.append(row)
            say(f"  {kernel:<18} {shape:<34} {impl:<22} unavailable ({row['error'][:80]})")
            return
        row = {"kernel": kernel, "shape": shape, "impl": impl, "seconds": t, "bound": bound}
        if flops is not None:
            row["tflops"] = flops / t / 1e12
            row["pct_matmul_peak"] = 100 * flops / t / ceil["matmul_flops"]
        if nbytes is not None:
            row["tbps"] = nbytes / t / 1e12
            row["pct_bandwidth"] = 100 * nbytes / t / ceil["bandwidth"]
        rows.append(row)
        if bound == "compute":
            figure = f"{row['tflops']:8.2f} TFLOP/s {row['pct_matmul_peak']:5.1f}% of matmul peak"
        else:
            figure = f"{row['tbps']:8.3f} TB/s    {row['pct_bandwidth']:5.1f}% of bandwidth"
        say(f"  {kernel:<18} {shape:<34} {impl:<22} {t * 1e3:9.3f} ms {figure}")

    keys = iter(jax.random.split(jax.random.key(42), 64))
    itemsize = jnp.dtype(dtype).itemsize
    jax_attention, jax_decode = _try_import_jax_pallas_ops() if gpu else (None, None)

    # --- matmul, compute-bound (prefill-shaped)
    sizes = [4096, 8192] if gpu else ([128] if quick else [256])
    say("matmul (compute-bound):")
    for n in sizes:
        a, b = _rand(next(keys), (n, n), dtype), _rand(next(keys), (n, n), dtype)
        shape = f"{n}x{n}x{n} {jnp.dtype(dtype).name}"
        record("matmul", shape, f"pallas[{mode}]", lambda a, b: pk.matmul(a, b, mode=mode), (a, b), flops=2 * n ** 3)
        record("matmul", shape, "xla jnp.dot", lambda a, b: pk.reference.matmul(a, b), (a, b), flops=2 * n ** 3)

    # --- matmul, memory-bound (decode-shaped: M = batch, weight K x N streamed once)
    kn = 8192 if gpu else (256 if quick else 512)
    say("decode-shaped matmul (bandwidth-bound; bytes = the weight):")
    w = _rand(next(keys), (kn, kn), dtype)
    for m in ([1, 16, 64] if gpu else [1, 16]):
        x = _rand(next(keys), (m, kn), dtype)
        shape = f"M{m} K{kn} N{kn} {jnp.dtype(dtype).name}"
        nbytes = kn * kn * itemsize
        record("matmul_decode", shape, f"pallas[{mode}]", lambda x, w: pk.matmul(x, w, mode=mode), (x, w),
               nbytes=nbytes, bound="memory")
        record("matmul_decode", shape, "xla jnp.dot", lambda x, w: pk.reference.matmul(x, w), (x, w),
               nbytes=nbytes, bound="memory")

    # --- flash attention (prefill), causal
    b_, t_, h_, d_ = (4, 4096, 16, 128) if gpu else ((1, 64, 2, 32) if quick else (1, 256, 4, 64))
    q, k, v = (_rand(next(keys), (b_, t_, h_, d_), dtype) for _ in range(3))
    flops = 4 * b_ * h_ * d_ * _visible_pairs(t_, t_, True)
    shape = f"B{b_} T{t_} H{h_} D{d_} causal"
    scale = d_ ** -0.5
    say("causal flash attention (compute-bound; FLOPs of the visible pairs only):")
    record("flash_attention", shape, f"pallas[{mode}]",
           lambda q, k, v: pk.flash_attention(q, k, v, causal=True, mode=mode), (q, k, v), flops=flops)
    record("flash_attention", shape, "xla dot_product_attn",
           lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla"),
           (q, k, v), flops=flops)
    if gpu:
        record("flash_attention", shape, "cudnn dot_product_attn",
               lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn"),
               (q, k, v), flops=flops)
        if jax_attention is not None:
            record("flash_attention", shape, "jax pallas ops mha",
                   lambda q, k, v: jax_attention.mha(q, k, v, None, sm_scale=scale, causal=True),
                   (q, k, v), flops=flops)

    # --- decode attention over a KV cache
    b_, hq, hkv, d_, s_ = (64, 32, 8, 128, 4096) if gpu else ((2, 8, 2, 32, 128) if quick else (4, 8, 2, 64, 512))
    q = _rand(next(keys), (b_, hq, d_), dtype)
    kc, vc = (_rand(next(keys), (b_, s_, hkv, d_), dtype) for _ in range(2))
    lengths = jnp.full((b_,), s_, jnp.int32)
    nbytes = 2 * b_ * s_ * hkv * d_ * itemsize
    shape = f"B{b_} Hq{hq}/Hkv{hkv} D{d_} L{s_}"
    say("decode attention (bandwidth-bound; bytes = K + V read):")
    record("decode_attention", shape, f"pallas[{mode}]",
           lambda q, k, v, n: pk.decode_attention(q, k, v, n, mode=mode), (q, kc, vc, lengths),
           nbytes=nbytes, bound="memory")
    record("decode_attention", shape, "xla reference",
           lambda q, k, v, n: pk.reference.decode_attention(q, k, v, n), (q, kc, vc, lengths),
           nbytes=nbytes, bound="memory")
    if gpu and jax_decode is not None:
        record("decode_attention", shape, "jax pallas ops gqa",
               lambda q, k, v, n: jax_decode.gqa(q, k, v, kv_seq_len=n, sm_scale=d_ ** -0.5),
               (q, kc, vc, lengths), nbytes=nbytes, bound="memory")
    if not gpu:
        say(NOT_REPRESENTATIVE)
    return {"meta": meta, "ceilings": ceil, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pallas_kernels.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and (on CPU) tinier shapes")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--force", action="store_true", help="replace the --json file if it exists")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per case (median reported)")
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    json_path = None
    if args.json is not None:  # checked before the benchmark runs, so its results are never lost
        try:
            json_path = check_output_path(args.json, force=args.force, flag="--json")
        except ValueError as err:
            print(f"bench: error: {err}", file=sys.stderr)
            return 2
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Triton backend is deprecated.*")
        result = run(quick=args.quick, repeats=args.repeats)
    if json_path is not None:
        try:
            atomic_write_text(json_path, json.dumps(result, indent=2))
        except OSError as err:
            print(f"bench: error: could not write {json_path} ({err.strerror}); the table above has the results",
                  file=sys.stderr)
            return 1
        print(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
