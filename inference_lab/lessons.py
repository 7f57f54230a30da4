"""The plain functions behind the notebooks: each measures or predicts, and the ``*_view``
ones also draw a figure and return a one-line readout for a :func:`widgets.dashboard`.

A notebook cell calls these at fixed values and ``assert``s the lesson's claim on the result;
the dashboard next to it calls the same function at whatever the slider says. Keeping them
here (not in the notebooks) means they are tested like the rest of the package.

Sizes are picked by device (:class:`LessonSizes`): the ``small`` preset in float32 on a CPU,
so a notebook finishes in about half a minute on two cores, and the ``base`` preset (the
Llama-3.2-1B shape) in bfloat16 on a GPU. ``INFERENCE_LAB_PRESET`` overrides the preset.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import platform
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

import pallas_kernels as pk
from inference_lab import economics, hardware, measure, plots, roofline
from inference_lab.config import ModelConfig

REFERENCE_NODE = {
    "name": "Qwen3.5-27B, 4xH100, TP=4",
    "prefill_tokens_per_s": 3288.0,
    "decode_tokens_per_s": 108.0,
    "source": "the brief's measured node: a 27B model on 4xH100 with tensor parallelism",
}


# ----------------------------------------------------------------------------- the machine
@dataclasses.dataclass(frozen=True)
class LessonSizes:
    """How big each lesson's measurements are on this kind of device."""

    prompt_len: int  # the one request of notebooks 01 and 06
    prompt_lengths: tuple  # slider options of notebook 01
    prefill_lengths: tuple  # prefill sweep of notebook 02 (first: decode-like, last: long)
    decode_contexts: tuple  # context sweep of notebook 03
    context: int  # decode context of the batch sweep (05) and the roofline points (04)
    batch_sizes: tuple  # decode batch sweep (04, 05)
    probe_batches: tuple  # probe and price measurements (06, 07)
    rag_prompt: int  # prompt length of the RAG time split (02)
    roofline_batches: tuple  # decode points on the roofline (04)
    depth_layers: tuple = (4, 8, 16)  # model depths whose decode steps 03 times (bytes x4)


CPU_SIZES = LessonSizes(prompt_len=256, prompt_lengths=(64, 256, 512), prefill_lengths=(1, 16, 64, 256),
                        decode_contexts=(256, 1536), context=256, batch_sizes=(1, 2, 4, 8, 16, 32),
                        probe_batches=(1, 8), rag_prompt=256, roofline_batches=(1, 8, 32))
GPU_SIZES = LessonSizes(prompt_len=512, prompt_lengths=(128, 512, 2048), prefill_lengths=(1, 16, 128, 512, 2048),
                        decode_contexts=(512, 2048, 8000), context=512,
                        batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256), probe_batches=(1, 8, 64),
                        rag_prompt=4000, roofline_batches=(1, 8, 64, 256))
# Every lesson times the same number of decode steps, so the compiled decode loops of one
# notebook are reused by the next (JAX's persistent compilation cache in .cache/jax).
DECODE_STEPS = 16


@dataclasses.dataclass(frozen=True)
class Machine:
    """What this notebook runs on: device, kernel mode, lesson preset, measured ceilings."""

    device: str
    backend: str
    kernels: str  # the mode "auto" resolved to
    kernels_why: str
    config: ModelConfig
    spec: hardware.HardwareSpec  # measured here, in the lesson dtype
    sizes: LessonSizes

    @property
    def dtype(self) -> str:
        return self.config.dtype

    @property
    def on_gpu(self) -> bool:
        return self.backend == "gpu"

    def summary(self) -> str:
        import flax

        return "\n".join([
            f"device:   {self.device} (jax backend '{self.backend}')",
            f"kernels:  {self.kernels_why}",
            f"model:    preset '{self.config.name}', {self.config.num_params / 1e6:,.0f}M parameters, {self.dtype}",
            f"versions: python {platform.python_version()}, jax {jax.__version__}, flax {flax.__version__}",
        ])


@functools.lru_cache(maxsize=None)
def this_machine(preset: str | None = None) -> Machine:
    """The machine the notebook runs on, with its ceilings measured (cached on disk)."""
    backend = jax.default_backend()
    preset = preset or os.environ.get("INFERENCE_LAB_PRESET") or ("base" if backend == "gpu" else "small")
    cfg = ModelConfig.preset(preset)
    spec = hardware.measure_ceilings(cfg.dtype, verbose=False)
    return Machine(device=jax.devices()[0].device_kind, backend=backend, kernels=pk.mode.resolve_mode("auto"),
                   kernels_why=pk.mode.describe(), config=cfg, spec=spec,
                   sizes=GPU_SIZES if backend == "gpu" else CPU_SIZES)


@functools.lru_cache(maxsize=None)
def _model(cfg: ModelConfig, kernels: str):
    from flax import nnx

    from inference_lab.model import Transformer

    return Transformer(cfg, rngs=nnx.Rngs(0), kernels=kernels)


def lesson_model(here: Machine, kernels: str = "auto"):
    """The lesson's model (seeded weights; built once per process and shared by the cells)."""
    return _model(here.config, kernels)


def ceilings_line(spec, dtype) -> str:
    return (f"{spec.name}: matmul {spec.peak_flops(dtype) / 1e9:,.1f} GFLOP/s ({dtype}), "
            f"bandwidth {spec.bandwidth / 1e9:,.1f} GB/s, ridge {spec.ridge_point(dtype):,.1f} FLOP/byte\n"
            f"  method: {spec.sources.get('flops', '?')}; {spec.sources.get('bandwidth', '?')}")


def plan_line(here: Machine) -> str:
    where = "GPU: timings on the compiled Pallas kernels" if here.kernels == "pallas" else \
        "timings on XLA's kernels; the Pallas kernels are shown under the interpreter"
    return (f"Later notebooks on this machine: preset '{here.config.name}' ({here.dtype}), {where}; "
            f"decode batch sweep up to {max(here.sizes.batch_sizes)}, prompts up to {max(here.sizes.prefill_lengths)} tokens.")


# ----------------------------------------------------------------------------- kernels on show
def show_source(kernel_fn):
    """Display a kernel's file, kernel body first (syntax-highlighted in JupyterLab)."""
    from IPython.display import Code, display

    module = sys.modules[kernel_fn.__module__]
    source = inspect.getsource(module)
    display(Code(source, language="python"))
    if "online_softmax" in source:  # the attention kernels share their softmax update: show it too
        from pallas_kernels import _online_softmax

        display(Code(inspect.getsource(_online_softmax), language="python"))


def _rel_err(x, ref) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1e-30))


def _rand(key, shape):
    return jax.random.normal(key, shape, jnp.float32)


def _f64_attention(q, k, v, visible):
    """float64 NumPy attention: q [B,T,Hq,D], k/v [B,S,Hkv,D], visible [B?,T,S] bool."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
    s = np.where(visible[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", p, v)


def prefill_kernels_check(seed: int = 0) -> dict:
    """The matmul and flash attention under the interpreter vs float64 NumPy (awkward sizes)."""
    k = jax.random.split(jax.random.key(seed), 5)
    a, b = _rand(k[0], (37, 100)), _rand(k[1], (100, 70))
    B, T, S, Hq, Hkv, D = 2, 45, 61, 8, 2, 32
    q, kk, vv = _rand(k[2], (B, T, Hq, D)), _rand(k[3], (B, S, Hkv, D)), _rand(k[4], (B, S, Hkv, D))
    visible = np.arange(S)[None, :] <= np.arange(T)[:, None] + (S - T)
    return {
        "matmul 37x100 @ 100x70": _rel_err(pk.matmul(a, b, mode="interpret"),
                                           np.asarray(a, np.float64) @ np.asarray(b, np.float64)),
        "flash attention T45 S61 GQA 8/2": _rel_err(pk.flash_attention(q, kk, vv, causal=True, mode="interpret"),
                                                    _f64_attention(q, kk, vv, np.broadcast_to(visible, (B, T, S)))),
    }


def decode_kernel_check(seed: int = 0) -> dict:
    """Decode attention under the interpreter vs float64 NumPy, ragged lengths 1..S_max."""
    k = jax.random.split(jax.random.key(seed), 3)
    B, S, Hq, Hkv, D = 3, 77, 8, 2, 32
    q, kc, vc = _rand(k[0], (B, Hq, D)), _rand(k[1], (B, S, Hkv, D)), _rand(k[2], (B, S, Hkv, D))
    lengths = jnp.array([1, 40, S], jnp.int32)
    visible = (np.arange(S)[None, :] < np.asarray(lengths)[:, None])[:, None, :]
    want = _f64_attention(q[:, None], kc, vc, visible)[:, 0]
    return {"decode attention lengths 1/40/77 GQA 8/2":
            _rel_err(pk.decode_attention(q, kc, vc, lengths, mode="interpret"), want)}


def pallas_vs_reference(seed: int = 0) -> dict:
    """Each Pallas kernel under the interpreter against its plain-jnp twin."""
    k = jax.random.split(jax.random.key(seed), 8)
    a, b = _rand(k[0], (37, 100)), _rand(k[1], (100, 70))
    q, kk, vv = _rand(k[2], (2, 45, 8, 32)), _rand(k[3], (2, 61, 2, 32)), _rand(k[4], (2, 61, 2, 32))
    dq, kc, vc = _rand(k[5], (3, 8, 32)), _rand(k[6], (3, 77, 2, 32)), _rand(k[7], (3, 77, 2, 32))
    lengths = jnp.array([1, 40, 77], jnp.int32)
    return {
        "matmul": _rel_err(pk.matmul(a, b, mode="interpret"), pk.reference.matmul(a, b)),
        "flash_attention": _rel_err(pk.flash_attention(q, kk, vv, mode="interpret"),
                                    pk.reference.flash_attention(q, kk, vv)),
        "decode_attention": _rel_err(pk.decode_attention(dq, kc, vc, lengths, mode="interpret"),
                                     pk.reference.decode_attention(dq, kc, vc, lengths)),
    }


# ----------------------------------------------------------------------------- 00: predicted split
def decode_split(cfg, spec, dtype, *, batch: int, context: int) -> dict:
    """Predicted compute and memory time of one decode step (seconds)."""
    cost = roofline.decode_cost(cfg, batch, context)
    compute_s, memory_s = roofline.predict_terms(cost, spec, dtype)
    return {"compute_s": compute_s, "memory_s": memory_s, "intensity": cost.intensity, "cost": cost}


def decode_split_view(cfg, spec, dtype, *, batch: int, context: int):
    split = decode_split(cfg, spec, dtype, batch=batch, context=context)
    fig = plots.time_split_bars(split["compute_s"], split["memory_s"],
                                title=f"{cfg.name} on {spec.name}, decode batch {batch}, context {context}")
    bound = "memory-bound" if split["memory_s"] >= split["compute_s"] else "compute-bound"
    text = (f"batch size {batch}: compute {split['compute_s'] * 1e3:.3g} ms vs memory {split['memory_s'] * 1e3:.3g} ms "
            f"(intensity {split['intensity']:.1f} FLOP/byte, ridge {spec.ridge_point(dtype):.1f}): {bound}")
    return fig, text


# ----------------------------------------------------------------------------- 01: two speeds
@dataclasses.dataclass
class TwoSpeeds:
    prompt_len: int
    new_tokens: int
    prefill: measure.PrefillRecord
    decode: measure.DecodeRecord

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill.prefill_tokens_per_s

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode.decode_tokens_per_s

    @property
    def ratio(self) -> float:
        return self.prefill_tokens_per_s / self.decode_tokens_per_s

    @property
    def ttft_s(self) -> float:
        return self.prefill.seconds

    @property
    def decode_s(self) -> float:
        return self.decode.step_seconds * self.new_tokens

    def line(self) -> str:
        return (f"prompt length {self.prompt_len}, new tokens {self.new_tokens}: "
                f"prefill {self.prefill_tokens_per_s:,.0f} tok/s, decode {self.decode_tokens_per_s:,.1f} tok/s: "
                f"writing is {self.ratio:.1f}x slower per token (reference node: "
                f"{REFERENCE_NODE['prefill_tokens_per_s'] / REFERENCE_NODE['decode_tokens_per_s']:.0f}x)")


def two_speeds(model, prompt_len: int, new_tokens: int = 32) -> TwoSpeeds:
    """Prefill of one prompt, then ``new_tokens`` decode steps from it, both timed here."""
    pre = measure.measure_prefill(model, batch=1, prompt_len=prompt_len)
    dec = measure.measure_decode(model, batch=1, context=prompt_len, steps=new_tokens)
    return TwoSpeeds(prompt_len, new_tokens, pre, dec)


def two_speeds_view(model, prompt_len: int, new_tokens: int):
    result = two_speeds(model, prompt_len, new_tokens)
    fig = plots.request_timeline(result.ttft_s, result.decode_s, prompt_len, new_tokens)
    text = (f"prompt length {prompt_len}, new tokens {new_tokens}: first token after {result.ttft_s * 1e3:,.0f} ms, "
            f"then {result.decode_s * 1e3:,.0f} ms of decode; {result.ratio:.1f}x slower per token to write")
    return fig, text


# ----------------------------------------------------------------------------- tables of records
class Sweep:
    """Records of one lesson sweep, with a printable table."""

    def __init__(self, records, columns):
        self.records = list(records)
        self.columns = columns

    def table(self) -> str:
        head = "".join(f"{name:>{width}}" for name, width, _ in self.columns)
        rows = ["".join(f"{fmt(r):>{width}}" for _, width, fmt in self.columns) for r in self.records]
        return "\n".join([head] + rows)

    def at(self, **where):
        for r in self.records:
            if all(getattr(r, k) == v for k, v in where.items()):
                return r
        raise KeyError(f"no record with {where}")


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


PREFILL_COLUMNS = [
    ("prompt", 8, lambda r: f"{r.prompt_len}"),
    ("ms", 10, lambda r: f"{r.seconds * 1e3:,.2f}"),
    ("tok/s", 12, lambda r: f"{r.prefill_tokens_per_s:,.0f}"),
    ("GFLOP/s", 11, lambda r: f"{r.flops / r.seconds / 1e9:,.1f}"),
    ("FLOP/byte", 11, lambda r: f"{r.flops / r.bytes:,.1f}"),
    ("MFU", 8, lambda r: _pct(r.mfu)),
]
DECODE_COLUMNS = [
    ("batch", 7, lambda r: f"{r.batch}"),
    ("context", 9, lambda r: f"{r.context}"),
    ("step ms", 10, lambda r: f"{r.step_seconds * 1e3:,.2f}"),
    ("tok/s", 11, lambda r: f"{r.decode_tokens_per_s:,.1f}"),
    ("MB/step", 10, lambda r: f"{r.bytes_per_step / 1e6:,.1f}"),
    ("GB/s", 8, lambda r: f"{r.bytes_per_step / r.step_seconds / 1e9:,.1f}"),
    ("MBU", 8, lambda r: _pct(r.mbu)),
    ("MFU", 8, lambda r: _pct(r.mfu)),
]


# ----------------------------------------------------------------------------- 02: prefill
def prefill_sweep(model, prompt_lengths) -> Sweep:
    recs = [measure.measure_prefill(model, batch=1, prompt_len=int(t)) for t in prompt_lengths]
    return Sweep(recs, PREFILL_COLUMNS)


def prefill_point_view(sweep: Sweep, spec, dtype, prompt_len: int):
    rec = sweep.at(prompt_len=prompt_len)
    fig = plots.prefill_flops_vs_length(sweep.records, spec, dtype, highlight=prompt_len)
    text = (f"prompt length {prompt_len}: {rec.flops / rec.seconds / 1e9:,.1f} GFLOP/s = {_pct(rec.mfu)} of the measured "
            f"matmul peak; {rec.prefill_tokens_per_s:,.0f} tok/s")
    return fig, text


@dataclasses.dataclass
class RagSplit:
    rows: list  # (ratio, prompt tokens, output tokens, prefill s, decode s)

    def table(self) -> str:
        lines = [f"{'prompt:output':>14}{'prompt':>8}{'output':>8}{'prefill s':>11}{'decode s':>10}{'decode share':>14}"]
        for ratio, p, o, ps, ds in self.rows:
            lines.append(f"{f'{ratio}:1':>14}{p:>8}{o:>8}{ps:>11.3f}{ds:>10.3f}{ds / (ps + ds):>14.0%}")
        return "\n".join(lines)


def rag_time_split(model, prompt_tokens: int, ratios=economics.RAG_RATIO) -> RagSplit:
    """Time of one RAG request's phases at the given prompt:output ratios, from measurements."""
    pre = measure.measure_prefill(model, batch=1, prompt_len=prompt_tokens)
    dec = measure.measure_decode(model, batch=1, context=prompt_tokens, steps=DECODE_STEPS)
    rows = []
    for ratio in ratios:
        out = max(1, round(prompt_tokens / ratio))
        rows.append((ratio, prompt_tokens, out, pre.seconds, dec.step_seconds * out))
    return RagSplit(rows)


# ----------------------------------------------------------------------------- 03: decode
def decode_bytes_table(cfg, batch: int, contexts) -> str:
    lines = [f"{'context':>8}{'weights MB':>12}{'KV read MB':>12}{'KV write MB':>13}{'total MB':>10}{'FLOP/byte':>11}"]
    for c in contexts:
        cost = roofline.decode_cost(cfg, batch, int(c))
        p = cost.parts
        weights = p.get("weights", 0) + p.get("embedding_rows", 0)
        lines.append(f"{c:>8}{weights / 1e6:>12,.1f}{p.get('kv_read', 0) / 1e6:>12,.1f}"
                     f"{p.get('kv_write', 0) / 1e6:>13,.2f}{cost.bytes / 1e6:>10,.1f}{cost.intensity:>11.2f}")
    return "\n".join(lines)


def decode_context_sweep(model, contexts, steps: int = DECODE_STEPS) -> Sweep:
    recs = [measure.measure_decode(model, batch=1, context=int(c), steps=steps) for c in contexts]
    return Sweep(recs, DECODE_COLUMNS)


@dataclasses.dataclass
class DepthSweep:
    layers: list
    records: list

    def table(self) -> str:
        inner = Sweep(self.records, DECODE_COLUMNS[2:]).table().splitlines()
        return "\n".join([f"{'layers':>7}" + inner[0]] +
                         [f"{n:>7}" + row for n, row in zip(self.layers, inner[1:])])

    def label(self, rec) -> str:
        return f"{self.layers[self.records.index(rec)]} layers"


def decode_depth_sweep(here: Machine, layers, *, context: int, steps: int = DECODE_STEPS) -> DepthSweep:
    """Decode at batch 1 through models of the lesson shape with ``layers`` layers each: the
    bytes a step moves grow with the depth while the math per byte stays the same."""
    recs = []
    for n in layers:
        model = _model(here.config.replace(n_layers=int(n)), "auto")
        recs.append(measure.measure_decode(model, batch=1, context=context, steps=steps))
    return DepthSweep([int(n) for n in layers], recs)


def decode_point_view(sweep: Sweep, cfg, context: int):
    rec = sweep.at(context=context)
    cost = roofline.decode_cost(cfg, rec.batch, context)
    fig = plots.decode_bytes_bars(sweep.records, cfg, highlight=context)
    kv = cost.parts.get("kv_read", 0) / cost.bytes
    text = (f"prompt length (context) {context}: {rec.bytes_per_step / 1e6:,.1f} MB per step ({kv:.0%} KV cache) in "
            f"{rec.step_seconds * 1e3:,.2f} ms = {rec.bytes_per_step / rec.step_seconds / 1e9:,.1f} GB/s, MBU {_pct(rec.mbu)}")
    return fig, text


# ----------------------------------------------------------------------------- 04: intensity
def intensity_terms_table(cfg, contexts, batch: int) -> str:
    """Decode intensity with and without the KV-cache and attention terms."""
    lines = [f"{'context':>8}{'weights only':>14}{'+ attention & KV':>18}{'KV share of bytes':>19}"]
    for c in contexts:
        full = roofline.decode_cost(cfg, batch, int(c))
        bare = roofline.forward_cost_no_attention(cfg, batch)
        kv = (full.parts.get("kv_read", 0) + full.parts.get("kv_write", 0)) / full.bytes
        lines.append(f"{c:>8}{bare.intensity:>14.1f}{full.intensity:>18.1f}{kv:>19.0%}")
    return f"decode, batch {batch}, {cfg.name} ({cfg.dtype}): FLOP per byte\n" + "\n".join(lines)


@dataclasses.dataclass
class RooflinePoints:
    prefill: list
    decode: list

    @property
    def records(self) -> list:
        return self.prefill + self.decode


def roofline_points(model, prompt_lengths, batch_sizes, context: int) -> RooflinePoints:
    pre = [measure.measure_prefill(model, batch=1, prompt_len=int(t)) for t in prompt_lengths]
    dec = [measure.measure_decode(model, batch=int(b), context=context, steps=DECODE_STEPS) for b in batch_sizes]
    return RooflinePoints(pre, dec)


def roofline_batch_view(points: RooflinePoints, spec, dtype, cfg, batch: int):
    chosen = [r for r in points.decode if r.batch == batch]
    fig = plots.roofline_plot(spec, dtype, records=points.prefill + chosen, cfg=cfg,
                              title=f"Decode batch {batch} on {spec.name}'s roofline")
    rec = chosen[0]
    intensity = rec.flops_per_step / rec.bytes_per_step
    bound = "memory-bound" if intensity < spec.ridge_point(dtype) else "compute-bound"
    text = (f"batch size {batch}: intensity {intensity:.1f} FLOP/byte (ridge {spec.ridge_point(dtype):.1f}), "
            f"{rec.flops_per_step / rec.step_seconds / 1e9:,.1f} GFLOP/s achieved, {rec.decode_tokens_per_s:,.0f} tok/s: {bound}")
    return fig, text


# ----------------------------------------------------------------------------- 05: batching
def batch_sweep(model, batch_sizes, context: int, steps: int = DECODE_STEPS) -> "BatchSweep":
    result = measure.sweep(model, batch_sizes=list(batch_sizes), prompt_lengths=[context], steps=steps,
                           phases=("decode",), progress=True)
    return BatchSweep(list(result), DECODE_COLUMNS, skipped=result.skipped)


class BatchSweep(Sweep):
    def __init__(self, records, columns, skipped=()):
        super().__init__(records, columns)
        self.skipped = list(skipped)

    def at(self, batch=None, **where):
        """The record at that batch size: ``sweep.at(8)``."""
        if batch is not None:
            where["batch"] = batch
        return super().at(**where)

    def table(self) -> str:
        lines = [super().table()]
        lines += [f"skipped {phase} batch {b}: {why}" for phase, b, _, why in self.skipped]
        return "\n".join(lines)


def batch_point_view(sweep: BatchSweep, spec, cfg, dtype, batch: int):
    rec, one = sweep.at(batch), sweep.at(1)
    fig = plots.decode_throughput_plot(sweep.records, cfg=cfg, spec=spec, dtype=dtype)
    ax = fig.axes[0]
    ax.scatter([batch], [rec.decode_tokens_per_s], s=220, facecolors="none", edgecolors="black", linewidths=2, zorder=6)
    text = (f"batch size {batch}: step {rec.step_seconds * 1e3:,.2f} ms ({rec.step_seconds / one.step_seconds:.2f}x batch 1), "
            f"{rec.decode_tokens_per_s:,.0f} tok/s ({rec.decode_tokens_per_s / one.decode_tokens_per_s:.1f}x batch 1)")
    return fig, text


def knee_explanation(sweep: BatchSweep, spec, cfg, dtype) -> str:
    context = sweep.records[0].context
    knee = roofline.measured_knee(sweep.records)
    flip_kv = roofline.predicted_flip(cfg, spec, dtype, context=context, include_kv=True)
    flip_w = roofline.predicted_flip(cfg, spec, dtype, context=context, include_kv=False)
    biggest = max(r.batch for r in sweep.records)
    kv_share = roofline.decode_cost(cfg, biggest, context)
    kv = kv_share.parts.get("kv_read", 0) / kv_share.bytes
    knee_txt = f"batch {knee}" if knee else f"beyond the sweep (> {biggest})"
    return "\n".join([
        f"ridge point here: {spec.ridge_point(dtype):.1f} FLOP/byte",
        f"predicted flip, weights only: batch {flip_w}",
        f"predicted flip, with KV reads at context {context}: " + (f"batch {flip_kv}" if flip_kv else "never (KV reads grow as fast as FLOPs)"),
        f"measured knee (step >= 1.5x batch 1): {knee_txt}",
        f"at batch {biggest}, the KV cache is {kv:.0%} of the bytes a step moves",
    ])


def tensor_parallel_table(cfg, spec, *, batch: int, context: int, degrees=(1, 2, 4, 8)) -> str:
    """Per-device bytes and predicted decode step with tensor parallelism (roofline)."""
    lines = [f"{cfg.name} on {spec.name}, decode batch {batch}, context {context}",
             f"{'TP':>4}{'weights/device':>16}{'step compute+memory':>21}{'all-reduce':>12}{'step':>10}{'tok/s':>10}"]
    for tp in degrees:
        if cfg.n_kv_heads % tp or cfg.n_heads % tp:
            lines.append(f"{tp:>4}  (heads do not divide by {tp})")
            continue
        t = roofline.predict_time(roofline.decode_cost(cfg, batch, context, tp=tp), spec, cfg.dtype)
        comm = roofline.allreduce_time(cfg, spec, batch, tp=tp) if tp > 1 else 0.0
        step = t + comm
        lines.append(f"{tp:>4}{roofline.weight_bytes(cfg, tp=tp) / 1e9:>14.2f}GB{t * 1e3:>19.3f}ms"
                     f"{comm * 1e3:>10.3f}ms{step * 1e3:>8.3f}ms{batch / step:>10,.0f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- 06: classroom
def probe_filename(here: Machine) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", here.device).strip("-").lower() or "device"
    return f"probe-{slug}-{here.config.name}-{here.kernels}.json"


def classroom_view(records, batch: int):
    fig = plots.classroom_plot(records)
    right = fig.axes[1]
    right.axvline(batch, color="black", lw=1, ls=":")
    dec = [r for r in records if r.phase == "decode" and r.batch == batch]
    best = max(dec, key=lambda r: r.decode_tokens_per_s) if dec else None
    text = (f"batch size {batch}: {len({r.device for r in dec})} machine(s); fastest decode {best.device} at "
            f"{best.decode_tokens_per_s:,.0f} tok/s" if best else f"batch size {batch}: no machine measured it")
    return fig, text


# ----------------------------------------------------------------------------- 07: economics
DEFAULT_PRICE_KEY = "H100_SXM"


def price_ratios(cfg, spec, *, batches, prompt_len: int, context: int) -> dict:
    return dict(zip(batches, economics.price_ratio_vs_batch(cfg, spec, list(batches), context=context,
                                                            prompt_len=prompt_len)))


def price_table(cfg, spec, price, *, batches, prompt_len: int, context: int) -> str:
    lines = [f"{'batch':>6}{'input $/M':>11}{'output $/M':>12}{'output/input':>14}"]
    for b in batches:
        p = economics.predicted_token_prices(cfg, spec, batch=b, context=context, prompt_len=prompt_len,
                                             dollars_per_gpu_hour=price.dollars_per_hour)
        lines.append(f"{b:>6}{p['input_per_million']:>11.3f}{p['output_per_million']:>12.3f}{p['ratio']:>13.1f}x")
    return "\n".join(lines)


@dataclasses.dataclass
class MeasuredPrices:
    rows: list
    ratios: dict

    def table(self) -> str:
        lines = [f"{'batch':>6}{'input $/M':>11}{'output $/M':>12}{'output/input':>14}"]
        for r in self.rows:
            lines.append(f"{r['batch']:>6}{r['input_per_million']:>11.3f}{r['output_per_million']:>12.3f}{r['ratio']:>13.1f}x")
        return "\n".join(lines)


def measured_price_ratios(model, price, *, batches, prompt_len: int) -> MeasuredPrices:
    """Token prices from this machine's own prefill and decode throughput, per decode batch."""
    recs = [measure.measure_prefill(model, batch=1, prompt_len=prompt_len)]
    recs += [measure.measure_decode(model, batch=int(b), context=prompt_len, steps=DECODE_STEPS) for b in batches]
    rows = economics.measured_token_prices(recs, price.dollars_per_hour)
    return MeasuredPrices(rows, {r["batch"]: r["ratio"] for r in rows})


def price_view(cfg, spec, price, batch: int, *, prompt_len: int, context: int):
    fig = plots.price_ratio_plot(cfg, spec, contexts=(context,))
    fig.axes[0].axvline(batch, color="black", lw=1, ls=":")
    p = economics.predicted_token_prices(cfg, spec, batch=batch, context=context, prompt_len=prompt_len,
                                         dollars_per_gpu_hour=price.dollars_per_hour)
    text = (f"batch size {batch}: input ${p['input_per_million']:.3f}/M, output ${p['output_per_million']:.3f}/M: "
            f"output costs {p['ratio']:.1f}x input")
    return fig, text


def sim_summary(results: dict) -> str:
    """One line per simulated deployment: TTFT and TPOT percentiles, throughput, utilisation."""
    lines = [f"{'deployment':<28}{'TTFT p50':>10}{'p99':>9}{'TPOT p50':>10}{'p99':>8}{'tok/s':>9}  utilisation"]
    for name, res in results.items():
        row = res.summary()
        util = ", ".join(f"{pool} {u:.0%}" for pool, u in res.utilisation.items())
        lines.append(f"{name:<28}{row['ttft_p50_ms']:>8.0f}ms{row['ttft_p99_ms']:>7.0f}ms{row['tpot_p50_ms']:>8.1f}ms"
                     f"{row['tpot_p99_ms']:>6.1f}ms{row['output_tokens_per_s']:>9,.0f}  {util}")
    return "\n".join(lines)


SERVING = dict(rate=10.0, n_requests=600, output_len=(32, 128), prefill_gpus=1, decode_gpus=1)


def one_way_bandwidth(spec) -> float:
    """Bytes/s one way between two chips: datasheets quote NVLink as the total of both
    directions (900 GB/s on an H100 is 450 GB/s each way), and a KV cache travels one way."""
    if not spec.interconnect_bandwidth:
        raise ValueError(f"spec {spec.name!r} has no interconnect_bandwidth; use a GPU preset such as "
                         "hardware.PRESETS['H100_SXM']")
    return spec.interconnect_bandwidth / 2


def serving_at(phases, prompt_len: int, *, spec, seed: int = 0, serving: dict = SERVING) -> dict:
    """Colocated (2 GPUs) vs disaggregated (1 prefill + 1 decode GPU, KV caches shipped one
    way over ``spec``'s interconnect) at one prompt length."""
    kw = dict(serving, interconnect_bandwidth=one_way_bandwidth(spec))
    rate, n, out = kw.pop("rate"), kw.pop("n_requests"), kw.pop("output_len")
    gpus = kw["prefill_gpus"] + kw["decode_gpus"]
    common = dict(rate=rate, n_requests=n, prompt_len=(prompt_len // 2, prompt_len * 3 // 2), output_len=out, seed=seed)
    return {"colocated": economics.simulate(phases, mode="colocated", gpus=gpus, **common),
            "disaggregated": economics.simulate(phases, mode="disaggregated", **common, **kw)}


@dataclasses.dataclass
class LoadSweep:
    rows: list  # summary rows with "prompt_len" and "mode"

    def _of(self, mode):
        return [_as_row(r) for r in sorted((r for r in self.rows if r["mode"] == mode), key=lambda r: r["prompt_len"])]

    @property
    def colocated(self):
        return self._of("colocated")

    @property
    def disaggregated(self):
        return self._of("disaggregated")

    def table(self) -> str:
        lines = [f"{'prompt':>7}{'mode':>15}{'TTFT p50':>11}{'TTFT p99':>11}{'TPOT p50':>11}"]
        for r in sorted(self.rows, key=lambda r: (r["prompt_len"], r["mode"])):
            lines.append(f"{r['prompt_len']:>7}{r['mode']:>15}{r['ttft_p50_ms']:>9.0f}ms{r['ttft_p99_ms']:>9.0f}ms"
                         f"{r['tpot_p50_ms']:>9.1f}ms")
        return "\n".join(lines)


def _as_row(row: dict):
    """A summary row with attribute access (row.ttft_p50 in seconds, row.tpot_p50 ...)."""
    return ServingPoint(ttft_p50=row["ttft_p50_ms"] / 1e3, ttft_p99=row["ttft_p99_ms"] / 1e3,
                     tpot_p50=row["tpot_p50_ms"] / 1e3, prompt_len=row["prompt_len"], mode=row["mode"])


@dataclasses.dataclass(frozen=True)
class ServingPoint:
    """One deployment at one prompt length: median and p99 latencies in seconds."""

    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    prompt_len: int
    mode: str


def prompt_load_sweep(phases, prompt_lengths, *, spec, seed: int = 0) -> LoadSweep:
    """Raise the prompt length (the prefill load) at a fixed arrival rate, both deployments."""
    rows = []
    for p in prompt_lengths:
        for mode, res in serving_at(phases, int(p), spec=spec, seed=seed).items():
            rows.append({**res.summary(), "prompt_len": int(p), "mode": mode})
    return LoadSweep(rows)


def serving_view(phases, prompt_len: int, *, spec, seed: int = 0):
    results = serving_at(phases, prompt_len, spec=spec, seed=seed)
    fig = plots.latency_distributions(results)
    c, d = (results[m].summary() for m in ("colocated", "disaggregated"))
    text = (f"prompt length {prompt_len}: colocated TTFT p50 {c['ttft_p50_ms']:,.0f} ms, TPOT p50 {c['tpot_p50_ms']:.1f} ms; "
            f"disaggregated TTFT p50 {d['ttft_p50_ms']:,.0f} ms, TPOT p50 {d['tpot_p50_ms']:.1f} ms")
    return fig, text


def run_probe(here: Machine, folder, *, new_tokens: int = 16) -> dict:
    """``python -m inference_lab probe`` for the lesson preset: prints the table and writes
    the JSON into ``folder`` (named after this machine) for the classroom overlay."""
    import json
    from pathlib import Path

    from inference_lab import probe

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / probe_filename(here)
    args = probe.build_parser().parse_args([
        "--preset", here.config.name, "--prompt-len", str(here.sizes.prompt_len),
        "--batch", ",".join(str(b) for b in here.sizes.probe_batches), "--new-tokens", str(new_tokens),
        "--json", str(path)])
    report = probe.run(args)
    print(probe.format_table(report))
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return report
