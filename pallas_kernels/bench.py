"""Benchmark the kernels against XLA (and cuDNN / jax's own Pallas kernels where present).

    python -m pallas_kernels.bench [--quick] [--json PATH [--force]] [--repeats N]

First it measures this device's ceilings (a large matmul in the kernels' dtype; a
bandwidth-bound pass over a large array), then times each kernel and its peers and prints
TFLOP/s (compute-bound shapes) or TB/s (memory-bound shapes) with the percentage of the
measured ceiling.

On an NVIDIA GPU the kernels run compiled, in bf16 (on a Hopper-class GPU both tiers, the
Triton-style kernels and the Mosaic GPU ones, side by side with XLA and cuDNN), at:
matmul 4096^3 and 8192^3; every decode projection of the ``base`` (Llama-3.2-1B) and
``llama3_8b`` shapes at batch 1 and 64 (the weight streamed once: bandwidth-bound); causal
flash attention B4 T4096 H16 D128; decode attention with 32 query / 8 KV heads of 128 at B64
over 4,096 cached keys and at B1 over 32,768 (the case the length split exists for).
Elsewhere there is no compiled Pallas: the kernels run under the interpreter on small shapes
and the report says plainly that those numbers are not representative.

Honest timing: random (non-zero) inputs; every sample runs the function many times inside ONE
jitted loop (:class:`pallas_kernels.timing.InOneProgram`: a ~30 us kernel is not timed together
with ~10-30 us of Python dispatch, every call depends on the one before so XLA cannot hoist it,
and nothing but one element of each input is written between calls), after a warm-up,
synchronised with ``block_until_ready``; the median sample over its calls is reported. On a GPU
a sample lasts about :data:`TARGET_SAMPLE_S`. The XLA lines are XLA's own best: ``x @ w`` in the
kernels' dtype (cuBLAS or XLA's Triton GEMMs, whatever XLA picks), not the lab's float64-checked
reference twin. ``timing check`` rows time one XLA vector-matrix product over a 1 GiB weight both
in one program and one call at a time (where dispatch is ~1% of the call): the two must agree.

A failure of one of OUR kernels is an error: it is printed and the benchmark exits with 1
(a missing or failing peer, e.g. cuDNN, is only reported).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import traceback
import warnings
from typing import Callable

import jax
import jax.numpy as jnp

import pallas_kernels as pk
from pallas_kernels import quantization
from pallas_kernels.ceilings import device_ceilings
from pallas_kernels.files import atomic_write_text, check_output_path
from pallas_kernels.mode import mosaic_supported, pallas_supported
from pallas_kernels.timing import round_robin, seconds_per_call, timed

NOT_REPRESENTATIVE = (
    "NOT REPRESENTATIVE: no GPU here, so the Pallas kernels run under the interpreter "
    "(the grid becomes a sequential loop on the CPU) on small shapes; these numbers time "
    "the interpreter and XLA:CPU, not the kernels on hardware. Run on an NVIDIA GPU for real figures."
)

# (K, N) of every matmul in one decode step, by model shape: the weights a step streams.
DECODE_PROJECTIONS = {
    "base": {"qkv": (2048, 3072), "o": (2048, 2048), "gate_up": (2048, 16384), "down": (8192, 2048),
             "head": (2048, 128256)},
    "llama3_8b": {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096),
                  "head": (4096, 128256)},
}
TARGET_SAMPLE_S = 20e-3   # calls per sample are chosen so a sample lasts about this long (GPU)
GPU_UNROLL = 4            # calls per loop iteration on a GPU: the loop's counter and test are paid once per 4


def time_fn(fn: Callable, *args, repeats: int = 10, gpu: bool = False) -> tuple[float, int]:
    """(median seconds per call, calls per sample) of ``fn(*args)``, timed in one program
    (:func:`pallas_kernels.timing.seconds_per_call`); on a CPU (the interpreter) one call a sample."""
    if gpu:
        return seconds_per_call(fn, args, repeats=repeats, target_s=TARGET_SAMPLE_S, unroll=GPU_UNROLL)
    return seconds_per_call(fn, args, repeats=repeats, target_s=0.0)


def xla_matmul(a, b):
    """XLA's own matmul at its defaults (what ``a @ b`` in a JAX model runs): the peer to beat."""
    return a @ b


def timing_check(gpu: bool, quick: bool, dtype, repeats: int) -> dict:
    """The bench's method against an independent one: XLA's vector-matrix product over one large
    weight (1 GiB on a GPU), timed in one program (:func:`time_fn`) and one call at a time
    (:func:`pallas_kernels.timing.timed` around each jitted call). At this size a call's dispatch
    is ~1% of it, so the two agree unless the in-program loop adds work of its own (the old loop
    rewrote the whole weight every call). ``{"in_one_program_s", "per_call_s", "ratio", "nbytes"}``."""
    k = 8192 if gpu else (512 if quick else 2048)
    n = (1 << 30) // (k * jnp.dtype(dtype).itemsize) if gpu else 8192
    key = jax.random.key(7)
    x, w = _rand(key, (1, k), dtype), _rand(jax.random.fold_in(key, 1), (k, n), dtype)
    looped, _ = time_fn(xla_matmul, x, w, repeats=repeats, gpu=gpu)
    once = jax.jit(xla_matmul)
    per_call = round_robin([lambda: timed(once, x, w)], repeats)[0].median
    # What the loop itself adds to a call of two floating arguments: the same loop around no work.
    loop_cost, _ = time_fn(lambda x, w: x, x[:, :8], w[:8, :8], repeats=repeats, gpu=gpu)
    return {"in_one_program_s": looped, "per_call_s": per_call, "ratio": looped / per_call,
            "loop_cost_s": loop_cost, "nbytes": k * n * jnp.dtype(dtype).itemsize}


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


class _Report:
    """Collects rows, prints one line per case, remembers failures of our own kernels."""

    def __init__(self, ceil: dict, repeats: int, gpu: bool, say):
        self.ceil, self.repeats, self.gpu, self.say = ceil, repeats, gpu, say
        self.rows: list[dict] = []
        self.failures: list[str] = []

    def record(self, kernel, shape, impl, fn, args, *, flops=None, nbytes=None, bound="compute", ours=False):
        try:
            t, iters = time_fn(fn, *args, repeats=self.repeats, gpu=self.gpu)
        except Exception as e:  # noqa: BLE001 - a peer may be missing; ours may not fail
            row = {"kernel": kernel, "shape": shape, "impl": impl, "ours": ours,
                   "error": f"{type(e).__name__}: {str(e)[:300]}"}
            self.rows.append(row)
            if ours:
                self.failures.append(f"{kernel} {shape} {impl}: {row['error']}")
                self.say(f"  {kernel:<18} {shape:<34} {impl:<22} FAILED: {row['error'][:200]}")
                self.say(traceback.format_exc(limit=6))
            else:
                self.say(f"  {kernel:<18} {shape:<34} {impl:<22} unavailable ({row['error'][:80]})")
            return
        row = {"kernel": kernel, "shape": shape, "impl": impl, "ours": ours, "seconds": t,
               "iters_per_sample": iters, "bound": bound}
        if flops is not None:
            row["tflops"] = flops / t / 1e12
            row["pct_matmul_peak"] = 100 * flops / t / self.ceil["matmul_flops"]
        if nbytes is not None:
            row["tbps"] = nbytes / t / 1e12
            row["pct_bandwidth"] = 100 * nbytes / t / self.ceil["bandwidth"]
        self.rows.append(row)
        if bound == "compute":
            figure = f"{row['tflops']:8.2f} TFLOP/s {row['pct_matmul_peak']:5.1f}% of matmul peak"
        else:
            figure = f"{row['tbps']:8.3f} TB/s    {row['pct_bandwidth']:5.1f}% of bandwidth"
        self.say(f"  {kernel:<18} {shape:<34} {impl:<22} {t * 1e3:9.4f} ms {figure}")


def run(quick: bool = False, repeats: int | None = None, verbose: bool = True) -> dict:
    """Run the benchmark; returns ``{"meta", "ceilings", "rows", "failures"}``."""
    gpu = pallas_supported()
    mode = "pallas" if gpu else "interpret"
    # Our kernels' tiers, side by side: on a Hopper-class GPU both compiled tiers, elsewhere one.
    tiers = (["triton", "mosaic"] if mosaic_supported() else ["triton"]) if gpu else ["interpret"]
    dtype = jnp.bfloat16 if gpu else jnp.float32
    dt_name = jnp.dtype(dtype).name
    if repeats is None:
        repeats = (5 if quick else 10) if gpu else (2 if quick else 3)
    dev = jax.devices()[0]
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": getattr(dev, "device_kind", str(dev)), "platform": dev.platform,
        "jax": jax.__version__, "jaxlib": _jaxlib_version(),
        "kernel_mode": mode, "tiers": tiers, "dtype": dt_name, "quick": quick, "representative": gpu,
        "timing": "median of repeats; each sample = iters calls in one jitted loop (timing.InOneProgram)",
    }
    say = print if verbose else (lambda *a, **k: None)
    say(f"device: {meta['device']} ({dev.platform}), jax {jax.__version__}, our kernels: {', '.join(tiers)}")
    if not gpu:
        say(NOT_REPRESENTATIVE)
    ceil = _bench_ceilings(gpu, quick, dtype, max(3, repeats))
    say(f"ceilings: matmul {ceil['matmul_flops'] / 1e12:.3f} TFLOP/s [{ceil['matmul_method']}], "
        f"bandwidth {ceil['bandwidth'] / 1e12:.3f} TB/s [{ceil['bandwidth_method']}]")
    check = timing_check(gpu, quick, dtype, repeats)
    meta["timing_check"] = check
    say(f"timing check: XLA x @ w over a {check['nbytes'] / 2**20:,.0f} MiB weight, "
        f"{check['in_one_program_s'] * 1e3:.4f} ms a call in one program, {check['per_call_s'] * 1e3:.4f} ms "
        f"one call at a time (x{check['ratio']:.2f}; the two methods should agree within a few %); the loop "
        f"itself costs {check['loop_cost_s'] * 1e6:.2f} us a call of two arguments (in every row below)")
    rep = _Report(ceil, repeats, gpu, say)
    keys = iter(jax.random.split(jax.random.key(42), 256))
    itemsize = jnp.dtype(dtype).itemsize
    jax_attention, jax_decode = _try_import_jax_pallas_ops() if gpu else (None, None)

    # --- matmul, compute-bound (prefill-shaped)
    say("matmul (compute-bound):")
    for n in ([4096, 8192] if gpu else ([128] if quick else [256])):
        a, b = _rand(next(keys), (n, n), dtype), _rand(next(keys), (n, n), dtype)
        shape = f"{n}x{n}x{n} {dt_name}"
        for t in tiers:
            rep.record("matmul", shape, f"pallas[{t}]", lambda a, b, t=t: pk.matmul(a, b, mode=t), (a, b),
                       flops=2 * n ** 3, ours=True)
        rep.record("matmul", shape, "xla a @ b", xla_matmul, (a, b), flops=2 * n ** 3)

    # --- decode-shaped matmuls: M = batch, the weight K x N streamed once (bytes = the weight)
    say("decode-shaped matmul (bandwidth-bound; bytes = the weight):")
    if gpu:
        cases = [(f"{model} {name}", k, n) for model, projs in DECODE_PROJECTIONS.items()
                 for name, (k, n) in projs.items()]
        batches = [1, 64] if not quick else [1]
    else:
        cases, batches = [("square", 512, 512)] if not quick else [("square", 256, 256)], [1, 16]
    for label, k, n in cases:
        w = _rand(next(keys), (k, n), dtype)
        for m in batches:
            x = _rand(next(keys), (m, k), dtype)
            shape = f"{label} M{m} K{k} N{n}"
            nbytes = k * n * itemsize
            for t in tiers:
                rep.record("matmul_decode", shape, f"pallas[{t}]", lambda x, w, t=t: pk.matmul(x, w, mode=t), (x, w),
                           nbytes=nbytes, bound="memory", ours=True)
            rep.record("matmul_decode", shape, "xla x @ w", xla_matmul, (x, w), nbytes=nbytes, bound="memory")
            # The same weight quantized (pallas_kernels.quantization), read by the quantized matmul
            # (Triton tier: widened in registers). bytes = what it stores, so the % of the read
            # ceiling compares with the line above; its time against that line is the speed-up.
            # On a GPU: int8 and int4 g128 at batch 1 of the base model only (each line compiles a
            # kernel, and the gpu-check lease is short).
            formats = (("int8", None), ("int4 g32", 32), ("int4 g128", 128))
            if gpu:
                formats = formats[::2] if m == batches[0] and label.startswith("base") else ()
            for fmt, group in formats:
                q, sc = (quantization.quantize_int4(w, group) if group else quantization.quantize_int8(w))
                rep.record("matmul_decode", shape, f"{fmt} pallas[{tiers[0]}]",
                           lambda x, q, sc, g=group: pk.quantized_matmul(x, q, sc, group_size=g, mode=tiers[0]),
                           (x, q, sc), nbytes=q.nbytes + sc.nbytes, bound="memory", ours=True)
                del q, sc
        del w

    # --- flash attention (prefill), causal
    b_, t_, h_, d_ = (4, 4096, 16, 128) if gpu else ((1, 64, 2, 32) if quick else (1, 256, 4, 64))
    q, k, v = (_rand(next(keys), (b_, t_, h_, d_), dtype) for _ in range(3))
    flops = 4 * b_ * h_ * d_ * _visible_pairs(t_, t_, True)
    shape = f"B{b_} T{t_} H{h_} D{d_} causal"
    scale = d_ ** -0.5
    say("causal flash attention (compute-bound; FLOPs of the visible pairs only):")
    for t in tiers:
        rep.record("flash_attention", shape, f"pallas[{t}]",
                   lambda q, k, v, t=t: pk.flash_attention(q, k, v, causal=True, mode=t), (q, k, v),
                   flops=flops, ours=True)
    rep.record("flash_attention", shape, "xla dot_product_attn",
               lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla"),
               (q, k, v), flops=flops)
    if gpu:
        rep.record("flash_attention", shape, "cudnn dot_product_attn",
                   lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn"),
                   (q, k, v), flops=flops)
        if jax_attention is not None:
            rep.record("flash_attention", shape, "jax pallas ops mha",
                       lambda q, k, v: jax_attention.mha(q, k, v, None, sm_scale=scale, causal=True),
                       (q, k, v), flops=flops)
    del q, k, v

    # --- decode attention over a KV cache: many rows, and one long row (the length split)
    say("decode attention (bandwidth-bound; bytes = K + V read):")
    if gpu:
        decode_cases = [(64, 32, 8, 128, 4096), (1, 32, 8, 128, 32768)]
    else:
        decode_cases = [(2, 8, 2, 32, 128)] if quick else [(4, 8, 2, 64, 512), (1, 8, 2, 64, 2048)]
    for b_, hq, hkv, d_, s_ in decode_cases:
        q = _rand(next(keys), (b_, hq, d_), dtype)
        kc, vc = (_rand(next(keys), (b_, s_, hkv, d_), dtype) for _ in range(2))
        lengths = jnp.full((b_,), s_, jnp.int32)
        nbytes = 2 * b_ * s_ * hkv * d_ * itemsize
        shape = f"B{b_} Hq{hq}/Hkv{hkv} D{d_} L{s_}"
        for t in tiers:
            rep.record("decode_attention", shape, f"pallas[{t}]",
                       lambda q, k, v, n, t=t: pk.decode_attention(q, k, v, n, mode=t), (q, kc, vc, lengths),
                       nbytes=nbytes, bound="memory", ours=True)
        rep.record("decode_attention", shape, "xla reference",
                   lambda q, k, v, n: pk.reference.decode_attention(q, k, v, n), (q, kc, vc, lengths),
                   nbytes=nbytes, bound="memory")
        if gpu and jax_decode is not None:
            rep.record("decode_attention", shape, "jax pallas ops gqa",
                       lambda q, k, v, n: jax_decode.gqa(q, k, v, kv_seq_len=n, sm_scale=d_ ** -0.5),
                       (q, kc, vc, lengths), nbytes=nbytes, bound="memory")
        del q, kc, vc

    # --- paged decode attention: the same reads through a block table (blocks of 64, which both tiers
    # take, shuffled in the pool), against XLA's gather (and, beside the lines above, the contiguous kernels)
    say("paged decode attention (bandwidth-bound; bytes = K + V read; blocks of 64, shuffled):")
    for b_, hq, hkv, d_, s_ in decode_cases:
        pages = s_ // 64
        q = _rand(next(keys), (b_, hq, d_), dtype)
        kp, vp = (_rand(next(keys), (b_ * pages + 1, 64, hkv, d_), dtype) for _ in range(2))
        order = jax.random.permutation(next(keys), b_ * pages) + 1          # block 0: the null block
        tables = order.reshape(b_, pages).astype(jnp.int32)
        lengths = jnp.full((b_,), s_, jnp.int32)
        nbytes = 2 * b_ * s_ * hkv * d_ * itemsize
        shape = f"B{b_} Hq{hq}/Hkv{hkv} D{d_} L{s_}"
        for t in tiers:
            rep.record("paged_decode_attention", shape, f"pallas[{t}]",
                       lambda q, k, v, tb, n, t=t: pk.paged_decode_attention(q, k, v, tb, n, mode=t),
                       (q, kp, vp, tables, lengths), nbytes=nbytes, bound="memory", ours=True)
        rep.record("paged_decode_attention", shape, "xla reference (gather)",
                   lambda q, k, v, t, n: pk.reference.paged_decode_attention(q, k, v, t, n),
                   (q, kp, vp, tables, lengths), nbytes=nbytes, bound="memory")
        del q, kp, vp
    if not gpu:
        say(NOT_REPRESENTATIVE)
    for failure in rep.failures:
        say(f"ERROR: {failure}")
    return {"meta": meta, "ceilings": ceil, "rows": rep.rows, "failures": rep.failures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pallas_kernels.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and cases (on CPU: tinier shapes)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--force", action="store_true", help="replace the --json file if it exists")
    parser.add_argument("--repeats", type=int, default=None, help="timed samples per case (median reported)")
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
    if result["failures"]:
        print(f"{len(result['failures'])} of our kernels failed (see ERROR lines above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
