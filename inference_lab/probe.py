"""``python -m inference_lab probe``: prefill vs decode on this machine, in one table.

It builds the model (random weights: speed does not depend on them), measures this
machine's ceilings, times one prefill of ``--prompt-len`` tokens at batch 1 and
``--new-tokens`` decode steps from that context at each ``--batch`` size, and prints a table
with tokens/s, MFU and MBU, the prefill/decode ratio at batch 1, the device and versions.
``--json PATH`` writes the same numbers in the schema below (``schema_version`` 1), which
:func:`inference_lab.measure.load_records` reads back (e.g. a classroom's results).

Schema (every key always present)::

    {"schema_version": 1, "device", "backend", "kernels",
     "versions": {"python", "jax", "jaxlib", "flax"},
     "model": {"preset", "params", "dtype"},
     "ceilings": {"matmul_flops_per_s", "bandwidth_bytes_per_s", "method"},
     "prompt_len", "new_tokens",
     "prefill": {"batch", "prompt_len", "seconds", "prefill_tokens_per_s", "mfu"},
     "decode": [{"batch", "context", "step_seconds", "decode_tokens_per_s",
                 "bytes_per_step", "mbu", "mfu"}, ...],
     "ratio", "tp", "weight_bytes_per_device", "all_reduces_per_step"}

``--tp N`` (N > 1) splits the model over N devices with :func:`inference_lab.parallel.shard`
(on a CPU, N simulated devices sharing its cores: the timings then show the collectives'
cost, not a speed-up). ``weight_bytes_per_device`` is what device 0 holds;
``all_reduces_per_step`` is counted in the compiled decode loop's step: ``2 * n_layers``
(attention-out and MLP-down) plus 1 for the vocabulary-split embedding when N > 1 (the
vocabulary-split logits are assembled by an all-gather, not counted). With ``--tp 1`` the
model is not sharded and the count is 0.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

SCHEMA_VERSION = 1
TOP_KEYS = ("schema_version", "device", "backend", "kernels", "versions", "model", "ceilings",
            "prompt_len", "new_tokens", "prefill", "decode", "ratio", "tp",
            "weight_bytes_per_device", "all_reduces_per_step")
PREFILL_KEYS = ("batch", "prompt_len", "seconds", "prefill_tokens_per_s", "mfu")
DECODE_KEYS = ("batch", "context", "step_seconds", "decode_tokens_per_s", "bytes_per_step", "mbu", "mfu")


def _batches(text: str) -> list[int]:
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--batch {text!r}: give comma-separated integers, e.g. 1,8,32")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--batch {text!r}: every batch size must be >= 1")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m inference_lab probe",
        description="Measure prefill and decode tokens/s on this machine against its measured ceilings.")
    p.add_argument("--preset", default=None,
                   help="model preset: tiny, small, base, llama3_8b (default: base on a GPU, small elsewhere)")
    p.add_argument("--prompt-len", type=int, default=512, help="prompt length = decode context (default 512)")
    p.add_argument("--batch", type=_batches, default=[1, 8, 32], help="decode batch sizes (default 1,8,32)")
    p.add_argument("--new-tokens", type=int, default=32, help="decode steps timed per batch size (default 32)")
    p.add_argument("--kernels", default="auto", help="kernel mode: auto, pallas, interpret, reference")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel devices (default 1)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON here")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per point (default 3 on CPU, 10 elsewhere)")
    return p


def _versions() -> dict:
    import flax
    import jax
    import jaxlib

    return {"python": platform.python_version(), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "flax": flax.__version__}


def _check_tp(cfg, tp: int) -> None:
    """--tp must split the preset into whole heads and equal slices (parallel.check_degree)."""
    from inference_lab import parallel

    try:
        parallel.check_degree(cfg, tp)
    except ValueError as err:
        raise ValueError(f"--tp {tp}: {err}") from None


def _simulate_cpu_devices(tp: int) -> None:
    """Give jax's CPU backend ``tp`` devices, so ``--tp N`` runs on a laptop.

    ``jax_num_cpu_devices`` is honoured until the first jax operation (importing jax, as
    ``inference_lab`` does for its compilation cache, is fine). A GPU machine keeps its GPUs
    as the default devices (the CPU count does not change them); where jax has already
    started, nothing changes and ``make_mesh`` reports too few devices.
    """
    import jax

    try:
        if jax.config.jax_num_cpu_devices < tp:
            jax.config.update("jax_num_cpu_devices", tp)
    except RuntimeError:  # backends already initialised (e.g. called from a running program)
        pass


def run(args) -> dict:
    """Measure and return the schema-1 result (``args`` as parsed by :func:`build_parser`)."""
    import jax

    from inference_lab import hlo, measure, parallel, progress, roofline
    from inference_lab.kv_cache import KVCache
    from inference_lab.config import ModelConfig
    from inference_lab.hardware import measure_ceilings
    from inference_lab.model import Transformer

    if args.tp < 1:
        raise ValueError(f"--tp {args.tp}: the number of devices must be >= 1")
    for name in ("prompt_len", "new_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)} must be >= 1")
    if args.tp > 1:
        if args.preset:  # a degree that cannot split the model fails before any device work
            _check_tp(ModelConfig.preset(args.preset), args.tp)
        _simulate_cpu_devices(args.tp)
    preset = args.preset or ("base" if jax.default_backend() == "gpu" else "small")
    cfg = ModelConfig.preset(preset)
    batches = sorted(set(args.batch) | {1})  # batch 1 is always measured: `ratio` needs it
    model = Transformer(cfg, kernels=args.kernels)
    if args.tp > 1:
        _check_tp(cfg, args.tp)
        model = parallel.shard(model, parallel.make_mesh(args.tp))
    spec = measure_ceilings(cfg.dtype, verbose=True)

    limit = measure.device_memory_bytes()
    for b in batches:
        need = roofline.memory_needed(cfg, b, args.prompt_len + args.new_tokens, tp=args.tp)
        if limit is not None and need > limit:
            raise ValueError(f"--batch {b} with --prompt-len {args.prompt_len} needs {need / 1e9:.1f} GB "
                             f"(roofline.memory_needed) but the device has {limit / 1e9:.1f} GB; "
                             "use smaller --batch or --prompt-len")

    # A bar with the time left, on stderr (the table goes to stdout); see inference_lab.progress.
    with progress.bar(total=1 + len(batches), desc="probe", unit="point") as bar:
        bar.set_postfix_str(f"prefill batch 1 prompt {args.prompt_len}")
        pre = measure.measure_prefill(model, 1, args.prompt_len, repeats=args.repeats, ceilings=spec)
        bar.update(1)
        decs = []
        for b in batches:
            bar.set_postfix_str(f"decode batch {b} context {args.prompt_len}")
            decs.append(measure.measure_decode(model, b, args.prompt_len, args.new_tokens,
                                               repeats=args.repeats, ceilings=spec))
            bar.update(1)
    # Collectives are counted in the compiled decode loop (its body is one step), not assumed.
    shape_cache = KVCache.create(cfg, 1, args.prompt_len + args.new_tokens)
    hlo_text = hlo.compiled_decode_text(model, shape_cache, steps=args.new_tokens)
    del shape_cache

    b1 = next(d for d in decs if d.batch == 1)
    return {
        "schema_version": SCHEMA_VERSION,
        "device": pre.device, "backend": pre.backend, "kernels": pre.kernels,
        "versions": _versions(),
        "model": {"preset": cfg.name, "params": cfg.num_params, "dtype": cfg.dtype},
        "ceilings": {"matmul_flops_per_s": spec.peak_flops(cfg.dtype), "bandwidth_bytes_per_s": spec.bandwidth,
                     "method": f"matmul: {spec.sources.get('flops', '?')}; bandwidth: {spec.sources.get('bandwidth', '?')}"},
        "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
        "prefill": {"batch": pre.batch, "prompt_len": pre.prompt_len, "seconds": pre.seconds,
                    "prefill_tokens_per_s": pre.prefill_tokens_per_s, "mfu": pre.mfu},
        "decode": [{"batch": d.batch, "context": d.context, "step_seconds": d.step_seconds,
                    "decode_tokens_per_s": d.decode_tokens_per_s, "bytes_per_step": d.bytes_per_step,
                    "mbu": d.mbu, "mfu": d.mfu} for d in decs],
        "ratio": pre.prefill_tokens_per_s / b1.decode_tokens_per_s,
        "tp": args.tp,
        "weight_bytes_per_device": parallel.weight_bytes_per_device(model),
        "all_reduces_per_step": hlo.count_all_reduces(hlo_text),
    }


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def format_table(r: dict) -> str:
    """The probe's one table (plus a header and a footer line), as text."""
    v = r["versions"]
    c = r["ceilings"]
    lines = [
        f"Inference Lab probe: {r['device']} ({r['backend']}), kernels={r['kernels']}, "
        f"model {r['model']['preset']} ({r['model']['params'] / 1e6:,.1f}M params, {r['model']['dtype']})",
        f"versions: python {v['python']}, jax {v['jax']}, jaxlib {v['jaxlib']}, flax {v['flax']}",
        f"ceilings (measured here): matmul {c['matmul_flops_per_s'] / 1e12:,.3f} TFLOP/s, "
        f"bandwidth {c['bandwidth_bytes_per_s'] / 1e9:,.1f} GB/s",
        "",
        f"{'phase':<8} {'batch':>5} {'context':>7} {'time':>14} {'tokens/s':>12} {'MFU':>5} {'MBU':>5}",
    ]
    p = r["prefill"]
    lines.append(f"{'prefill':<8} {p['batch']:>5} {p['prompt_len']:>7} {p['seconds'] * 1e3:>11.1f} ms "
                 f"{p['prefill_tokens_per_s']:>12,.1f} {_pct(p['mfu']):>5} {'-':>5}")
    for d in r["decode"]:
        lines.append(f"{'decode':<8} {d['batch']:>5} {d['context']:>7} {d['step_seconds'] * 1e3:>8.2f} ms/step "
                     f"{d['decode_tokens_per_s']:>9,.1f} {_pct(d['mfu']):>5} {_pct(d['mbu']):>5}")
    lines += [
        "",
        f"prefill tok/s / decode tok/s at batch 1: {r['ratio']:,.1f}x",
        f"tp {r['tp']}, weights per device {r['weight_bytes_per_device'] / 1e6:,.1f} MB, "
        f"all-reduces per decode step {r['all_reduces_per_step']} (counted in the compiled step)",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    """Parse ``argv``, measure, print the table, write ``--json``. Returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        result = run(args)
    except ValueError as err:
        print(f"probe: error: {err}", file=sys.stderr)
        return 2
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
