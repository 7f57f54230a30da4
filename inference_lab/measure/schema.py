"""What a probe file and a records file may hold, and the one careful reader of both.

A classroom folder collects files from thirty laptops: some truncated, some edited by hand,
some not probe files at all. Everything read from such a file passes two gates:

1. :func:`read_json`: a regular file of at most ``MAX_FILE_BYTES``, UTF-8, valid JSON,
   without ``NaN``/``Infinity``, numbers that overflow a float, or nesting too deep to parse.
2. A JSON Schema (``PROBE_V1``, ``PROBE_V2``, ``PREFILL_ROW``, ``DECODE_ROW``), checked with
   the ``jsonschema`` package: every key the lab reads is present and of its type, every
   count and length is a bounded integer, every time and rate a positive number below a
   physical bound.

Either gate raises ``ValueError`` with one line saying what is wrong and where (a JSON path
such as ``decode/0/step_seconds``); :func:`inference_lab.measure.records.load_records` turns it into
the reason a file was skipped.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from pathlib import Path

from inference_lab.base import hardware

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
MAX_FILE_BYTES = 4 * 2**20          # a probe file is ~2 KB; a sweep's records file ~100 KB

# Bounds: generous for any real machine, small enough that nothing downstream runs long.
_BATCH = {"type": "integer", "minimum": 1, "maximum": 2**16}
_LENGTH = {"type": "integer", "minimum": 1, "maximum": 2**21}          # tokens of prompt or context
_STEPS = {"type": "integer", "minimum": 1, "maximum": 2**20}
_COUNT = {"type": "integer", "minimum": 0, "maximum": 2**20}
_SECONDS = {"type": "number", "exclusiveMinimum": 0, "maximum": 1e6}
_RATE = {"type": "number", "exclusiveMinimum": 0, "maximum": 1e18}      # tokens/s, FLOP/s, bytes/s
_OPT_AMOUNT = {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1e21}  # FLOPs or bytes
# MFU, MBU: may pass 1 on a CPU cache; a measured one is never near 0 (a figure is divided by it)
_FRACTION = {"type": ["number", "null"], "minimum": 1e-9, "maximum": 1e3}
_TEXT = {"type": "string", "minLength": 1, "maxLength": 200}
_WORD = {"type": "string", "minLength": 1, "maxLength": 40}
_KERNELS = {"enum": ["pallas", "triton", "mosaic", "interpret", "mosaic_interpret", "reference"]}
_DTYPE = {"enum": ["float32", "bfloat16", "float16"]}
MACHINE_ID_PATTERN = "^[0-9a-f]{8}$"   # with maxLength 8: Python's `$` also matches before a final newline
MACHINE = {
    "type": "object", "required": ["id", "name", "processor"], "additionalProperties": False,
    "properties": {"id": {"type": "string", "pattern": MACHINE_ID_PATTERN, "maxLength": 8},
                   "name": {"type": ["string", "null"], "minLength": 1, "maxLength": 40},
                   "processor": _TEXT},
}

# Newer files only (optional): upper over lower quartile of the point's repeats, for the verdicts' noise.
_SPREAD = {"type": ["number", "null"], "minimum": 1, "maximum": 1e6}
# a machine's measured ceilings: the bounds its ceilings cache is held to (base.hardware)
_CEILING = {k: {"type": "number", "minimum": lo, "maximum": hi} for k, (lo, hi) in hardware.CEILING_BOUNDS.items()}
# Newer files only (optional): what making the point's programs cost in its warm-up (null: not recorded).
_COMPILE = {"type": ["number", "null"], "minimum": 0, "maximum": 1e6}
_PREFILL = {
    "type": "object", "required": ["batch", "prompt_len", "seconds", "prefill_tokens_per_s", "mfu"],
    "properties": {"batch": _BATCH, "prompt_len": _LENGTH, "seconds": _SECONDS,
                   "prefill_tokens_per_s": _RATE, "mfu": _FRACTION, "spread": _SPREAD, "compile_seconds": _COMPILE},
}
_DECODE = {
    "type": "object",
    "required": ["batch", "context", "step_seconds", "decode_tokens_per_s", "bytes_per_step", "mbu", "mfu"],
    "properties": {"batch": _BATCH, "context": _LENGTH, "step_seconds": _SECONDS, "decode_tokens_per_s": _RATE,
                   "bytes_per_step": _OPT_AMOUNT, "mbu": _FRACTION, "mfu": _FRACTION, "spread": _SPREAD,
                   "compile_seconds": _COMPILE},
}

PROBE_V1 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "inference_lab probe result, schema_version 1",
    "type": "object",
    "required": ["schema_version", "device", "backend", "kernels", "versions", "model", "ceilings",
                 "prompt_len", "new_tokens", "prefill", "decode", "ratio", "tp",
                 "weight_bytes_per_device", "all_reduces_per_step"],
    "properties": {
        "schema_version": {"const": 1},
        "device": _TEXT, "backend": _WORD, "kernels": _KERNELS,
        "versions": {"type": "object", "maxProperties": 16,
                     "additionalProperties": {"type": "string", "maxLength": 100}},
        "model": {"type": "object", "required": ["preset", "params", "dtype"],
                  "properties": {"preset": _WORD, "params": {"type": "integer", "minimum": 0, "maximum": 1e13},
                                 "dtype": _DTYPE}},
        "ceilings": {"type": "object", "maxProperties": 16},
        "prompt_len": _LENGTH, "new_tokens": _STEPS,
        "prefill": _PREFILL,
        "decode": {"type": "array", "minItems": 1, "maxItems": 64, "items": _DECODE},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1e9},
        "tp": {"type": "integer", "minimum": 1, "maximum": 4096},
        "weight_bytes_per_device": {"type": "integer", "minimum": 0, "maximum": 1e15},
        "all_reduces_per_step": _COUNT,
    },
}


# The measured model's shape (optional, newer files): what the FLOPs and bytes of its steps need
# (analytic.costs), so a file of a model no preset names (probe --model DIR) keeps its MFU and MBU
# computable when a class loads it. Sizes are bounded as ModelConfig bounds nothing: 2**24.
_SIZE = {"type": "integer", "minimum": 1, "maximum": 2**24}
_SIZES = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "max_seq_len")
SHAPE_FIELDS = (*_SIZES, "tie_embeddings", "qkv_bias")   # the ModelConfig fields a probe file keeps
SHAPE = {"type": "object", "required": list(SHAPE_FIELDS), "additionalProperties": False,
         "properties": {**{f: _SIZE for f in _SIZES}, "tie_embeddings": {"type": "boolean"},
                        "qkv_bias": {"type": "boolean"}}}


def _v2() -> dict:
    s = copy.deepcopy(PROBE_V1)
    s["title"] = "inference_lab probe result, schema_version 2"
    s["required"] += ["machine", "complete", "skipped"]
    s["additionalProperties"] = False
    p = s["properties"]
    p["schema_version"] = {"const": 2}
    p["machine"] = MACHINE
    # bandwidth: the rate memory is read (what decode does); copy_bandwidth (optional, newer files):
    # an in-place copy's read + write rate, reported beside it.
    p["ceilings"] = {"type": "object", "required": ["matmul_flops_per_s", "bandwidth_bytes_per_s", "method"],
                     "additionalProperties": False,
                     "properties": {"matmul_flops_per_s": _CEILING["flops"], "bandwidth_bytes_per_s": _CEILING["bandwidth"],
                                    "copy_bandwidth_bytes_per_s": _CEILING["copy_bandwidth"],
                                    "method": {"type": "string", "maxLength": 500}}}
    # Optional (newer files): batch-1 decode as a streaming server runs it, one token to the host
    # at a time, beside the compiled loop's steps in "decode".
    # loop_step_seconds: the compiled loop's step, timed side by side with it.
    p["streamed_decode"] = {"type": ["object", "null"],
                            "required": ["batch", "context", "step_seconds", "decode_tokens_per_s", "loop_step_seconds"],
                            "additionalProperties": False,
                            "properties": {"batch": {"const": 1}, "context": _LENGTH, "step_seconds": _SECONDS,
                                           "decode_tokens_per_s": _RATE, "loop_step_seconds": _SECONDS}}
    # A partial result (interrupted, or a batch size out of memory) keeps what was measured:
    p["decode"] = dict(p["decode"], minItems=0)
    p["ratio"] = {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1e9}
    p["all_reduces_per_step"] = dict(_COUNT, type=["integer", "null"])
    p["complete"] = {"type": "boolean"}
    # Which kernels ran (pallas_kernels.mode.tier): optional, so older version-2 files still load.
    p["kernel_tier"] = {"enum": ["triton", "mosaic", "mosaic+triton", "reference"]}
    # The weights' format (optional, newer files): none, int8, or int4 with its group size.
    p["model"] = copy.deepcopy(p["model"])
    p["model"]["properties"].update(quantization={"enum": ["none", "int8", "int4"]},
                                    group_size={"enum": [None, 32, 64, 128]},
                                    kv_cache_dtype={"enum": ["auto", "int8"]}, shape=SHAPE)
    p["skipped"] = {"type": "array", "maxItems": 64,
                    "items": {"type": "object", "required": ["batch", "reason"], "additionalProperties": False,
                              "properties": {"batch": _BATCH, "reason": {"type": "string", "maxLength": 500}}}}
    return s


PROBE_V2 = _v2()
PROBES = {1: PROBE_V1, 2: PROBE_V2}

# One record of a records file (save_records): the dataclass fields, by phase.
_COMMON_ROW = {"device": _TEXT, "backend": _WORD, "kernels": _WORD, "preset": _WORD, "dtype": _DTYPE,
               "batch": _BATCH, "mfu": _FRACTION, "repeats": _COUNT,
               "spread": {"type": ["number", "null"], "minimum": 1, "maximum": 1e6},
               "machine_id": {"type": ["string", "null"], "pattern": MACHINE_ID_PATTERN, "maxLength": 8},
               "machine_name": {"type": ["string", "null"], "minLength": 1, "maxLength": 200},
               "processor": {"type": ["string", "null"], "minLength": 1, "maxLength": 200}}
PREFILL_ROW = {
    "type": "object",
    "required": ["device", "backend", "kernels", "preset", "dtype", "batch", "prompt_len", "seconds",
                 "prefill_tokens_per_s", "flops", "bytes", "mfu"],
    "properties": dict(_COMMON_ROW, phase={"const": "prefill"}, prompt_len=_LENGTH, seconds=_SECONDS,
                       prefill_tokens_per_s=_RATE, flops=_OPT_AMOUNT, bytes=_OPT_AMOUNT),
}
DECODE_ROW = {
    "type": "object",
    "required": ["device", "backend", "kernels", "preset", "dtype", "batch", "context", "step_seconds",
                 "decode_tokens_per_s", "bytes_per_step", "flops_per_step", "mbu", "mfu"],
    "properties": dict(_COMMON_ROW, phase={"const": "decode"}, context=_LENGTH, step_seconds=_SECONDS,
                       decode_tokens_per_s=_RATE, bytes_per_step=_OPT_AMOUNT, flops_per_step=_OPT_AMOUNT,
                       mbu=_FRACTION, steps=_COUNT),
}
ROWS = {"prefill": PREFILL_ROW, "decode": DECODE_ROW}


# ----------------------------------------------------------------------------- reading
def _no_constant(name):
    raise ValueError(f"the number {name} is not allowed (only finite numbers are)")


def _finite_float(text):
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"the number {text[:20]} is out of range")
    return x


def _bounded_int(text):
    if len(text) > 30:
        raise ValueError(f"the integer {text[:12]}... has {len(text)} digits")
    return int(text)


def unique_keys(pairs):
    """A JSON object whose keys are all different (two values for one key: which would count?)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"the key {twice[:40]!r} appears twice in one object")
    return out


def read_json(path) -> object:
    """The JSON value in ``path``, or a one-line ``ValueError`` saying why it cannot be read."""
    path = Path(path)
    if not path.is_file():  # a folder, a FIFO, a device or a looping link would hang or fail a read
        raise ValueError("is not a regular file" + (" (a link that leads nowhere or to itself)"
                                                    if path.is_symlink() else ""))
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ValueError(f"is {size:,} bytes; probe and records files are under {MAX_FILE_BYTES:,}")
    with path.open("rb") as fh:
        raw = fh.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"is over {MAX_FILE_BYTES:,} bytes")
    if not raw.strip():
        raise ValueError("is empty")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"is not UTF-8 text (byte {err.start} is {raw[err.start]:#04x})") from None
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float, parse_int=_bounded_int,
                          object_pairs_hook=unique_keys)
    except RecursionError:
        raise ValueError("is nested too deeply to be a probe or records file") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}; "
                         "truncated?)") from None
    except ValueError as err:
        raise ValueError(f"is not valid JSON: {err}") from None


@functools.lru_cache(maxsize=None)
@functools.cache
def _validator(key):
    """One checked validator per schema, made once (a classroom folder holds thousands of files)."""
    import jsonschema

    schema = PROBES[key] if isinstance(key, int) else ROWS[key]
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _first_error(key, data, where: str = "") -> str | None:
    import jsonschema

    err = jsonschema.exceptions.best_match(_validator(key).iter_errors(data))
    if err is None:
        return None
    at = "/".join(str(p) for p in err.absolute_path)
    message = err.message
    if len(message) > 160:   # jsonschema puts the value first: shorten the value, keep what is wrong with it
        value = repr(err.instance)
        rule = repr(err.validator_value)
        message = (f"{value[:60]}{'...' if len(value) > 60 else ''} fails {err.validator}="
                   f"{rule[:60]}{'...' if len(rule) > 60 else ''}")
    return f"{where}{at or 'top level'}: {message}"


def probe_version(data) -> int:
    """The schema_version of a probe file's object (1 or 2), or a ValueError saying why not."""
    v = data.get("schema_version")
    if isinstance(v, bool) or not isinstance(v, int) or v not in READABLE_VERSIONS:
        shown = json.dumps(v) if isinstance(v, (bool, int, float, str, type(None))) else type(v).__name__
        raise ValueError(f"schema_version is {shown[:40]}; this lab reads the integers "
                         f"{' and '.join(map(str, READABLE_VERSIONS))}")
    return v


def validate_probe(data) -> int:
    """Check a probe file's object against its schema; returns its version."""
    version = probe_version(data)
    problem = _first_error(version, data)
    if problem:
        raise ValueError(f"does not follow probe schema_version {version}: {problem}")
    return version


def validate_row(phase: str, row: dict, where: str) -> None:
    """Check one record of a records file (``where`` names it, e.g. ``"record 3: "``)."""
    problem = _first_error(phase, row, where)
    if problem:
        raise ValueError(problem)
