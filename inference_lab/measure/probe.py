"""``python -m inference_lab probe``: prefill vs decode on this machine, in one table.

It builds the model (random weights: speed does not depend on them), measures this
machine's ceilings, times one prefill of ``--prompt-len`` tokens at batch 1 and
``--new-tokens`` decode steps from that context at each ``--batch`` size, and prints a table
with tokens/s, MFU and MBU, the prefill/decode ratio at batch 1, the device and versions.
``--json PATH`` writes the same numbers in the schema below (``schema_version`` 2, checked by
:mod:`inference_lab.measure.schema`), which :func:`inference_lab.measure.timing.load_records` reads
back (e.g. a classroom's results). ``--json FOLDER`` names the file after this machine
(:func:`filename`), so thirty laptops' files never collide. The path is checked before
anything is measured (a missing or unwritable folder, an empty name, or an existing file
without ``--force`` is refused with exit code 2), and the file is written after every
measured point, whole or not at all: an interrupt (exit code 130) or a batch size that runs
out of memory keeps what was measured, with ``"complete": false``.

Schema (every key always present)::

    {"schema_version": 2, "machine": {"id", "name", "processor"},
     "device", "backend", "kernels",
     "versions": {"python", "jax", "jaxlib", "flax"},
     "model": {"preset", "params", "dtype"},
     "ceilings": {"matmul_flops_per_s", "bandwidth_bytes_per_s", "method"},
     "prompt_len", "new_tokens",
     "prefill": {"batch", "prompt_len", "seconds", "prefill_tokens_per_s", "mfu"},
     "decode": [{"batch", "context", "step_seconds", "decode_tokens_per_s",
                 "bytes_per_step", "mbu", "mfu"}, ...],
     "ratio", "tp", "weight_bytes_per_device", "all_reduces_per_step",
     "complete", "skipped": [{"batch", "reason"}, ...]}

``machine.id`` is this machine's random id (:func:`inference_lab.base.disk_cache.machine_id`),
``machine.name`` what ``--name`` chose (or null), ``machine.processor`` the CPU or GPU model;
no host or user name is written. ``ratio`` and ``all_reduces_per_step`` are null until
measured.

``--tp N`` (N > 1) splits the model over N devices with :func:`inference_lab.model.parallel.shard`
(on a CPU, N simulated devices sharing its cores: the timings then show the collectives'
cost, not a speed-up). ``weight_bytes_per_device`` is what device 0 holds;
``all_reduces_per_step`` is counted in the compiled decode loop's step: ``2 * n_layers``
(attention-out and MLP-down) plus 1 for the vocabulary-split embedding when N > 1 (the
vocabulary-split logits are assembled by an all-gather, not counted). With ``--tp 1`` the
model is not sharded and the count is 0.
"""

from __future__ import annotations

import json
import platform
import sys

# The arguments and their checks live in probe_args; probe.* keeps the names.
from inference_lab.measure.probe_args import build_parser, check_args, filename, machine, mode_error  # noqa: F401
from inference_lab.measure.probe_args import _simulate_cpu_devices, output_path, preset_for
from inference_lab.measure.schema import SCHEMA_VERSION

TOP_KEYS = ("schema_version", "machine", "device", "backend", "kernels", "kernel_tier", "versions", "model", "ceilings",
            "prompt_len", "new_tokens", "prefill", "decode", "ratio", "tp",
            "weight_bytes_per_device", "all_reduces_per_step", "complete", "skipped")
PREFILL_KEYS = ("batch", "prompt_len", "seconds", "prefill_tokens_per_s", "mfu")
DECODE_KEYS = ("batch", "context", "step_seconds", "decode_tokens_per_s", "bytes_per_step", "mbu", "mfu")


def _versions() -> dict:
    import flax
    import jax
    import jaxlib

    return {"python": platform.python_version(), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "flax": flax.__version__}


def _check_memory(cfg, args, batches) -> None:
    from inference_lab.measure import timing as measure
    from inference_lab.analytic import roofline

    limit = measure.device_memory_bytes()
    for b in batches:
        need = roofline.memory_needed(cfg, b, args.prompt_len + args.new_tokens, tp=args.tp)
        if limit is not None and need > limit:
            raise ValueError(f"--batch {b} with --prompt-len {args.prompt_len} and --new-tokens {args.new_tokens} "
                             f"needs {need / 1e9:.1f} GB (roofline.memory_needed) but this process may use "
                             f"{limit / 1e9:.1f} GB; use a smaller --batch, --prompt-len or --new-tokens")


def run(args, *, save=None) -> dict:
    """Measure and return the schema-2 result (``args`` as parsed by :func:`build_parser`).

    ``save(result)`` is called after every measured point with the result so far
    (``"complete": false`` until the last). A decode batch size that runs out of memory is
    skipped with its reason, and so are the larger ones after it; the result says so.
    """
    import jax

    from inference_lab.runtime import hlo
    from inference_lab.measure import timing as measure
    from inference_lab.model import parallel
    from inference_lab.base import progress
    from inference_lab.base.config import ModelConfig
    from inference_lab.base.hardware import measure_ceilings
    from inference_lab.model.kv_cache import KVCache
    from inference_lab.model.transformer import Transformer
    from pallas_kernels import mode as pk_mode

    check_args(args)
    cfg = ModelConfig.preset(preset_for(args))
    batches = sorted(set(args.batch) | {1})  # batch 1 is always measured: `ratio` needs it
    model = Transformer(cfg, kernels=args.kernels)
    if args.tp > 1:
        model = parallel.shard(model, parallel.make_mesh(args.tp))
    _check_memory(cfg, args, batches)
    spec = measure_ceilings(cfg.dtype, verbose=True)
    r = {"schema_version": SCHEMA_VERSION, "machine": machine(args.name),
         "device": jax.devices()[0].device_kind, "backend": jax.default_backend(), "kernels": model.kernels,
         "kernel_tier": pk_mode.tier(model.kernels), "versions": _versions(),   # replaced by what ran, below
         "model": {"preset": cfg.name, "params": cfg.num_params, "dtype": cfg.dtype},
         "ceilings": {"matmul_flops_per_s": spec.peak_flops(cfg.dtype), "bandwidth_bytes_per_s": spec.bandwidth,
                      "method": f"matmul: {spec.sources.get('flops', '?')}; "
                                f"bandwidth: {spec.sources.get('bandwidth', '?')}"[:500]},
         "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "prefill": None, "decode": [],
         "ratio": None, "tp": args.tp, "weight_bytes_per_device": parallel.weight_bytes_per_device(model),
         "all_reduces_per_step": None, "complete": False, "skipped": []}
    # A bar with the time left, on stderr (the table goes to stdout); see inference_lab.base.progress.
    # record_tiers: which kernel tier each traced call actually chose (fallbacks included).
    with progress.bar(total=1 + len(batches), desc="probe", unit="point") as bar, pk_mode.record_tiers() as ran:
        bar.set_postfix_str(f"prefill batch 1 prompt {args.prompt_len}")
        try:
            pre = measure.measure_prefill(model, 1, args.prompt_len, repeats=args.repeats, ceilings=spec)
        except Exception as err:  # noqa: BLE001 - out of memory is said plainly, anything else re-raised
            if not measure._is_oom(err):
                raise
            raise ValueError(f"the prefill of --prompt-len {args.prompt_len} ran out of memory "
                             f"({str(err).splitlines()[0][:120]}); use a smaller --prompt-len or --preset") from None
        r["prefill"] = {"batch": pre.batch, "prompt_len": pre.prompt_len, "seconds": pre.seconds,
                        "prefill_tokens_per_s": pre.prefill_tokens_per_s, "mfu": pre.mfu}
        _saved(save, r)
        bar.update(1)
        oom = None
        for b in batches:
            bar.set_postfix_str(f"decode batch {b} context {args.prompt_len}")
            oom = _decode_point(model, r, pre, b, oom, args, spec, save)
            bar.update(1)
    if ran:
        r["kernel_tier"] = "+".join(sorted(ran)) if ran != {"reference"} else "reference"
    if r["decode"]:
        # Collectives are counted in the compiled decode loop (its body is one step), not assumed.
        shape_cache = KVCache.create(cfg, 1, args.prompt_len + args.new_tokens)
        r["all_reduces_per_step"] = hlo.count_all_reduces(
            hlo.compiled_decode_text(model, shape_cache, steps=args.new_tokens))
        del shape_cache
    r["complete"] = not r["skipped"]
    _saved(save, r)
    return r


def _decode_point(model, r: dict, pre, b: int, oom, args, spec, save):
    """Measure decode at batch ``b`` into ``r`` (or skip it after an earlier out-of-memory);
    returns the batch that ran out of memory, if any."""
    from inference_lab.measure import timing as measure

    if oom is not None:
        r["skipped"].append({"batch": b, "reason": f"not tried: batch {oom} ran out of memory"})
        return oom
    try:
        d = measure.measure_decode(model, b, args.prompt_len, args.new_tokens, repeats=args.repeats, ceilings=spec)
    except Exception as err:  # noqa: BLE001
        if not measure._is_oom(err):
            raise
        r["skipped"].append({"batch": b, "reason": f"out of memory: {str(err).splitlines()[0][:160]}"})
        _saved(save, r)
        return b
    r["decode"].append({"batch": d.batch, "context": d.context, "step_seconds": d.step_seconds,
                        "decode_tokens_per_s": d.decode_tokens_per_s, "bytes_per_step": d.bytes_per_step,
                        "mbu": d.mbu, "mfu": d.mfu})
    if d.batch == 1:
        r["ratio"] = pre.prefill_tokens_per_s / d.decode_tokens_per_s
    _saved(save, r)
    return None


def _saved(save, r: dict) -> None:
    if save is not None:
        save(r)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def format_table(r: dict) -> str:
    """The probe's one table (plus a header and a footer line), as text."""
    v = r["versions"]
    c = r["ceilings"]
    m = r["machine"]
    lines = [
        f"Inference Lab probe: {r['device']} ({r['backend']}), kernels={r['kernels']}"
        + (f" ({r['kernel_tier']} tier)" if r.get("kernel_tier") and r["kernel_tier"] != "reference" else "") + ", "
        f"model {r['model']['preset']} ({r['model']['params'] / 1e6:,.1f}M params, {r['model']['dtype']})",
        f"machine: {m['name'] or m['processor']} #{m['id']}",
        f"versions: python {v['python']}, jax {v['jax']}, jaxlib {v['jaxlib']}, flax {v['flax']}",
        f"ceilings (measured here): matmul {c['matmul_flops_per_s'] / 1e12:,.3f} TFLOP/s, "
        f"bandwidth {c['bandwidth_bytes_per_s'] / 1e9:,.1f} GB/s",
        "",
        f"{'phase':<8} {'batch':>5} {'context':>7} {'time':>14} {'tokens/s':>12} {'MFU':>5} {'MBU':>5}",
    ]
    p = r["prefill"]
    if p is not None:
        lines.append(f"{'prefill':<8} {p['batch']:>5} {p['prompt_len']:>7} {p['seconds'] * 1e3:>11.1f} ms "
                     f"{p['prefill_tokens_per_s']:>12,.1f} {_pct(p['mfu']):>5} {'-':>5}")
    for d in r["decode"]:
        lines.append(f"{'decode':<8} {d['batch']:>5} {d['context']:>7} {d['step_seconds'] * 1e3:>8.2f} ms/step "
                     f"{d['decode_tokens_per_s']:>9,.1f} {_pct(d['mfu']):>5} {_pct(d['mbu']):>5}")
    for s in r["skipped"]:
        lines.append(f"{'decode':<8} {s['batch']:>5} skipped: {s['reason']}")
    ratio = "-" if r["ratio"] is None else f"{r['ratio']:,.1f}x"
    reduces = "-" if r["all_reduces_per_step"] is None else r["all_reduces_per_step"]
    lines += [
        "",
        f"prefill tok/s / decode tok/s at batch 1: {ratio}",
        f"tp {r['tp']}, weights per device {r['weight_bytes_per_device'] / 1e6:,.1f} MB, "
        f"all-reduces per decode step {reduces} (counted in the compiled step)",
    ]
    if not r["complete"]:
        lines.append("PARTIAL RESULT: not every point was measured (see above)")
    return "\n".join(lines)


def write(path, result: dict) -> None:
    """``result`` as JSON at ``path``, whole or not at all (finite numbers only)."""
    from pallas_kernels.files import atomic_write_text

    atomic_write_text(path, json.dumps(result, indent=1, allow_nan=False))


def main(argv=None) -> int:
    """Parse ``argv``, check everything that can be checked, measure, print the table and
    write ``--json`` as it goes. Returns the exit code: 0, 2 for a bad argument or path
    (before anything runs), 1 if the file cannot be written, 130 when interrupted."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # argparse printed its one-line error (after the usage line)
        return int(stop.code or 0)
    if args.tp > 1:  # before anything starts jax's backends (the kernel-mode check does)
        _simulate_cpu_devices(args.tp)
    error = mode_error("probe") if args.kernels == "auto" else None
    if error:
        print(error, file=sys.stderr)
        return 2
    try:
        check_args(args)
        path = output_path(args)
    except ValueError as err:
        print(f"probe: error: {err}", file=sys.stderr)
        return 2
    latest = {}

    def save(r):
        latest["result"] = r
        if path is not None:
            write(path, r)

    try:
        result = run(args, save=save)
    except ValueError as err:
        print(f"probe: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        kept = latest.get("result")
        if kept is None:
            print("probe: interrupted before the first point was measured; nothing written", file=sys.stderr)
        else:
            print(format_table(kept))
            where = f"; wrote them to {path}" if path is not None else ""
            print(f"probe: interrupted: kept the {1 + len(kept['decode'])} point(s) measured{where} "
                  "(marked \"complete\": false)", file=sys.stderr)
        return 130
    except OSError as err:
        print(f"probe: error: could not write {path} ({err.strerror or err}); the measurement stopped",
              file=sys.stderr)
        return 1
    print(format_table(result))
    if path is not None:
        print(f"wrote {path}" + ("" if result["complete"] else " (partial: see the skipped batch sizes)"))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
