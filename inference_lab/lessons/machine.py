"""What every notebook starts from: this machine, the lesson's sizes on it, its model.

Sizes are picked by device (:class:`LessonSizes`): the ``small`` preset in float32 on a CPU,
so a notebook finishes in about half a minute on two cores, and the ``base`` preset (the
Llama-3.2-1B shape) in bfloat16 on a GPU. ``INFERENCE_LAB_PRESET`` overrides the preset.
Also here: the tables the lessons print from records, and how they show a kernel's code.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import platform
import sys

import jax

import pallas_kernels as pk
from inference_lab.analytic import roofline
from inference_lab.base import hardware
from inference_lab.base.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class LessonSizes:
    """How big each lesson's measurements are on this kind of device. Every tuple that feeds
    a slider has at least five positions."""

    prompt_len: int  # the one request of notebooks 01 and 06
    prompt_lengths: tuple  # "prompt length" slider of notebook 01
    prefill_lengths: tuple  # prefill sweep of notebook 02 (first: decode-like, last: long)
    decode_contexts: tuple  # batch-1 context sweep of notebook 03 (KV bytes up, matmul FLOPs fixed)
    context: int  # decode context of the batch sweeps (03, 04, 05)
    batch_sizes: tuple  # decode batch sweep (05)
    probe_batches: tuple  # probe and price measurements (06, 07)
    rag_prompt: int  # prompt length of the RAG time split (02)
    roofline_batches: tuple  # decode points on the roofline (04)
    new_tokens: tuple = (4, 8, 16, 32, 64)  # "new tokens" slider of notebook 01
    flops_batches: tuple = (1, 2, 4, 8, 16)  # batch sweep of notebook 03 (FLOPs up, bytes ~fixed)
    kernel_rows: tuple = (1, 2, 4, 8, 16, 32)  # rows m of the lone matmul kernel (05; 02 adds its prompts)
    kernel_size: int = 4096  # the kernel's weight is [kernel_size, kernel_size]: larger than a CPU's caches
    decode_steps: int = 8  # decode steps per timed loop
    regime_stream_bytes: tuple = (2**8, 2**16, 2**20, 2**24, 2**26, 2**28)  # the three regimes (04): sums
    regime_matmul_sizes: tuple = (32, 512, 2048)  # ... and square float32 matmuls (512+: at the peak)
    speculation_ks: tuple = (1, 2, 3, 4, 6)  # guesses per round (08)
    speculation_batches: tuple = (1, 2, 4, 8, 16)  # verify steps over the batch (08)

    def demands(self) -> list:
        """``(where, batch, tokens)`` of every measurement the notebooks make at these sizes: the
        batch and the tokens its cache must hold (prompt or context, plus the decode steps)."""
        steps = self.decode_steps
        return [("01: one request", 1, self.prompt_len + 16),
                ("01: the dashboard's longest request", 1, max(self.prompt_lengths) + max(self.new_tokens)),
                ("02: the prefill sweep", 1, max(self.prefill_lengths)),
                ("02: a RAG request", 1, self.rag_prompt + steps),
                ("03: the context sweep", 1, max(self.decode_contexts) + steps),
                ("03: the batch sweep", max(self.flops_batches), self.context + steps),
                ("04: the roofline points", max(self.roofline_batches), self.context + steps),
                ("05: the batch sweep", max(self.batch_sizes), self.context + steps),
                ("06: the probe", max(self.probe_batches), self.prompt_len + 8),
                ("07: measured prices", max(self.probe_batches), self.prompt_len + steps),
                ("08: verify steps over the batch", max(self.speculation_batches), 128 + max(self.speculation_ks) + 1)]

    def problems(self, cfg: ModelConfig, memory_bytes: float | None = None) -> list:
        """What at these sizes the model ``cfg`` cannot run: a sequence past its ``max_seq_len``,
        or (given ``memory_bytes``) a batch that :func:`roofline.memory_needed` says will not fit.
        One line each; empty when every lesson fits."""
        out = []
        for where, batch, tokens in self.demands():
            if tokens > cfg.max_seq_len:
                out.append(f"{where}: {tokens} tokens pass {cfg.name}'s max_seq_len={cfg.max_seq_len}")
            elif memory_bytes is not None and (need := roofline.memory_needed(cfg, batch, tokens)) > memory_bytes:
                out.append(f"{where}: batch {batch} of {tokens} tokens needs {need / 1e9:.1f} GB "
                           f"of the {memory_bytes / 1e9:.1f} GB there is")
        return out


CPU_SIZES = LessonSizes(prompt_len=256, prompt_lengths=(32, 64, 128, 256, 512), prefill_lengths=(1, 4, 16, 64, 256),
                        decode_contexts=(256, 768, 1536), context=256, batch_sizes=(1, 2, 4, 8, 16, 32),
                        probe_batches=(1, 2, 4, 8, 16, 32), rag_prompt=256, roofline_batches=(1, 2, 4, 8, 32))


GPU_SIZES = LessonSizes(prompt_len=512, prompt_lengths=(128, 256, 512, 1024, 2048),
                        prefill_lengths=(1, 16, 128, 512, 2048), decode_contexts=(512, 2048, 8128), context=512,
                        batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256), probe_batches=(1, 8, 32, 64, 128),
                        rag_prompt=4000, roofline_batches=(1, 8, 32, 64, 256), new_tokens=(8, 16, 32, 64, 128),
                        kernel_rows=(1, 2, 4, 8, 16, 32, 64, 128), kernel_size=8192, decode_steps=32,
                        regime_stream_bytes=(2**8, 2**16, 2**24, 2**28, 2**30, 2**32),
                        regime_matmul_sizes=(64, 2048, 8192), speculation_batches=(1, 8, 32, 64, 128, 256))


DECODE_STEPS = 16  # the default of the lesson functions that take ``steps``


def cpu_sizes(last_level_cache: int | None = None) -> LessonSizes:
    """:data:`CPU_SIZES` with the lone matmul's weight sized from this processor's reported
    last-level cache (:func:`inference_lab.base.hardware.last_level_cache_bytes`): at least twice
    its size, so every call streams the weight from memory as a decode step streams the model's
    (64 MiB in float32 beside a 32 MiB L3; 1 GiB beside a 260 MiB one)."""
    llc = hardware.last_level_cache_bytes() if last_level_cache is None else last_level_cache
    size = CPU_SIZES.kernel_size
    while 4 * size * size < 2 * (llc or 0):
        size *= 2
    return dataclasses.replace(CPU_SIZES, kernel_size=size)


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
            f"processor: {hardware.processor_summary()}",
            f"kernels:  {self.kernels_why}",
            f"model:    preset '{self.config.name}', {self.config.num_params / 1e6:,.0f}M parameters, {self.dtype}",
            f"versions: python {platform.python_version()}, jax {jax.__version__}, flax {flax.__version__}",
        ])


@functools.lru_cache(maxsize=None)
def this_machine(preset: str | None = None) -> Machine:
    """The machine the notebook runs on, with its ceilings measured (cached on disk).

    The lesson preset is the device's (``base`` on a GPU, ``small`` elsewhere) or
    ``INFERENCE_LAB_PRESET``; a preset the lessons' sizes do not fit is refused here, in one
    line per lesson, before any notebook measures. A ``preset`` passed in is taken as it is (the
    caller sets the sizes)."""
    backend = jax.default_backend()
    chosen = preset or os.environ.get("INFERENCE_LAB_PRESET") or ("base" if backend == "gpu" else "small")
    cfg = ModelConfig.preset(chosen)
    spec = hardware.measure_ceilings(cfg.dtype, verbose=False)
    sizes = GPU_SIZES if backend == "gpu" else cpu_sizes()
    problems = [] if preset else sizes.problems(cfg, spec.memory_bytes)
    if problems:
        raise ValueError(f"the lessons cannot run preset {chosen!r} here: " + "; ".join(problems)
                         + "; unset INFERENCE_LAB_PRESET or choose a larger preset")
    return Machine(device=jax.devices()[0].device_kind, backend=backend, kernels=pk.mode.resolve_mode("auto"),
                   kernels_why=pk.mode.describe(), config=cfg, spec=spec, sizes=sizes)


@functools.lru_cache(maxsize=None)
def _model(cfg: ModelConfig, kernels: str):
    from flax import nnx

    from inference_lab.model.transformer import Transformer

    return Transformer(cfg, rngs=nnx.Rngs(0), kernels=kernels)


def lesson_model(here: Machine, kernels: str = "auto"):
    """The lesson's model (seeded weights; built once per process and shared by the cells)."""
    return _model(here.config, kernels)


def kernel_check_mode() -> str:
    """How the lessons run the Pallas kernels to check their numbers: compiled where a GPU
    compiles them, else under the interpreter (correct, slow, never used for timing)."""
    return "pallas" if pk.mode.pallas_supported() else "interpret"


def ceilings_line(spec, dtype) -> str:
    over = getattr(spec, "overhead_s", None)
    copy = getattr(spec, "copy_bandwidth", None)
    return (f"{spec.name}: matmul {spec.peak_flops(dtype) / 1e9:,.1f} GFLOP/s ({dtype}), "
            f"read bandwidth {spec.bandwidth / 1e9:,.1f} GB/s, ridge {spec.ridge_point(dtype):,.1f} FLOP/byte"
            + (f", overhead {over * 1e6:,.1f} us per call" if over else "")
            + (f" (a copy moves {copy / 1e9:,.1f} GB/s, read + write: not a ceiling of decode, which reads)"
               if copy else "") + "\n"
            f"  method: {spec.sources.get('flops', '?')}; {spec.sources.get('bandwidth', '?')}"
            + (f"; {spec.sources.get('overhead', '?')}" if over else ""))


def function_source(fn, *, start: str | None = None, stop: str | None = None) -> str:
    """The source of one function, or the lines of it from the first containing ``start`` to
    the first (after it) containing ``stop``, both included: an excerpt that stays in step
    with the code because it is cut from the code."""
    lines = inspect.getsource(fn).splitlines()
    first = next((i for i, line in enumerate(lines) if start in line), None) if start else 0
    if first is None:
        raise ValueError(f"{fn.__qualname__} has no line containing {start!r}")
    last = next((i for i in range(first, len(lines)) if stop in lines[i]), None) if stop else len(lines) - 1
    if last is None:
        raise ValueError(f"{fn.__qualname__} has no line containing {stop!r} after {start!r}")
    chunk = lines[first:last + 1]
    indent = min(len(x) - len(x.lstrip()) for x in chunk if x.strip())
    head = [f"# {fn.__module__}.{fn.__qualname__}" + (" (excerpt)" if start or stop else "")]
    return "\n".join(head + [x[indent:] for x in chunk])


def show_function(fn, *, start: str | None = None, stop: str | None = None):
    """Display :func:`function_source` (syntax-highlighted in JupyterLab)."""
    from IPython.display import Code, display

    display(Code(function_source(fn, start=start, stop=stop), language="python"))


def kernel_parts(kernel_fn) -> list:
    """The functions that make a Pallas kernel, for reading: the kernel body (one program of
    the grid: its loads, its math, its stores), its launcher (``launch``: the plan's blocks and
    grid, the ``pallas_call``) and the online-softmax update the attention kernels share. Not the
    validation, the plans or the docstrings: those live in the file for whoever wants them."""
    module = sys.modules[kernel_fn.__module__]
    bodies = [f for name, f in vars(module).items()
              if name.endswith("_kernel") and inspect.isfunction(f) and f.__module__ == module.__name__]
    if not bodies or not hasattr(module, "launch"):
        raise ValueError(f"{module.__name__} has no *_kernel function and launch() to show")
    parts = bodies + [module.launch]
    if "online_softmax.update" in inspect.getsource(bodies[0]):
        from pallas_kernels.triton import online_softmax

        parts.append(online_softmax.update)
    return parts


def show_kernel(kernel_fn):
    """Display a kernel's body, its launcher (the grid) and the shared softmax update: see
    :func:`kernel_parts`."""
    for part in kernel_parts(kernel_fn):
        show_function(part)


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


def percent(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


PREFILL_COLUMNS = [
    ("prompt", 8, lambda r: f"{r.prompt_len}"),
    ("ms", 10, lambda r: f"{r.seconds * 1e3:,.2f}"),
    ("tok/s", 12, lambda r: f"{r.prefill_tokens_per_s:,.0f}"),
    ("GFLOP/s", 11, lambda r: f"{r.flops / r.seconds / 1e9:,.1f}"),
    ("FLOP/byte", 11, lambda r: f"{r.flops / r.bytes:,.1f}"),
    ("MFU", 8, lambda r: percent(r.mfu)),
]


DECODE_COLUMNS = [
    ("batch", 7, lambda r: f"{r.batch}"),
    ("context", 9, lambda r: f"{r.context}"),
    ("step ms", 10, lambda r: f"{r.step_seconds * 1e3:,.2f}"),
    ("tok/s", 11, lambda r: f"{r.decode_tokens_per_s:,.1f}"),
    ("MB/step", 10, lambda r: f"{r.bytes_per_step / 1e6:,.1f}"),
    ("GB/s", 8, lambda r: f"{r.bytes_per_step / r.step_seconds / 1e9:,.1f}"),
    ("MBU", 8, lambda r: percent(r.mbu)),
    ("MFU", 8, lambda r: percent(r.mfu)),
]
