"""``python -m inference_lab probe``: prefill vs decode on this machine, in one table.

It builds the model (random weights: speed does not depend on them), measures this
machine's ceilings, times one prefill of ``--prompt-len`` tokens at batch 1 and
``--new-tokens`` decode steps from that context at each ``--batch`` size, and prints a table
with tokens/s, MFU and MBU, the prefill/decode ratio at batch 1, the device and versions.
``--json PATH`` writes the same numbers in the schema below (``schema_version`` 2, checked by
:mod:`inference_lab.measure.schema`), which :func:`inference_lab.measure.records.load_records` reads
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
     "model": {"preset", "params", "dtype", "quantization", "group_size", "kv_cache_dtype",
               "shape": {"vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff",
                         "max_seq_len", "tie_embeddings", "qkv_bias"}},
     "ceilings": {"matmul_flops_per_s", "bandwidth_bytes_per_s", "copy_bandwidth_bytes_per_s", "method"},
     "prompt_len", "new_tokens",
     "prefill": {"batch", "prompt_len", "seconds", "prefill_tokens_per_s", "mfu", "spread", "compile_seconds"},
     "decode": [{"batch", "context", "step_seconds", "decode_tokens_per_s",
                 "bytes_per_step", "mbu", "mfu", "spread", "compile_seconds"}, ...],
     "streamed_decode": {"batch": 1, "context", "step_seconds", "decode_tokens_per_s", "loop_step_seconds"}
                        or null,
     "ratio", "tp", "weight_bytes_per_device", "all_reduces_per_step",
     "complete", "skipped": [{"batch", "reason"}, ...]}

``machine.id`` is this machine's random id (:func:`inference_lab.base.disk_cache.machine_id`),
``machine.name`` what ``--name`` chose (or null), ``machine.processor`` the CPU or GPU model;
no host or user name is written. ``ratio`` and ``all_reduces_per_step`` are null until
measured. ``bandwidth_bytes_per_s`` is the rate this machine *reads* memory (what each decode
step's MBU is against), ``copy_bandwidth_bytes_per_s`` an in-place copy's read + write rate beside
it. ``decode`` times steps inside one compiled loop; ``streamed_decode`` times the same batch-1
steps the way a streaming server runs them, each token copied to the host before the next step
(the per-token cost a user of a streamed answer pays on top). ``compile_seconds`` is what making
a point's programs cost in its warm-up (tracing, lowering, the backend's compile: jax's own
monitoring events, :func:`pallas_kernels.timing.compile_seconds`), also printed per point: on a
GPU the first run's minutes went there.

``--tp N`` (N > 1) splits the model over N devices with :func:`inference_lab.model.parallel.shard`
(on a CPU, N simulated devices sharing its cores: the timings then show the collectives'
cost, not a speed-up). ``weight_bytes_per_device`` is what device 0 holds;
``all_reduces_per_step`` is counted in the compiled decode loop's step: ``2 * n_layers``
(attention-out and MLP-down) plus 1 for the vocabulary-split embedding when N > 1 (the
vocabulary-split logits are assembled by an all-gather, not counted). With ``--tp 1`` the
model is not sharded and the count is 0 (nothing is compiled to count it).
"""

from __future__ import annotations

import json
import platform
import sys

from inference_lab.measure.probe_args import (build_parser, check_args, machine, mode_error, model_config,
                                              output_path, simulate_cpu_devices)
from inference_lab.measure.schema import SCHEMA_VERSION, SHAPE_FIELDS, validate_probe

TOP_KEYS = ("schema_version", "machine", "device", "backend", "kernels", "kernel_tier", "versions", "model", "ceilings",
            "prompt_len", "new_tokens", "prefill", "decode", "streamed_decode", "ratio", "tp",
            "weight_bytes_per_device", "all_reduces_per_step", "complete", "skipped")
PREFILL_KEYS = ("batch", "prompt_len", "seconds", "prefill_tokens_per_s", "mfu", "spread", "compile_seconds")
DECODE_KEYS = ("batch", "context", "step_seconds", "decode_tokens_per_s", "bytes_per_step", "mbu", "mfu", "spread",
               "compile_seconds")
STREAMED_KEYS = ("batch", "context", "step_seconds", "decode_tokens_per_s", "loop_step_seconds")


def _versions() -> dict:
    import flax
    import jax
    import jaxlib

    return {"python": platform.python_version(), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "flax": flax.__version__}


def check_memory(cfg, args, batches) -> None:
    """Every batch size must fit in this process's memory at ``--prompt-len`` + ``--new-tokens``
    (:func:`inference_lab.measure.timing.memory_problem`): a ValueError naming the flags if not."""
    from inference_lab.analytic import roofline
    from inference_lab.measure import timing

    limit = timing.device_memory_bytes()
    for b in batches:
        need = roofline.memory_needed(cfg, b, args.prompt_len + args.new_tokens, tp=args.tp)
        if timing.memory_problem(need, limit):
            raise ValueError(f"--batch {b} with --prompt-len {args.prompt_len} and --new-tokens {args.new_tokens} "
                             f"needs {need / 1e9:.1f} GB (roofline.memory_needed) but this process may use "
                             f"{limit / 1e9:.1f} GB; use a smaller --batch, --prompt-len or --new-tokens")


def run(args, *, path=None) -> dict:
    """Measure, and return the schema-2 result. ``args``: parsed by :func:`build_parser` and
    checked by :func:`check_args`; ``path``: the file to keep the result in (from
    :func:`output_path`), or None.

    The file is written here and nowhere else: after every measured point (``"complete":
    false`` until the last), whole or not at all. A decode batch size that runs out of memory is
    skipped with its reason, and so are the larger ones after it. An interrupt re-raises with
    the result so far as ``err.probe_result``."""
    import jax

    from inference_lab.base import progress
    from inference_lab.base.hardware import measure_ceilings
    from inference_lab.measure import timing
    from inference_lab.model import huggingface, parallel
    from inference_lab.model.kv_cache import KVCache
    from inference_lab.model.transformer import Transformer
    from inference_lab.runtime import hlo
    from pallas_kernels import mode as pk_mode

    cfg = model_config(args)
    batches = sorted(set(args.batch) | {1})  # batch 1 is always measured: `ratio` needs it
    check_memory(cfg, args, batches)
    model = (huggingface.load(args.model, max_model_len=args.max_model_len, kernels=args.kernels) if args.model
             else Transformer(cfg, kernels=args.kernels))
    model = model.quantized(args.quantization, args.quantize_group_size).with_kv_cache_dtype(args.kv_cache_dtype)
    if args.tp > 1:
        model = parallel.shard(model, parallel.make_mesh(args.tp))
    spec = measure_ceilings(cfg.dtype, verbose=True)
    head = {"machine": machine(args.name), "device": jax.devices()[0].device_kind, "backend": jax.default_backend(),
            "kernels": model.kernels, "kernel_tier": pk_mode.tier(model.kernels), "versions": _versions(),
            "model": {"preset": cfg.name[:40], "params": cfg.num_params, "dtype": cfg.dtype,
                      "quantization": model.cfg.quantization, "group_size": model.cfg.group_size,
                      "kv_cache_dtype": model.cfg.kv_cache_dtype,
                      "shape": {f: getattr(cfg, f) for f in SHAPE_FIELDS}},
            "ceilings": {"matmul_flops_per_s": spec.peak_flops(cfg.dtype), "bandwidth_bytes_per_s": spec.bandwidth,
                         "method": f"matmul: {spec.sources.get('flops', '?')}; "
                                   f"bandwidth (read): {spec.sources.get('bandwidth', '?')}"[:500]},
            "weight_bytes_per_device": parallel.weight_bytes_per_device(model)}
    if spec.copy_bandwidth:
        head["ceilings"]["copy_bandwidth_bytes_per_s"] = spec.copy_bandwidth
    points = ([timing.PrefillPoint(model, 1, args.prompt_len)]
              + [timing.DecodePoint(model, b, args.prompt_len, args.new_tokens) for b in batches])
    state = {"measured": timing.SweepResult(), "streamed": None, "all_reduces": None, "complete": False}

    def keep(measured=None, streamed=None):   # the one place the probe's file is written
        state.update({k: v for k, v in (("measured", measured), ("streamed", streamed)) if v is not None})
        state["result"] = result(head, args, state["measured"], state["streamed"], state["all_reduces"],
                                 state["complete"])
        if path is not None:   # the first write creates the file, unless --force lets it replace one
            write(path, state["result"], exclusive=not args.force and not state.get("written"))
            state["written"] = True

    show = progress.enabled()
    try:
        with pk_mode.record_tiers() as ran:
            measured = timing.measure_points(points, repeats=args.repeats, ceilings=spec, side_by_side=False,
                                             on_record=keep, progress=show, desc="probe")
            if not any(r.phase == "prefill" for r in measured):
                reason = measured.skipped[0][3]
                raise ValueError(f"the prefill of --prompt-len {args.prompt_len} was not measured ({reason}); "
                                 "use a smaller --prompt-len or --preset")
            if any(r.phase == "decode" and r.batch == 1 for r in measured):
                # The same batch-1 steps as a streaming server runs them, one token to the host at a
                # time, timed side by side with the compiled loop (their ratio is the per-token cost).
                pair = [timing.DecodePoint(model, 1, args.prompt_len, args.new_tokens),
                        timing.StreamedDecodePoint(model, args.prompt_len, args.new_tokens)]
                timing.measure_points(pair, repeats=args.repeats, ceilings=spec, progress=show, desc="streamed",
                                      on_record=lambda res: keep(streamed=tuple(res)) if len(res) == 2 else None)
        if ran:
            head["kernel_tier"] = "+".join(sorted(ran)) if ran != {"reference"} else "reference"
        if any(r.phase == "decode" for r in measured):
            # Collectives are counted in the compiled decode loop (its body is one step), not assumed;
            # a model on one device has no mesh to reduce over (and the count would cost a compile).
            state["all_reduces"] = 0
            if args.tp > 1:
                shape_only = KVCache.create(model.cfg, 1, args.prompt_len + args.new_tokens)
                state["all_reduces"] = hlo.count_all_reduces(
                    hlo.compiled_decode_text(model, shape_only, steps=args.new_tokens))
        state["complete"] = not measured.skipped
        keep(measured)
    except KeyboardInterrupt as err:
        err.probe_result = state.get("result")
        raise
    return state["result"]


def result(head: dict, args, measured, streamed, all_reduces, complete: bool) -> dict:
    """The probe file's object (schema version 2, keys in :data:`TOP_KEYS` order) from what was
    measured so far: the records of :func:`inference_lab.measure.timing.measure_points`, and
    ``streamed``, the (loop, streamed) batch-1 decode records timed side by side (or None)."""
    pre = next((r for r in measured if r.phase == "prefill"), None)
    loops = [r for r in measured if r.phase == "decode"]
    one = next((d for d in loops if d.batch == 1), None)
    made = getattr(measured, "compile_seconds", {})

    def entry(rec, keys, size):
        found = made.get((rec.phase, rec.batch, size))
        seconds = None if found is None else found["trace"] + found["lower"] + found["compile"]
        return {k: seconds if k == "compile_seconds" else getattr(rec, k) for k in keys}

    r = {"schema_version": SCHEMA_VERSION, **head, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
         "prefill": None if pre is None else entry(pre, PREFILL_KEYS, pre.prompt_len),
         "decode": [entry(d, DECODE_KEYS, d.context) for d in loops],
         "streamed_decode": None if streamed is None else dict(
             {k: getattr(streamed[1], k) for k in STREAMED_KEYS[:-1]}, loop_step_seconds=streamed[0].step_seconds),
         "ratio": pre.prefill_tokens_per_s / one.decode_tokens_per_s if pre is not None and one is not None else None,
         "tp": args.tp, "all_reduces_per_step": all_reduces, "complete": complete,
         "skipped": [{"batch": b, "reason": reason} for phase, b, _, reason in measured.skipped if phase == "decode"]}
    return {k: r[k] for k in TOP_KEYS}


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _seconds(point: dict) -> str:
    """A point's compile seconds (its programs made in its warm-up), "-" where not recorded."""
    seconds = point.get("compile_seconds")
    return "-" if seconds is None else f"{seconds:,.1f} s"


def format_table(r: dict) -> str:
    """The probe's one table (plus a header and a footer line), as text."""
    v = r["versions"]
    c = r["ceilings"]
    m = r["machine"]
    lines = [
        f"Inference Lab probe: {r['device']} ({r['backend']}), kernels={r['kernels']}"
        + (f" ({r['kernel_tier']} tier)" if r.get("kernel_tier") and r["kernel_tier"] != "reference" else "") + ", "
        f"model {r['model']['preset']} ({r['model']['params'] / 1e6:,.1f}M params, {r['model']['dtype']}"
        + (f", {r['model']['quantization']} weights" if r["model"].get("quantization", "none") != "none" else "")
        + (f" g{r['model']['group_size']}" if r["model"].get("group_size") else "")
        + (", int8 KV cache" if r["model"].get("kv_cache_dtype") == "int8" else "") + ")",
        f"machine: {m['name'] or m['processor']} #{m['id']}",
        f"versions: python {v['python']}, jax {v['jax']}, jaxlib {v['jaxlib']}, flax {v['flax']}",
        f"ceilings (measured here): matmul {c['matmul_flops_per_s'] / 1e12:,.3f} TFLOP/s, "
        f"read bandwidth {c['bandwidth_bytes_per_s'] / 1e9:,.1f} GB/s"
        + (f" (a copy moves {c['copy_bandwidth_bytes_per_s'] / 1e9:,.1f} GB/s read + write)"
           if c.get("copy_bandwidth_bytes_per_s") else ""),
        "",
        f"{'phase':<8} {'batch':>5} {'context':>7} {'time':>14} {'tokens/s':>12} {'MFU':>5} {'MBU':>5} {'compile':>9}",
    ]
    p = r["prefill"]
    if p is not None:
        lines.append(f"{'prefill':<8} {p['batch']:>5} {p['prompt_len']:>7} {p['seconds'] * 1e3:>11.1f} ms "
                     f"{p['prefill_tokens_per_s']:>12,.1f} {_pct(p['mfu']):>5} {'-':>5} {_seconds(p):>9}")
    for d in r["decode"]:
        lines.append(f"{'decode':<8} {d['batch']:>5} {d['context']:>7} {d['step_seconds'] * 1e3:>8.2f} ms/step "
                     f"{d['decode_tokens_per_s']:>9,.1f} {_pct(d['mfu']):>5} {_pct(d['mbu']):>5} {_seconds(d):>9}")
    for s in r["skipped"]:
        lines.append(f"{'decode':<8} {s['batch']:>5} skipped: {s['reason']}")
    streamed = r.get("streamed_decode")
    if streamed is not None:
        lines.append(f"{'streamed':<8} {1:>5} {streamed['context']:>7} {streamed['step_seconds'] * 1e3:>8.2f} ms/tok "
                     f"{streamed['decode_tokens_per_s']:>9,.1f}   (one token to the host at a time: "
                     f"{streamed['step_seconds'] / streamed['loop_step_seconds'] - 1:+.0%} per token against "
                     f"the compiled loop, {streamed['loop_step_seconds'] * 1e3:.2f} ms, timed beside it)")
    ratio = "-" if r["ratio"] is None else f"{r['ratio']:,.1f}x"
    reduces = "-" if r["all_reduces_per_step"] is None else r["all_reduces_per_step"]
    lines += [
        "",
        f"prefill tok/s / decode tok/s at batch 1: {ratio}",
        f"tp {r['tp']}, weights per device {r['weight_bytes_per_device'] / 1e6:,.1f} MB, "
        f"all-reduces per decode step {reduces} "
        + ("(counted in the compiled step)" if r["tp"] > 1 else "(one device: nothing to reduce)"),
    ]
    if not r["complete"]:
        lines.append("PARTIAL RESULT: not every point was measured (see above)")
    return "\n".join(lines)


def write(path, result: dict, *, exclusive: bool = False) -> None:
    """``result`` as JSON at ``path``, whole or not at all (finite numbers only). ``exclusive``:
    the file must not exist yet (two probes given one new name: the second is refused)."""
    from pallas_kernels.files import atomic_write

    try:   # never write what the lab's own reader would refuse
        validate_probe(result)
    except ValueError as err:
        raise ValueError(f"the measured result cannot be saved: it {err}; nothing written to {path}") from None
    text = json.dumps(result, indent=1, allow_nan=False)
    atomic_write(path, lambda fh: fh.write(text), exclusive=exclusive)


def main(argv=None) -> int:
    """Parse ``argv``, check everything that can be checked, measure, print the table and
    write ``--json`` as it goes. Returns the exit code: 0, 2 for a bad argument or path
    (before anything runs), 1 if the file cannot be written, 130 when interrupted."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # argparse printed its one-line error (after the usage line)
        return int(stop.code or 0)
    if args.tp > 1:  # before anything starts jax's backends (the kernel-mode check does)
        simulate_cpu_devices(args.tp)
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
    try:
        report = run(args, path=path)
    except ValueError as err:
        print(f"probe: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        kept = getattr(err, "probe_result", None)
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
    print(format_table(report))
    if path is not None:
        print(f"wrote {path}" + ("" if report["complete"] else " (partial: see the skipped batch sizes)"))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
