"""Honest timing of prefill and decode: what the hardware did, next to what it could do.

The measuring core of the lab. The probe, the sweeps, the experiments and the lessons all
measure through :func:`measure_points`, and every time it reports is a sample of the one timer,
:func:`pallas_kernels.timing.round_robin`. The rules (a learner can check them in the code):

- random token ids, never zeros (some kernels are faster on zeros);
- a warm-up run per point first (it compiles), then ``block_until_ready`` around each timed
  run, and the median of the repeats (their spread is kept on the record);
- several points are timed side by side, round-robin, unless they are measured one after
  another on purpose (a sweep that saves each point as it finishes);
- decode steps run inside one jitted loop with the cache donated (no Python between steps),
  from a cache already holding ``context`` tokens of random keys and values
  (:meth:`~inference_lab.model.kv_cache.KVCache.random`; a step takes the same time whichever
  tokens made the cache), rewound between repeats;
- the cost of a step comes from :mod:`inference_lab.analytic.costs` (the one definition of its
  FLOPs and bytes), the record from :mod:`inference_lab.measure.records` (the one builder), and
  it is compared with ceilings *measured on this machine*
  (:func:`inference_lab.base.hardware.measure_ceilings`): MFU = FLOPs / time / matmul peak,
  MBU = bytes / time / read bandwidth;
- a point that will not fit in memory (:func:`memory_problem`) is skipped before it runs, an
  out-of-memory error skips it when it does, and the points after it that need at least as
  much are not tried; every skip is kept with its reason.
"""

from __future__ import annotations

import jax
import numpy as np

from inference_lab.analytic import roofline
from inference_lab.base import checks
from inference_lab.base.progress import bar as progress_bar, note
from inference_lab.measure import records
from inference_lab.model import parallel
from inference_lab.model.kv_cache import KVCache
from inference_lab.runtime import generation
from pallas_kernels.timing import compile_seconds, round_robin, timed, timed_call


class SweepResult(list):
    """A list of records; ``.skipped`` lists ``(phase, batch, size, reason)`` of the points not
    measured (``size``: the prompt length of a prefill, the context of a decode);
    ``.compile_seconds`` maps each measured point's ``(phase, batch, size)`` to what making its
    programs cost in its warm-up run (:func:`pallas_kernels.timing.compile_seconds`: ``{"trace",
    "lower", "compile", "programs"}``, summed over points of one shape; a program made before, by
    another point or an earlier measurement, costs nothing here)."""

    def __init__(self, records=(), skipped=(), compile_seconds=None):
        super().__init__(records)
        self.skipped = list(skipped)
        self.compile_seconds = dict(compile_seconds or {})


# ----------------------------------------------------------------------------- this machine
def machine_identity(name: str | None = None) -> dict:
    """This machine as records name it: its random id (kept in the cache folder), the
    learner's ``name`` for it (or None) and its processor's model string."""
    from inference_lab.base.disk_cache import machine_id
    from inference_lab.base.hardware import processor_name

    return {"machine_id": machine_id(), "machine_name": name, "processor": processor_name()}


def model_identity(model) -> dict:
    """What a record says about who measured what: the device and the model's kernels, preset
    and dtype, and this machine (:func:`machine_identity`)."""
    return {"device": jax.devices()[0].device_kind, "backend": jax.default_backend(), "kernels": model.kernels,
            "preset": model.cfg.name, "dtype": model.cfg.dtype, **machine_identity()}


def default_repeats() -> int:
    # A 2-core CPU is noisy (other programs, turbo, the notebook server): more repeats
    # steady the median there; a GPU is quiet and its steps are short.
    return 5 if jax.default_backend() == "cpu" else 10


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


def memory_problem(need: int, limit: int | None) -> str | None:
    """Why ``need`` bytes (e.g. :func:`roofline.memory_needed`) will not fit in ``limit`` (None:
    no known limit), or None when they will."""
    if limit is not None and need > limit:
        return f"needs {need / 1e9:.2f} GB (roofline.memory_needed) but this process may use {limit / 1e9:.2f} GB"
    return None


def is_out_of_memory(err: BaseException) -> bool:
    """True for the errors a device (or the host) raises when an allocation fails."""
    text = str(err)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower() or isinstance(err, MemoryError)


def random_tokens(cfg, shape, seed: int) -> np.ndarray:
    """Random ids over the byte range (never all zeros): timing must not ride on zeros."""
    return np.random.default_rng(seed).integers(0, min(cfg.vocab_size, 256), size=shape, dtype=np.int32)


def _ceilings(ceilings, dtype):
    """"auto" -> this machine's measured ceilings in ``dtype``; None -> None; a spec as it is."""
    if isinstance(ceilings, str):
        if ceilings != "auto":
            raise ValueError(f"ceilings={ceilings!r}: pass 'auto' (measure here), None, or a HardwareSpec")
        from inference_lab.base.hardware import measure_ceilings
        return measure_ceilings(dtype, verbose=False)
    if ceilings is not None:
        checks.hardware_spec(ceilings)
    return ceilings


# ----------------------------------------------------------------------------- points
class PrefillPoint:
    """One prefill of ``batch`` random prompts of ``prompt_len`` tokens, ready to time."""

    phase = "prefill"

    def __init__(self, model, batch: int = 1, prompt_len: int = 512, *, seed: int = 0):
        self.model, self.seed = model, seed
        self.batch, self.size = checks.count("batch", batch), checks.count("prompt_len", prompt_len)
        if self.size > model.cfg.max_seq_len:
            raise ValueError(f"prompt_len={self.size} is past the model's max_seq_len={model.cfg.max_seq_len}")
        self.dtype = model.cfg.dtype   # the ceilings its MFU is against
        self.tokens = None

    @property
    def label(self) -> str:
        return f"prefill batch {self.batch} prompt {self.size}"

    def memory_needed(self) -> int:
        return roofline.memory_needed(self.model.cfg, self.batch, self.size, tp=parallel.degree(self.model))

    def prepare(self) -> None:
        self.tokens = random_tokens(self.model.cfg, (self.batch, self.size), self.seed)

    def run(self) -> float:
        cache = KVCache.create(self.model.cfg, self.batch, self.size)   # outside the timed region
        jax.block_until_ready(cache.k)
        return timed(self._prefill, cache)

    def _prefill(self, cache):
        logits, cache = generation.prefill(self.model, self.tokens, cache)
        return logits, cache.k, cache.v   # the arrays the clock waits for

    def release(self) -> None:
        self.tokens = None

    def record(self, samples, spec) -> records.PrefillRecord:
        return records.prefill_record(model_identity(self.model), self.model.cfg, batch=self.batch,
                                      prompt_len=self.size, seconds=samples.median, tp=parallel.degree(self.model),
                                      spec=spec, repeats=len(samples.seconds), spread=samples.spread)


class DecodePoint:
    """``steps`` greedy decode steps in one jitted loop, from ``context`` cached tokens per row
    of a batch of ``batch``, ready to time. Step ``i`` attends to ``context + i + 1`` keys; the
    record's bytes and FLOPs are the mean over the loop (``costs.decode_loop_cost``)."""

    phase = "decode"

    def __init__(self, model, batch: int = 8, context: int = 512, steps: int = 32, *, seed: int = 0):
        self.model, self.seed = model, seed
        self.batch, self.size = checks.count("batch", batch), checks.count("context", context)
        self.steps = checks.count("steps", steps)
        if self.size + self.steps > model.cfg.max_seq_len:
            raise ValueError(f"context={self.size} + steps={self.steps} is past the model's "
                             f"max_seq_len={model.cfg.max_seq_len}")
        self.dtype = model.cfg.dtype
        self.cache = self.first = None

    @property
    def label(self) -> str:
        return f"decode batch {self.batch} context {self.size}"

    def memory_needed(self) -> int:
        return roofline.memory_needed(self.model.cfg, self.batch, self.size + self.steps,
                                      tp=parallel.degree(self.model))

    def prepare(self) -> None:
        cfg = self.model.cfg
        self.cache = KVCache.random(cfg, self.batch, self.size + self.steps, self.size, self.seed)
        self.first = random_tokens(cfg, (self.batch,), self.seed + 1)

    def run(self) -> float:
        jax.block_until_ready(self.cache.k)
        seconds, (*_, cache) = timed_call(self._decode, self.cache)
        self.cache = cache.rewound(self.size)   # the same buffers: the next run writes the same steps
        return seconds

    def _decode(self, cache):
        out, cache = generation.decode_loop(self.model, self.first, cache, self.steps)
        return out, cache.k, cache.v, cache   # the clock waits for the tokens and the cache arrays

    def release(self) -> None:
        self.cache = self.first = None

    def record(self, samples, spec) -> records.DecodeRecord:
        return records.decode_record(model_identity(self.model), self.model.cfg, batch=self.batch,
                                     context=self.size, steps=self.steps, step_seconds=samples.median / self.steps,
                                     tp=parallel.degree(self.model), spec=spec, repeats=len(samples.seconds),
                                     spread=samples.spread)


class StreamedDecodePoint(DecodePoint):
    """Batch-1 decode as a streaming server runs it: ``steps`` tokens, each one decode step, its
    sample, and the copy of the token to the host before the next step starts (what
    :func:`inference_lab.runtime.streaming.stream` does). Against :class:`DecodePoint`'s one
    compiled loop, it shows the per-token cost a streaming user pays on top: a dispatch and a
    device-to-host round trip per token."""

    def __init__(self, model, context: int = 512, steps: int = 32, *, seed: int = 0):
        super().__init__(model, 1, context, steps, seed=seed)

    @property
    def label(self) -> str:
        return f"decode batch 1 context {self.size}, streamed token by token"

    def run(self) -> float:
        jax.block_until_ready(self.cache.k)
        seconds, cache = timed_call(self._stream, self.cache)
        self.cache = cache.rewound(self.size)
        return seconds

    def _stream(self, cache):
        token = self.first
        key = jax.random.key(self.seed)
        for i in range(self.steps):
            logits, cache = generation.decode_step(self.model, token, cache)
            token = generation.sample(logits, jax.random.fold_in(key, i))
            int(token[0])   # the token reaches the host, as a streamed answer's must
        return cache


# ----------------------------------------------------------------------------- the measuring core
def measure_points(points, *, repeats: int | None = None, ceilings="auto", side_by_side: bool = True,
                   memory_bytes: int | None = None, on_record=None, progress: bool = True,
                   desc: str = "measuring") -> SweepResult:
    """Time ``points`` (:class:`PrefillPoint`, :class:`DecodePoint`, the kernel points of
    :mod:`inference_lab.measure.matmuls`, or any object with their ``phase``, ``batch``, ``size``,
    ``dtype`` (of the ceilings its record is against; None: none), ``label``, ``memory_needed``,
    ``prepare``, ``run``, ``release`` and ``record``; their models may differ) and return their
    records, in order.

    ``side_by_side=True``: every point is prepared and warmed up, then the repeats go
    round-robin, so a burst of load slows every point a little rather than one a lot (what a
    comparison of points needs). ``False``: one point after another, each finished (and handed
    to ``on_record``) before the next starts, its memory released: what a sweep that saves as it
    goes needs, and what fits when the points together would not.

    Points that :func:`memory_problem` says will not fit in ``memory_bytes`` (default: this
    device's) are skipped before they run; an out-of-memory error while one runs skips it; after
    that, the points that need at least as much memory are not tried. Each skip is in
    ``result.skipped`` with its reason (and printed when ``progress``).

    ``on_record(result)`` is called with the result so far after each record and each skip (a
    partial save). An interrupt or another error stops the measurement; the exception carries the
    records finished so far as ``err.sweep_result`` and a note saying how many there are.
    ``progress``: a bar with the time left while it runs, gone when it ends
    (:mod:`inference_lab.base.progress`: a widget in JupyterLab, text in a terminal, nothing
    under CI or nbval, nothing for a measurement shorter than a second). ``ceilings``: "auto" (this
    machine's, measured and cached), a HardwareSpec, or None (no MFU/MBU).
    """
    points = list(points)
    if not points:
        raise ValueError("points is empty; give at least one point to measure")
    repeats = default_repeats() if repeats is None else checks.count("repeats", repeats)
    specs = {None: None}
    for p in points:   # before anything is allocated: a bad ceilings= fails first
        if p.dtype not in specs:
            specs[p.dtype] = _ceilings(ceilings, p.dtype)
    limit = device_memory_bytes() if memory_bytes is None else memory_bytes
    result = SweepResult()
    runs_per_point = repeats + 1
    try:
        with progress_bar(total=len(points) * runs_per_point, desc=desc, unit="run", show=progress,
                          transient=True) as bar:
            def tick():
                bar.update(1)

            def skip(point, reason):
                result.skipped.append((point.phase, point.batch, point.size, reason))
                bar.update(runs_per_point)
                if progress:
                    note(f"skipped {point.label}: {reason}")
                if on_record is not None:
                    on_record(result)

            oom_at = None
            ready = []
            for p in points:
                reason = memory_problem(p.memory_needed(), limit)
                if reason is None and oom_at is not None and p.memory_needed() >= oom_at.memory_needed():
                    reason = f"not tried: {oom_at.label} ran out of memory"
                if reason is not None:
                    skip(p, reason)
                    continue
                bar.set_postfix_str(p.label, refresh=False)
                try:
                    p.prepare()
                    with compile_seconds() as made:
                        p.run()   # the warm-up (it compiles and allocates): an out-of-memory shows here
                    key = (p.phase, p.batch, p.size)   # two points of one shape: their sum
                    kept = result.compile_seconds.setdefault(key, dict.fromkeys(made, 0))
                    for stage, value in made.items():
                        kept[stage] += value
                    tick()
                    if side_by_side:
                        ready.append(p)
                        continue
                    samples = round_robin([p.run], repeats, warmups=0, tick=tick)[0]
                except Exception as err:  # noqa: BLE001 - only out-of-memory is a skip; the rest re-raise
                    p.release()
                    if not is_out_of_memory(err):
                        raise
                    oom_at = p
                    skip(p, f"out of memory: {str(err).splitlines()[0][:160]}")
                    continue
                result.append(p.record(samples, specs[p.dtype]))
                p.release()
                if on_record is not None:
                    on_record(result)
            if ready:
                bar.set_postfix_str(f"{len(ready)} points side by side", refresh=False)
                for p, samples in zip(ready, round_robin([p.run for p in ready], repeats, warmups=0, tick=tick)):
                    result.append(p.record(samples, specs[p.dtype]))
                    p.release()
                    if on_record is not None:
                        on_record(result)
    except BaseException as err:
        err.sweep_result = result
        err.add_note(f"{desc}: {len(result)} point(s) were measured before this; they are in err.sweep_result")
        raise
    return result


def prefill_points(model, points, *, seed: int = 0, **kw) -> SweepResult:
    """Prefill records for ``(batch, prompt_len)`` points (:func:`measure_points`; side by side
    unless ``side_by_side=False``)."""
    points = list(points)
    if not points:
        raise ValueError("points is empty; give (batch, prompt_len) pairs, e.g. [(1, 64), (1, 256)]")
    return measure_points([PrefillPoint(model, b, t, seed=seed) for b, t in points], desc="prefill", **kw)


def decode_points(model, points, steps: int = 16, *, seed: int = 0, **kw) -> SweepResult:
    """Decode records for ``(batch, context)`` points, ``steps`` steps each in one jitted loop
    (:func:`measure_points`; side by side unless ``side_by_side=False``)."""
    points = list(points)
    if not points:
        raise ValueError("points is empty; give (batch, context) pairs, e.g. [(1, 256), (4, 256)]")
    return measure_points([DecodePoint(model, b, c, steps, seed=seed) for b, c in points], desc="decode", **kw)


def _one(result: SweepResult, point):
    if not result:
        _, _, _, reason = result.skipped[0]
        raise ValueError(f"{point.label} was not measured: {reason}; use a smaller batch or length")
    return result[0]


def measure_prefill(model, batch: int = 1, prompt_len: int = 512, *, repeats: int | None = None,
                    ceilings="auto", seed: int = 0) -> records.PrefillRecord:
    """One prefill of ``batch`` random prompts of ``prompt_len`` tokens, timed (median of
    ``repeats`` after a warm-up): :func:`measure_points` of one :class:`PrefillPoint`. A point
    that does not fit in memory is a ``ValueError`` saying so."""
    point = PrefillPoint(model, batch, prompt_len, seed=seed)
    return _one(measure_points([point], repeats=repeats, ceilings=ceilings), point)


def measure_decode(model, batch: int = 8, context: int = 512, steps: int = 32, *, repeats: int | None = None,
                   ceilings="auto", seed: int = 0) -> records.DecodeRecord:
    """``steps`` greedy decode steps in one jitted loop from ``context`` cached tokens, timed:
    :func:`measure_points` of one :class:`DecodePoint`. ``step_seconds`` = median loop time /
    steps."""
    point = DecodePoint(model, batch, context, steps, seed=seed)
    return _one(measure_points([point], repeats=repeats, ceilings=ceilings), point)


def sweep(model, batch_sizes=(1, 8, 32), prompt_lengths=(128, 512), *, steps: int = 16,
          phases=("prefill", "decode"), repeats: int | None = None, ceilings="auto",
          memory_bytes: int | None = None, progress: bool = True, save_to=None) -> SweepResult:
    """Measure every (batch, prompt length) point, one after another: a prefill of that many
    prompts and/or ``steps`` decode steps from that context (:func:`measure_points` with
    ``side_by_side=False``: skips, out-of-memory and interrupts as it says).

    ``save_to`` (a ``.json`` or ``.csv`` path): every finished point is saved there as soon as it
    is measured (the file is replaced whole each time, :func:`records.save_records`), so an
    interrupt or a crash keeps what was measured. ``progress=True`` draws a bar with the time
    left and prints the skipped points; ``False`` is silent."""
    for name, values in (("batch_sizes", batch_sizes), ("prompt_lengths", prompt_lengths)):
        if not values:
            raise ValueError(f"{name} is empty; give at least one size")
        for v in values:
            checks.count(name, v)
    bad = set(phases) - set(records.RECORD_TYPES)
    if bad or not phases:
        raise ValueError(f"phases={phases!r}: use 'prefill' and/or 'decode'")
    steps = checks.count("steps", steps)
    longest = max(prompt_lengths) + (steps if "decode" in phases else 0)
    if longest > model.cfg.max_seq_len:
        raise ValueError(f"prompt_lengths up to {max(prompt_lengths)}" + (f" + steps={steps}" if "decode" in phases else "")
                         + f" = {longest} tokens is past the model's max_seq_len={model.cfg.max_seq_len}; "
                         "use shorter prompts")
    save = None
    if save_to is not None:
        from pallas_kernels.files import check_output_path

        save_to = check_output_path(save_to, force=True, flag="save_to")
        if save_to.suffix not in (".json", ".csv"):
            raise ValueError(f"save_to={str(save_to)!r}: sweeps save to a .json or .csv file")
        def save(result):
            if result:
                records.save_records(result, save_to)
    points = [PrefillPoint(model, b, p) if ph == "prefill" else DecodePoint(model, b, p, steps)
              for p in prompt_lengths for b in batch_sizes for ph in phases]
    try:
        return measure_points(points, repeats=repeats, ceilings=ceilings, side_by_side=False,
                              memory_bytes=memory_bytes, on_record=save, progress=progress, desc="sweep")
    except BaseException as err:
        if save_to is not None:
            err.add_note(f"sweep: {len(err.sweep_result)} point(s) were measured before this, saved in {save_to}")
        raise
