"""Honest timing of prefill and decode: what the hardware did, next to what it could do.

Rules every function here follows (and a learner can check in the code):
- random token ids, never zeros (some kernels are faster on zeros);
- a warm-up call first (it compiles), then ``block_until_ready`` around each timed call,
  and the median of the repeats;
- decode steps run inside one jitted loop with the cache donated (no Python between steps);
- the cost of a step comes from :mod:`inference_lab.roofline` (the one definition of its
  FLOPs and bytes) and is compared with ceilings *measured on this machine*
  (:func:`inference_lab.hardware.measure_ceilings`): MFU = FLOPs / time / matmul peak,
  MBU = bytes / time / bandwidth.

A decode measurement starts from a cache holding ``context`` tokens of random keys and
values (the time of a step does not depend on which tokens made the cache, and filling it
by a real prefill would cost more than the measurement on a CPU).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from inference_lab import engine, roofline
from inference_lab.cache import KVCache


# ----------------------------------------------------------------------------- records
@dataclasses.dataclass
class PrefillRecord:
    """One prefill measurement: ``batch`` prompts of ``prompt_len`` tokens in one pass."""

    device: str
    backend: str
    kernels: str
    preset: str
    dtype: str
    batch: int
    prompt_len: int
    seconds: float                 # median time of the pass
    prefill_tokens_per_s: float    # batch * prompt_len / seconds
    flops: float | None            # roofline.prefill_cost(...).flops (per device under tp)
    bytes: float | None            # roofline.prefill_cost(...).bytes
    mfu: float | None              # flops / seconds / measured matmul peak
    phase: str = "prefill"
    repeats: int = 0


@dataclasses.dataclass
class DecodeRecord:
    """One decode measurement: ``batch`` rows, each starting with ``context`` cached tokens."""

    device: str
    backend: str
    kernels: str
    preset: str
    dtype: str
    batch: int
    context: int
    step_seconds: float            # median loop time / steps
    decode_tokens_per_s: float     # batch / step_seconds (every row counts)
    bytes_per_step: float | None   # roofline.decode_cost bytes, averaged over the steps (per device under tp)
    flops_per_step: float | None
    mbu: float | None              # bytes_per_step / step_seconds / measured bandwidth
    mfu: float | None
    phase: str = "decode"
    steps: int = 0
    repeats: int = 0


RECORD_TYPES = {"prefill": PrefillRecord, "decode": DecodeRecord}


class SweepResult(list):
    """A list of records; ``.skipped`` lists (phase, batch, prompt_len, reason) not measured."""

    def __init__(self, records=(), skipped=()):
        super().__init__(records)
        self.skipped = list(skipped)


# ----------------------------------------------------------------------------- helpers
def _machine(model) -> dict:
    return {"device": jax.devices()[0].device_kind, "backend": jax.default_backend(),
            "kernels": model.mode, "preset": model.cfg.name, "dtype": model.cfg.dtype}


def _ceilings(model, ceilings):
    """"auto" -> this machine's measured ceilings in the model's dtype; None -> None."""
    if isinstance(ceilings, str):
        if ceilings != "auto":
            raise ValueError(f"ceilings={ceilings!r}: pass 'auto' (measure here), None, or a HardwareSpec")
        from inference_lab.hardware import measure_ceilings
        return measure_ceilings(model.cfg.dtype, verbose=False)
    return ceilings


def _tp(model) -> int:
    """Tensor-parallel degree of a model split by :func:`inference_lab.parallel.shard` (else 1).

    With tp > 1 the costs are per device (each device reads 1/tp of the weights and does 1/tp
    of the math), so MFU and MBU compare one device's work with one device's ceilings.
    """
    mesh = getattr(model, "mesh", None)
    return int(mesh.shape["tp"]) if mesh is not None else 1


def _check_size(name, value):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return int(value)


def _default_repeats():
    # A 2-core CPU is noisy (other programs, turbo, the notebook server): more repeats
    # steady the median there; a GPU is quiet and its steps are short.
    return 5 if jax.default_backend() == "cpu" else 10


def _repeats(repeats):
    return _default_repeats() if repeats is None else _check_size("repeats", repeats)


def _random_tokens(cfg, shape, seed):
    # Random ids over the byte range (never all zeros): timing must not ride on zeros.
    return np.random.default_rng(seed).integers(0, min(cfg.vocab_size, 256), size=shape, dtype=np.int32)


def _random_cache(cfg, batch, max_len, context, seed) -> KVCache:
    """A cache of ``batch`` rows holding ``context`` tokens of random K/V (values ~N(0,1))."""
    dt = jnp.dtype(cfg.dtype)
    shape = (batch, max_len, cfg.n_kv_heads, cfg.head_dim)
    keys = jax.random.split(jax.random.key(seed), 2 * cfg.n_layers)
    fill = jax.jit(lambda k: jax.random.normal(k, shape, jnp.float32).astype(dt))
    ks = [fill(keys[2 * i]) for i in range(cfg.n_layers)]
    vs = [fill(keys[2 * i + 1]) for i in range(cfg.n_layers)]
    lengths = np.full((batch,), context, np.int32)
    return KVCache(ks, vs, jnp.asarray(lengths), host_lengths=lengths)


# ----------------------------------------------------------------------------- measurements
def measure_prefill(model, batch: int = 1, prompt_len: int = 512, *, repeats: int | None = None,
                    ceilings="auto", seed: int = 0) -> PrefillRecord:
    """Time one prefill of ``batch`` random prompts of ``prompt_len`` tokens (median of
    ``repeats`` after a warm-up). ``ceilings``: "auto" (measured here), a HardwareSpec, or
    None (then ``mfu`` is None)."""
    batch, prompt_len = _check_size("batch", batch), _check_size("prompt_len", prompt_len)
    repeats = _repeats(repeats)
    cfg = model.cfg
    spec = _ceilings(model, ceilings)
    tokens = _random_tokens(cfg, (batch, prompt_len), seed)
    times = []
    for i in range(repeats + 1):
        cache = KVCache.create(cfg, batch, prompt_len)   # outside the timed region
        jax.block_until_ready(cache.k)
        t0 = time.perf_counter()
        logits, cache = engine.prefill(model, tokens, cache)
        jax.block_until_ready((logits, cache.k, cache.v))
        if i:  # call 0 is the warm-up (compile)
            times.append(time.perf_counter() - t0)
        del cache, logits
    seconds = statistics.median(times)
    cost = roofline.prefill_cost(cfg, batch, prompt_len, tp=_tp(model))
    mfu = cost.flops / seconds / spec.peak_flops(cfg.dtype) if spec is not None else None
    return PrefillRecord(**_machine(model), batch=batch, prompt_len=prompt_len, seconds=seconds,
                         prefill_tokens_per_s=batch * prompt_len / seconds, flops=cost.flops,
                         bytes=cost.bytes, mfu=mfu, repeats=repeats)


def measure_decode(model, batch: int = 8, context: int = 512, steps: int = 32, *,
                   repeats: int | None = None, ceilings="auto", seed: int = 0) -> DecodeRecord:
    """Time ``steps`` greedy decode steps in one jitted loop, from ``context`` cached tokens.

    ``step_seconds`` = median loop time / steps. Step i attends to ``context + i + 1`` keys,
    so ``bytes_per_step``/``flops_per_step`` are ``roofline.decode_cost`` averaged over the
    steps (the cost at the mean context).
    """
    batch, context = _check_size("batch", batch), _check_size("context", context)
    steps = _check_size("steps", steps)
    repeats = _repeats(repeats)
    cfg = model.cfg
    spec = _ceilings(model, ceilings)
    cache = _random_cache(cfg, batch, context + steps, context, seed)
    first = _random_tokens(cfg, (batch,), seed + 1)
    times = []
    for i in range(repeats + 1):
        jax.block_until_ready(cache.k)
        t0 = time.perf_counter()
        out, cache = engine.decode_loop(model, first, cache, steps)
        jax.block_until_ready((out, cache.k, cache.v))
        if i:
            times.append(time.perf_counter() - t0)
        # Rewind: the same buffers, lengths back to `context` (the steps overwrite what they wrote).
        ks, vs = cache._donate("measure_decode")
        lengths = np.full((batch,), context, np.int32)
        cache = KVCache(ks, vs, jnp.asarray(lengths), host_lengths=lengths)
    step_seconds = statistics.median(times) / steps
    costs = [roofline.decode_cost(cfg, batch, context + i, tp=_tp(model)) for i in range(steps)]
    nbytes = sum(c.bytes for c in costs) / steps
    flops = sum(c.flops for c in costs) / steps
    mbu = nbytes / step_seconds / spec.bandwidth if spec is not None else None
    mfu = flops / step_seconds / spec.peak_flops(cfg.dtype) if spec is not None else None
    return DecodeRecord(**_machine(model), batch=batch, context=context, step_seconds=step_seconds,
                        decode_tokens_per_s=batch / step_seconds, bytes_per_step=nbytes,
                        flops_per_step=flops, mbu=mbu, mfu=mfu, steps=steps, repeats=repeats)


# ----------------------------------------------------------------------------- sweeps
def device_memory_bytes() -> int | None:
    """Memory of the default device: the allocator's limit on a GPU, physical RAM on a CPU."""
    dev = jax.devices()[0]
    try:
        stats = dev.memory_stats() or {}
    except Exception:  # some backends do not implement memory_stats
        stats = {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    if dev.platform == "cpu":
        try:
            import os
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
    return None


def _is_oom(err: Exception) -> bool:
    text = str(err)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower() or isinstance(err, MemoryError)


def _progress(done: int, total: int, label: str, stream) -> None:
    width = 24
    filled = int(width * done / total) if total else width
    stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<40}")
    if done == total:
        stream.write("\n")
    stream.flush()


def sweep(model, batch_sizes=(1, 8, 32), prompt_lengths=(128, 512), *, steps: int = 16,
          phases=("prefill", "decode"), repeats: int | None = None, ceilings="auto",
          memory_bytes: int | None = None, progress: bool = True) -> SweepResult:
    """Measure every (batch, prompt length) point: a prefill of that many prompts and/or
    ``steps`` decode steps from that context. Returns a :class:`SweepResult` (a list of
    records); points that ``roofline.memory_needed`` says will not fit in ``memory_bytes``
    (default: this device's memory) are skipped before they run, and an out-of-memory error
    is caught; both land in ``result.skipped`` with the reason, and the sweep goes on."""
    for name, values in (("batch_sizes", batch_sizes), ("prompt_lengths", prompt_lengths)):
        if not values:
            raise ValueError(f"{name} is empty; give at least one size")
        for v in values:
            _check_size(name, v)
    bad = set(phases) - set(RECORD_TYPES)
    if bad or not phases:
        raise ValueError(f"phases={phases!r}: use 'prefill' and/or 'decode'")
    spec = _ceilings(model, ceilings)
    limit = device_memory_bytes() if memory_bytes is None else memory_bytes
    points = [(ph, b, p) for p in prompt_lengths for b in batch_sizes for ph in phases]
    result = SweepResult()
    stream = sys.stdout
    for i, (phase, b, p) in enumerate(points):
        label = f"{phase} batch {b} prompt {p}"
        if progress:
            _progress(i, len(points), label, stream)
        context = p + (steps if phase == "decode" else 0)
        need = roofline.memory_needed(model.cfg, b, context)
        if limit is not None and need > limit:
            reason = f"needs {need / 1e9:.2f} GB (roofline.memory_needed) but the device has {limit / 1e9:.2f} GB"
            result.skipped.append((phase, b, p, reason))
            if progress:
                stream.write(f"\rskipped {label}: {reason}\n")
            continue
        try:
            if phase == "prefill":
                rec = measure_prefill(model, b, p, repeats=repeats, ceilings=spec)
            else:
                rec = measure_decode(model, b, p, steps, repeats=repeats, ceilings=spec)
            result.append(rec)
        except Exception as err:  # noqa: BLE001 - only out-of-memory is recorded, others re-raise
            if not _is_oom(err):
                raise
            reason = f"out of memory: {str(err).splitlines()[0][:160]}"
            result.skipped.append((phase, b, p, reason))
            if progress:
                stream.write(f"\rskipped {label}: {reason}\n")
    if progress:
        _progress(len(points), len(points), "done", stream)
    return result


# ----------------------------------------------------------------------------- files
def _flat(rec) -> dict:
    return dataclasses.asdict(rec)


def save_records(records, path) -> Path:
    """Write records to ``path``: ``.json`` (a list of flat objects) or ``.csv`` (one row each)."""
    path = Path(path)
    rows = [_flat(r) for r in records]
    if path.suffix == ".json":
        path.write_text(json.dumps(rows, indent=1))
    elif path.suffix == ".csv":
        fields = []
        for cls in (PrefillRecord, DecodeRecord):
            for f in dataclasses.fields(cls):
                if f.name not in fields:
                    fields.append(f.name)
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields)
            w.writeheader()
            for row in rows:
                w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    else:
        raise ValueError(f"path={str(path)!r}: save_records writes .json or .csv")
    return path


def _from_row(row: dict):
    phase = row.get("phase") or ("prefill" if "prompt_len" in row and "context" not in row else "decode")
    cls = RECORD_TYPES.get(phase)
    if cls is None:
        raise ValueError(f"record with phase={phase!r}: expected 'prefill' or 'decode'")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in row:
            if f.default is dataclasses.MISSING:
                raise ValueError(f"a {phase} record lacks the field {f.name!r}")
            continue
        v = row[f.name]
        if v == "" or v is None:
            v = None
        elif isinstance(v, str) and f.name not in ("device", "backend", "kernels", "preset", "dtype", "phase"):
            v = float(v)
            if v.is_integer() and f.name in ("batch", "prompt_len", "context", "steps", "repeats"):
                v = int(v)
        kwargs[f.name] = v
    return cls(**kwargs)


def _from_probe(data: dict) -> list:
    """A probe JSON (schema_version 1) -> one PrefillRecord + its DecodeRecords."""
    from inference_lab.config import ModelConfig

    machine = {"device": data["device"], "backend": data["backend"], "kernels": data["kernels"],
               "preset": data["model"]["preset"], "dtype": data["model"]["dtype"]}
    try:
        cfg = ModelConfig.preset(machine["preset"], dtype=machine["dtype"])
    except ValueError:
        cfg = None
    pf = data["prefill"]
    cost = roofline.prefill_cost(cfg, pf["batch"], pf["prompt_len"]) if cfg else None
    recs = [PrefillRecord(**machine, batch=pf["batch"], prompt_len=pf["prompt_len"], seconds=pf["seconds"],
                          prefill_tokens_per_s=pf["prefill_tokens_per_s"],
                          flops=cost.flops if cost else None, bytes=cost.bytes if cost else None,
                          mfu=pf.get("mfu"))]
    for d in data["decode"]:
        steps = data.get("new_tokens") or 1
        flops = (sum(roofline.decode_cost(cfg, d["batch"], d["context"] + i).flops for i in range(steps)) / steps
                 if cfg else None)
        recs.append(DecodeRecord(**machine, batch=d["batch"], context=d["context"], step_seconds=d["step_seconds"],
                                 decode_tokens_per_s=d["decode_tokens_per_s"], bytes_per_step=d["bytes_per_step"],
                                 flops_per_step=flops, mbu=d.get("mbu"), mfu=d.get("mfu"), steps=steps))
    return recs


def _load_file(path: Path) -> list:
    if path.suffix == ".csv":
        with path.open(newline="") as fh:
            return [_from_row(row) for row in csv.DictReader(fh)]
    data = json.loads(path.read_text())
    if isinstance(data, dict) and "schema_version" in data:
        if data["schema_version"] != 1:
            raise ValueError(f"{path}: probe schema_version {data['schema_version']} is not 1")
        return _from_probe(data)
    if isinstance(data, list):
        return [_from_row(row) for row in data]
    raise ValueError(f"{path}: neither a probe JSON nor a list of records")


def load_records(folder_or_file) -> list:
    """Records from a ``.json``/``.csv`` file written by :func:`save_records`, a probe JSON,
    or every such file in a folder (sorted by name: e.g. a classroom's probe results)."""
    path = Path(folder_or_file)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".json", ".csv"))
    elif path.exists():
        files = [path]
    else:
        raise ValueError(f"folder_or_file={str(path)!r} does not exist")
    records = []
    for f in files:
        records.extend(_load_file(f))
    return records
