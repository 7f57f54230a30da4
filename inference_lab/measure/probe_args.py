"""The probe's arguments: parsed, bounded and checked before anything is measured.

Each check names the flag to change: a preset that does not exist (``--preset ""`` too), a
number that is not a whole number or is out of bounds, a ``--prompt-len`` plus
``--new-tokens`` past the preset's ``max_seq_len``, a ``--tp`` that does not split the
model, a ``--json`` path that cannot be written (:func:`output_path`). The bounds are the
probe schema's, so whatever the probe writes reads back (:mod:`inference_lab.measure.schema`).
"""

from __future__ import annotations

import argparse
import re

MAX_BATCH, MAX_NEW_TOKENS = 2**16, 2**20   # the schema's bounds: what is written always reads back


# ----------------------------------------------------------------------------- arguments
class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (no usage block above it)."""

    def error(self, message):
        self.exit(2, f"probe: error: {message} (--help lists the flags)\n")


def _int_arg(flag: str, lo: int, hi: int, example: int):
    def parse(text: str) -> int:
        try:
            value = int(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; e.g. {flag} {example}")
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside {lo}..{hi:,}")
        return value
    return parse


MAX_BATCHES = 64    # decode entries a probe file may hold (the schema's maxItems)
DEFAULT_PROMPT_LEN = 512


def _batches(text: str) -> list[int]:
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers, e.g. --batch 1,8,32")
    if not values or min(values) < 1 or max(values) > MAX_BATCH:
        raise argparse.ArgumentTypeError(f"{text!r}: every batch size must be in 1..{MAX_BATCH:,}")
    if len(values) > MAX_BATCHES:
        raise argparse.ArgumentTypeError(f"{len(values)} batch sizes: a probe file holds at most {MAX_BATCHES}; "
                                         "give fewer")
    return values


def _preset(text: str) -> str:
    from inference_lab.base.config import PRESETS

    if text not in PRESETS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a preset; choose one of {', '.join(PRESETS)}")
    return text


def _name(text: str) -> str:
    name = " ".join(str(text).split())
    if not 1 <= len(name) <= 40 or not name.isprintable():
        raise argparse.ArgumentTypeError(f"{text!r}: give 1 to 40 printable characters, e.g. --name \"Ana's laptop\"")
    return name


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m inference_lab probe",
        description="Measure prefill and decode tokens/s on this machine against its measured ceilings.")
    from inference_lab.base.config import PRESETS
    from pallas_kernels.mode import MODES

    p.add_argument("--preset", type=_preset, default=None,
                   help=f"model preset: {', '.join(PRESETS)} (default: base on a GPU, small elsewhere)")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="a local Hugging Face model folder (Llama, Qwen2, Mistral: config.json and safetensors "
                        "weights) to measure instead of a preset; nothing is downloaded")
    p.add_argument("--max-model-len", type=_int_arg("--max-model-len", 1, 2**21, 2048), default=None,
                   help="with --model: positions per sequence (default: the checkpoint's, at most 2048)")
    p.add_argument("--prompt-len", type=_int_arg("--prompt-len", 1, 2**21, 512), default=None,
                   help="prompt length = decode context (default 512, or less where the preset's "
                        "max_seq_len leaves no room for --new-tokens after it)")
    p.add_argument("--batch", type=_batches, default=[1, 8, 32], help="decode batch sizes (default 1,8,32)")
    p.add_argument("--new-tokens", type=_int_arg("--new-tokens", 1, MAX_NEW_TOKENS, 32), default=32,
                   help="decode steps timed per batch size (default 32)")
    p.add_argument("--kernels", default="auto", help=f"kernel mode: {', '.join(MODES)} (pallas_kernels.mode)")
    p.add_argument("--tp", type=_int_arg("--tp", 1, 4096, 2), default=1, help="tensor-parallel devices (default 1)")
    p.add_argument("--quantization", "--quantize", choices=("none", "int8", "int4"), default="none",
                   help="measure the model with int8 or int4 weights (default: none)")
    p.add_argument("--quantize-group-size", type=int, default=None, help="int4's group size: 32, 64 or 128 (default 32)")
    p.add_argument("--kv-cache-dtype", choices=("auto", "int8"), default="auto",
                   help="the KV cache's storage: auto (the model's dtype) or int8 (a scale per token and KV head)")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also write the results as JSON to this file, or into this folder under a name "
                        "made from this machine")
    p.add_argument("--force", action="store_true", help="replace the --json file if it exists")
    p.add_argument("--name", type=_name, default=None,
                   help="a name for this machine on the classroom chart (default: its processor)")
    p.add_argument("--repeats", type=_int_arg("--repeats", 1, 1000, 5), default=None,
                   help="timed repeats per point (default 5 on CPU, 10 elsewhere)")
    return p


def mode_error(command: str) -> str | None:
    """The one line ``env`` and ``probe`` both print when ``PALLAS_KERNELS_MODE`` is unusable
    here (a name that is not a mode, or ``pallas`` without a GPU that compiles it), else None."""
    from pallas_kernels import mode

    try:
        mode.check_environment()
    except ValueError as err:
        return f"{command}: error: {err}"
    return None


def filename(machine: dict, preset: str, kernels: str, quantization: str = "none", kv_cache_dtype: str = "auto") -> str:
    """``probe-<name or processor>-<id>-<preset>-<kernels>[-<int8|int4>][-kvint8].json``: unique per machine."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", machine["name"] or machine["processor"]).strip("-").lower()[:32]
    suffix = ("" if quantization == "none" else f"-{quantization}") + ("" if kv_cache_dtype == "auto" else "-kvint8")
    return f"probe-{slug.strip('-') or 'machine'}-{machine['id']}-{preset}-{kernels}{suffix}.json"


def machine(name: str | None = None) -> dict:
    """This machine as the probe file names it: ``{"id", "name", "processor"}``."""
    from inference_lab.measure.timing import machine_identity

    m = machine_identity(name)
    return {"id": m["machine_id"], "name": m["machine_name"], "processor": m["processor"]}


def _check_tp(cfg, tp: int) -> None:
    """--tp must split the preset into whole heads and equal slices (checks.tensor_parallel)."""
    from inference_lab.base import checks

    try:
        checks.tensor_parallel(cfg, tp)
    except ValueError as err:
        raise ValueError(f"--tp {tp}: {err}") from None


def simulate_cpu_devices(tp: int) -> None:
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


def preset_for(args) -> str:
    import jax

    return args.preset or ("base" if jax.default_backend() == "gpu" else "small")


def model_config(args):
    """The measured model's config: the ``--model`` folder's (read from its config.json, nothing
    else loaded) or the preset's."""
    from inference_lab.base.config import ModelConfig
    from inference_lab.model import huggingface

    if args.model is None:
        if args.max_model_len is not None:
            raise ValueError("--max-model-len applies to --model only; a preset's context is its max_seq_len")
        return ModelConfig.preset(preset_for(args))
    if args.preset:
        raise ValueError("--model and --preset: pick one (the folder's model, or a preset)")
    try:
        return huggingface.read_config(args.model, max_model_len=args.max_model_len)
    except ValueError as err:
        raise ValueError(f"--model {args.model}: {err}") from None


def model_name(args) -> str:
    """What the probe file calls the model: the preset, or the folder's name (at most 40 characters)."""
    return model_config(args).name[:40] if args.model else preset_for(args)


def check_args(args) -> None:
    """Every check that needs no measurement, with the flag to change in the message."""
    if args.tp > 1:
        if args.preset or args.model:  # a degree that cannot split the model fails before any device work
            _check_tp(model_config(args), args.tp)
        simulate_cpu_devices(args.tp)
    cfg = model_config(args)
    context = f"--max-model-len {cfg.max_seq_len}" if args.model else f"{cfg.name} preset's max_seq_len {cfg.max_seq_len}"
    if args.prompt_len is None:   # the default fits the preset: 512, or what its context leaves room for
        args.prompt_len = max(1, min(DEFAULT_PROMPT_LEN, cfg.max_seq_len - args.new_tokens))
    if args.prompt_len >= cfg.max_seq_len:
        raise ValueError(f"--prompt-len {args.prompt_len} leaves no room for --new-tokens within the {context}; "
                         "use a smaller --prompt-len")
    if args.prompt_len + args.new_tokens > cfg.max_seq_len:
        raise ValueError(f"--new-tokens {args.new_tokens}: --prompt-len {args.prompt_len} + --new-tokens "
                         f"{args.new_tokens} is past the {context}; "
                         f"use --new-tokens {cfg.max_seq_len - args.prompt_len} or fewer")
    if args.tp > 1:
        _check_tp(cfg, args.tp)
    _check_quantization(cfg, args)
    from pallas_kernels import mode

    try:
        mode.resolve_mode(args.kernels)
    except ValueError as err:
        raise ValueError(f"--kernels {args.kernels}: {err}") from None


def _check_quantization(cfg, args) -> None:
    """--quantization and --quantize-group-size against the preset, before anything is built."""
    from inference_lab.model import quantize

    if args.quantization != "int4" and args.quantize_group_size is not None:
        raise ValueError("--quantize-group-size applies to --quantization int4 only")
    if (args.quantization != "none" or args.kv_cache_dtype != "auto") and args.tp > 1:
        raise ValueError("--quantization or --kv-cache-dtype int8 with --tp: tensor parallelism splits float weights "
                         "and caches only; use --tp 1")
    group_size = quantize.group_size_for(args.quantization, args.quantize_group_size)
    try:
        cfg.replace(quantization=args.quantization, group_size=group_size)
    except ValueError as err:
        raise ValueError(f"--quantization {args.quantization}: "
                         + str(err).replace("group_size", "--quantize-group-size")) from None


def output_path(args):
    """The file ``--json`` names (a folder gets a name made from this machine), checked
    before anything is measured; None without ``--json``. ValueError if it cannot be written."""
    from pathlib import Path

    from pallas_kernels import mode
    from pallas_kernels.files import check_output_path

    if args.json is None:
        return None
    text = str(args.json)
    if text.strip() and Path(text).expanduser().is_dir():
        kernels = mode.resolve_mode(args.kernels)
        return check_output_path(Path(text).expanduser() / filename(machine(args.name), model_name(args), kernels,
                                                                       args.quantization, args.kv_cache_dtype),
                                 force=args.force, flag="--json")
    return check_output_path(text, force=args.force, flag="--json")


