"""Honest timing of prefill and decode: what the hardware did, next to what it could do.

Rules every function here follows (and a learner can check in the code):
- random token ids, never zeros (some kernels are faster on zeros);
- a warm-up call first (it compiles), then ``block_until_ready`` around each timed call,
  and the median of the repeats;
- decode steps run inside one jitted loop with the cache donated (no Python between steps);
- the cost of a step comes from :mod:`inference_lab.analytic.roofline` (the one definition of its
  FLOPs and bytes) and is compared with ceilings *measured on this machine*
  (:func:`inference_lab.base.hardware.measure_ceilings`): MFU = FLOPs / time / matmul peak,
  MBU = bytes / time / bandwidth.

A decode measurement starts from a cache holding ``context`` tokens of random keys and
values (the time of a step does not depend on which tokens made the cache, and filling it
by a real prefill would cost more than the measurement on a CPU).
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from inference_lab.runtime import engine
from inference_lab.model import parallel
from inference_lab.analytic import roofline
from inference_lab.model.kv_cache import KVCache
from inference_lab.base.progress import bar as progress_bar, note
# The record types and their files live in records.py; measure.* keeps the names.
from inference_lab.measure.records import RECORD_TYPES, DecodeRecord, PrefillRecord, load_records, save_records  # noqa: F401


class SweepResult(list):
    """A list of records; ``.skipped`` lists (phase, batch, prompt_len, reason) not measured."""

    def __init__(self, records=(), skipped=()):
        super().__init__(records)
        self.skipped = list(skipped)


# ----------------------------------------------------------------------------- helpers
def machine_identity(name: str | None = None) -> dict:
    """This machine as records name it: its random id (kept in the cache folder), the
    learner's ``name`` for it (or None) and its processor's model string."""
    from inference_lab.base.disk_cache import machine_id
    from inference_lab.base.hardware import processor_name

    return {"machine_id": machine_id(), "machine_name": name, "processor": processor_name()}


def _machine(model) -> dict:
    return {"device": jax.devices()[0].device_kind, "backend": jax.default_backend(),
            "kernels": model.kernels, "preset": model.cfg.name, "dtype": model.cfg.dtype,
            **machine_identity()}


def _ceilings(model, ceilings):
    """"auto" -> this machine's measured ceilings in the model's dtype; None -> None."""
    if isinstance(ceilings, str):
        if ceilings != "auto":
            raise ValueError(f"ceilings={ceilings!r}: pass 'auto' (measure here), None, or a HardwareSpec")
        from inference_lab.base.hardware import measure_ceilings
        return measure_ceilings(model.cfg.dtype, verbose=False)
    return ceilings


def _tp(model) -> int:
    """Tensor-parallel degree. With tp > 1 the costs are per device (each device reads 1/tp of
    the weights and does 1/tp of the math), so MFU and MBU compare one device's work with one
    device's ceilings."""
    return parallel.degree(model)


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
    if prompt_len > cfg.max_seq_len:
        raise ValueError(f"prompt_len={prompt_len} is past the model's max_seq_len={cfg.max_seq_len}")
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
    if context + steps > cfg.max_seq_len:
        raise ValueError(f"context={context} + steps={steps} is past the model's max_seq_len={cfg.max_seq_len}")
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
    """Memory this process may use on the default device: the allocator's limit on a GPU; on a
    CPU the smallest of physical RAM, the cgroup (container) limit and ``ulimit -v``/``-d``
    (:func:`inference_lab.base.hardware.process_memory_limit`)."""
    dev = jax.devices()[0]
    try:
        stats = dev.memory_stats() or {}
    except Exception:  # some backends do not implement memory_stats
        stats = {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    if dev.platform == "cpu":
        from inference_lab.base.hardware import process_memory_limit
        return process_memory_limit()
    return None


def _is_oom(err: Exception) -> bool:
    text = str(err)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower() or isinstance(err, MemoryError)


def _measure_point(model, result, phase, b, p, steps, repeats, spec, limit, say) -> None:
    """One point of a sweep: its record appended to ``result``, or a reason in ``result.skipped``."""
    label = f"{phase} batch {b} prompt {p}"
    context = p + (steps if phase == "decode" else 0)
    need = roofline.memory_needed(model.cfg, b, context)
    if limit is not None and need > limit:
        reason = f"needs {need / 1e9:.2f} GB (roofline.memory_needed) but the device has {limit / 1e9:.2f} GB"
    else:
        try:
            if phase == "prefill":
                result.append(measure_prefill(model, b, p, repeats=repeats, ceilings=spec))
            else:
                result.append(measure_decode(model, b, p, steps, repeats=repeats, ceilings=spec))
            return
        except Exception as err:  # noqa: BLE001 - only out-of-memory is recorded, others re-raise
            if not _is_oom(err):
                raise
            reason = f"out of memory: {str(err).splitlines()[0][:160]}"
    result.skipped.append((phase, b, p, reason))
    if say:
        note(f"skipped {label}: {reason}")


def sweep(model, batch_sizes=(1, 8, 32), prompt_lengths=(128, 512), *, steps: int = 16,
          phases=("prefill", "decode"), repeats: int | None = None, ceilings="auto",
          memory_bytes: int | None = None, progress: bool = True, save_to=None) -> SweepResult:
    """Measure every (batch, prompt length) point: a prefill of that many prompts and/or
    ``steps`` decode steps from that context. Returns a :class:`SweepResult` (a list of
    records); points that ``roofline.memory_needed`` says will not fit in ``memory_bytes``
    (default: this device's memory) are skipped before they run, and an out-of-memory error
    is caught; both land in ``result.skipped`` with the reason, and the sweep goes on.

    ``save_to`` (a ``.json`` or ``.csv`` path): every finished point is saved there as soon
    as it is measured (the file is replaced whole each time, :func:`save_records`), so an
    interrupt or a crash keeps what was measured. An interrupt (or any other error) still
    stops the sweep; the exception carries the points measured so far as
    ``err.sweep_result`` and a note saying how many there are and where they were saved.

    ``progress=True`` draws a bar with the time left (:mod:`inference_lab.base.progress`: a widget
    in JupyterLab, text in a terminal, nothing under CI or nbval) and prints the skipped points;
    ``progress=False`` is silent."""
    for name, values in (("batch_sizes", batch_sizes), ("prompt_lengths", prompt_lengths)):
        if not values:
            raise ValueError(f"{name} is empty; give at least one size")
        for v in values:
            _check_size(name, v)
    bad = set(phases) - set(RECORD_TYPES)
    if bad or not phases:
        raise ValueError(f"phases={phases!r}: use 'prefill' and/or 'decode'")
    steps = _check_size("steps", steps)
    longest = max(prompt_lengths) + (steps if "decode" in phases else 0)
    if longest > model.cfg.max_seq_len:
        raise ValueError(f"prompt_lengths up to {max(prompt_lengths)}" + (f" + steps={steps}" if "decode" in phases else "")
                         + f" = {longest} tokens is past the model's max_seq_len={model.cfg.max_seq_len}; "
                         "use shorter prompts")
    if save_to is not None:
        from pallas_kernels.files import check_output_path

        save_to = check_output_path(save_to, force=True, flag="save_to")
        if save_to.suffix not in (".json", ".csv"):
            raise ValueError(f"save_to={str(save_to)!r}: sweeps save to a .json or .csv file")
    spec = _ceilings(model, ceilings)
    result = SweepResult()
    points = [(ph, b, p) for p in prompt_lengths for b in batch_sizes for ph in phases]
    limit = device_memory_bytes() if memory_bytes is None else memory_bytes
    try:
        with progress_bar(total=len(points), desc="sweep", unit="point", show=progress) as bar:
            for phase, b, p in points:
                bar.set_postfix_str(f"{phase} batch {b} prompt {p}")
                _measure_point(model, result, phase, b, p, steps, repeats, spec, limit, progress)
                if save_to is not None and result:
                    save_records(result, save_to)
                bar.update(1)
    except BaseException as err:
        err.sweep_result = result
        where = f", saved in {save_to}" if save_to is not None else " (pass save_to= to keep them on disk)"
        err.add_note(f"sweep: {len(result)} point(s) were measured before this{where}; "
                     "they are also in err.sweep_result")
        raise
    return result
