"""Tensor parallelism on a jax Mesh: one model split across ``tp`` devices, Megatron style.

    mesh = parallel.make_mesh(4)                 # a 1-D mesh with the axis "tp"
    tp_model = parallel.shard(model, mesh)       # a new Transformer whose weights are split
    logits, cache = prefill(tp_model, tokens, KVCache.create(cfg, B, S))   # unchanged API
    logits, cache = decode_step(tp_model, next_tokens, cache)
    generate(tp_model, "Hello", max_new_tokens=8)

The layout (``model.PARTITION``; ``D`` = d_model, ``V`` = vocab, ``F`` = d_ff):

* ``w_qkv [D, Hkv, G+2, Dh]`` is cut along its KV-head axis (output columns): each device
  holds whole KV heads *with their G query heads*, so attention runs locally, no
  communication. ``w_gate_up [D, 2, F]`` is cut along ``F`` (output columns).
* ``w_o [Hq*Dh, D]`` and ``w_down [F, D]`` are cut along their input rows: each device
  multiplies its slice of heads / of ``F`` and gets a *partial* ``[B, D]`` sum; one
  all-reduce (``psum``) per matrix adds them. Two all-reduces per layer, of ``B x D``.
* The KV cache ``[B, S, Hkv, Dh]`` is cut along ``Hkv``, like the heads that write it.
* ``embed [V, D]`` and ``head [D, V]`` are cut along the vocabulary. A token's embedding
  row lives on one device: each device gathers the ids it owns (zeros elsewhere) and one
  all-reduce assembles the rows. Each device computes logits for its slice of the
  vocabulary and one all-gather assembles ``[B, V]``.
* RMSNorm scales are tiny and replicated.

How it runs: the model's pure forward functions are wrapped in ``jax.shard_map`` over the
mesh (:func:`spmd`), so every Pallas kernel sees only its device's local block and the
collectives are the explicit ``psum``/``all_gather`` in ``model.py``. (Calling
``pallas_call`` on sharded arrays *outside* ``shard_map`` would make XLA all-gather the whole
weight first on an Auto mesh, or fail on an Explicit one.) The engine calls :func:`spmd`
and :func:`place_cache` whenever ``model.mesh`` is set, which is all :func:`shard` adds.

Collectives per decode step, as counted in the compiled program (:func:`tp_lesson`,
``python -m inference_lab probe --tp N``): ``2 * n_layers`` all-reduces from the row-split
matrices, plus 1 all-reduce for the vocabulary-split embedding when ``tp > 1``, plus 1
all-gather (not an all-reduce) for the vocabulary-split logits.

Multi-host: every process runs the same program. Call ``jax.distributed.initialize(
coordinator_address="HOST:PORT", num_processes=P, process_id=i)`` first (on CPU also
``jax.config.update("jax_num_cpu_devices", n)``); ``make_mesh(tp)`` then spans the devices of
all processes, and :func:`shard` builds each process's shards from the same seeded weights
(tested with two processes of 2 CPU devices each forming one 4-device mesh).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from inference_lab.config import ModelConfig
from inference_lab.model import PARTITION, Transformer, forward

AXIS = "tp"
CACHE_SPEC = P(None, None, AXIS, None)   # K/V caches [B, S, Hkv, Dh]: split by KV heads

__all__ = ["AXIS", "CACHE_SPEC", "check_degree", "make_mesh", "shard", "mesh_of", "param_specs",
           "spmd", "place_cache", "weight_bytes_per_device", "tp_lesson", "format_tp_rows"]


# ----------------------------------------------------------------------------- checks, mesh
def valid_degrees(cfg: ModelConfig) -> list[int]:
    """Every tp that splits ``cfg`` into whole heads, KV heads, vocabulary and d_ff slices."""
    n = min(cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size, cfg.d_ff)
    return [t for t in range(1, n + 1)
            if not (cfg.n_heads % t or cfg.n_kv_heads % t or cfg.vocab_size % t or cfg.d_ff % t)]


def check_degree(cfg: ModelConfig, tp, n_devices: int | None = None) -> int:
    """Return ``tp`` as an int, or raise a one-line ValueError saying why it cannot split ``cfg``.

    tp must divide ``n_kv_heads`` (each device holds whole KV heads; fewer KV heads than
    devices is an error, not a silent replication), ``n_heads``, ``vocab_size`` (embedding
    and head) and ``d_ff``, and not exceed ``n_devices`` when given.
    """
    if not isinstance(tp, (int, np.integer)) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tp={tp!r} must be a positive integer (the number of devices)")
    tp = int(tp)
    sizes = {"n_kv_heads": cfg.n_kv_heads, "n_heads": cfg.n_heads, "vocab_size": cfg.vocab_size,
             "d_ff": cfg.d_ff}
    bad = [f"{k}={v}" for k, v in sizes.items() if v % tp]
    if bad:
        raise ValueError(f"tp={tp} does not divide {', '.join(bad)} of preset {cfg.name!r} (each device "
                         f"needs whole KV heads and equal slices); choose tp in {valid_degrees(cfg)}")
    if n_devices is not None and tp > n_devices:
        raise ValueError(_too_few_devices(tp, n_devices))
    return tp


def _too_few_devices(tp: int, n: int) -> str:
    return (f"tp={tp} needs {tp} devices but jax sees {n} ({jax.default_backend()}); on a CPU "
            f"simulate them by setting XLA_FLAGS=--xla_force_host_platform_device_count={tp} before "
            "jax is imported (or jax.config.update('jax_num_cpu_devices', N) before any jax operation)")


def make_mesh(tp: int, devices=None) -> Mesh:
    """A 1-D mesh of the first ``tp`` devices (of every process) with the axis ``"tp"``.

    Axis type Auto: XLA may place collectives itself outside ``shard_map`` (the default
    Explicit type would demand an ``out_sharding`` wherever a split dimension is contracted).
    """
    devices = list(jax.devices() if devices is None else devices)
    if not isinstance(tp, (int, np.integer)) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tp={tp!r} must be a positive integer (the number of devices)")
    if tp > len(devices):
        raise ValueError(_too_few_devices(int(tp), len(devices)))
    return jax.make_mesh((int(tp),), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=devices[: int(tp)])


def mesh_of(model) -> Mesh | None:
    """The mesh a model was sharded over by :func:`shard`, or None for a one-device model."""
    return getattr(model, "mesh", None)


# ----------------------------------------------------------------------------- placing arrays
def _map_params(fn, params: dict) -> dict:
    """Apply ``fn(name, value)`` to every entry of a ``Transformer.params()`` dict."""
    out = {k: fn(k, v) for k, v in params.items() if k != "layers"}
    out["layers"] = [{k: fn(k, v) for k, v in lp.items()} for lp in params["layers"]]
    return out


def param_specs(params: dict) -> dict:
    """The PartitionSpec of every weight (same dict structure as ``params``)."""
    return _map_params(lambda name, _: P(*PARTITION[name]), params)


def _place(x, sharding: NamedSharding):
    """``x`` laid out as ``sharding`` (no-op when it already is).

    In one process ``device_put`` moves/slices it. With several processes each one holds
    the whole value (same seed) and builds only the shards of its own devices from it.
    """
    if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sharding, x.ndim):
        return x
    if jax.process_count() == 1:
        return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def shard(model: Transformer, mesh: Mesh) -> Transformer:
    """A new Transformer holding ``model``'s weights split over ``mesh`` (Megatron layout).

    ``model`` itself is left as it was (handy to compare against). The returned model has
    ``.mesh`` set; ``prefill``, ``decode_step``, ``decode_loop``, ``generate`` and calling it
    then run under ``shard_map`` on that mesh, with the KV cache split by KV heads.
    """
    if not isinstance(model, Transformer):
        raise ValueError(f"model must be an inference_lab Transformer, got {type(model).__name__}")
    if not isinstance(mesh, Mesh) or AXIS not in mesh.axis_names:
        raise ValueError(f"mesh must be a jax Mesh with an axis named {AXIS!r}; build it with "
                         "parallel.make_mesh(tp)")
    check_degree(model.cfg, mesh.shape[AXIS])
    params = model.params()
    placed = _map_params(lambda name, x: _place(x, NamedSharding(mesh, P(*PARTITION[name]))), params)
    out = Transformer(model.cfg, kernels=model.kernels, params=placed)
    out.mesh = mesh
    return out


def place_cache(model, k_caches, v_caches):
    """The cache arrays split by KV heads over ``model``'s mesh (unchanged when unsharded or
    already split). A fresh ``KVCache.create`` is one array per layer on one device: the
    engine calls this before handing caches to a sharded model."""
    mesh = mesh_of(model)
    if mesh is None:
        return list(k_caches), list(v_caches)
    s = NamedSharding(mesh, CACHE_SPEC)
    return [_place(k, s) for k in k_caches], [_place(v, s) for v in v_caches]


def weight_bytes_per_device(model) -> int:
    """Bytes of weights held by the first device (all of them for an unsharded model)."""
    total = 0
    for x in jax.tree.leaves(model.params()):
        shards = getattr(x, "addressable_shards", None)
        total += shards[0].data.nbytes if shards else x.nbytes
    return int(total)


# ----------------------------------------------------------------------------- SPMD forwards
def spmd(fn, mesh: Mesh | None, *, cfg: ModelConfig, mode: str):
    """``fn`` (``prefill_forward`` or ``decode_forward`` of ``model.py``) run per device.

    Without a mesh: ``fn`` with ``cfg`` and ``mode`` bound. With one: the same function
    inside ``jax.shard_map``, each device getting its block of the weights (``PARTITION``)
    and of the caches (``CACHE_SPEC``), the tokens and lengths whole; the logits come back
    whole (already all-gathered inside), the caches split. ``check_vma=False``: the Pallas
    interpreter needs it, and the logits are replicated by the explicit all-gather, which
    the vma type check cannot see.
    """
    bound = functools.partial(fn, cfg=cfg, mode=mode)
    if mesh is None:
        return bound

    def run(params, tokens, lengths, k_caches, v_caches):
        caches = [CACHE_SPEC] * len(k_caches)
        mapped = jax.shard_map(bound, mesh=mesh, in_specs=(param_specs(params), P(), P(), caches, caches),
                               out_specs=(P(), caches, caches), check_vma=False)
        return mapped(params, tokens, lengths, list(k_caches), list(v_caches))

    return run


@functools.partial(jax.jit, static_argnames=("cfg", "mode", "mesh"))
def _forward_sharded_jit(params, tokens, *, cfg, mode, mesh):
    fn = functools.partial(forward, cfg=cfg, mode=mode)
    return jax.shard_map(fn, mesh=mesh, in_specs=(param_specs(params), P()), out_specs=P(),
                         check_vma=False)(params, tokens)


def forward_sharded(model, tokens):
    """``model(tokens)`` for a sharded model: logits at every position, float32 [B, T, V]."""
    return _forward_sharded_jit(model.params(), tokens, cfg=model.cfg, mode=model.mode, mesh=mesh_of(model))


# ----------------------------------------------------------------------------- the lesson
def _measure_rows(cfg_name: str, degrees, batch: int, context: int, steps: int, repeats: int,
                  kernels: str) -> list[dict]:
    """Run in a process that has ``max(degrees)`` devices: one row per degree."""
    from inference_lab import engine, measure
    from inference_lab.cache import KVCache

    cfg = ModelConfig.preset(cfg_name)
    base = Transformer(cfg, kernels=kernels)
    rows = []
    for tp in degrees:
        # tp=1 is the plain one-device model: the baseline, with no collectives at all.
        model = base if tp == 1 else shard(base, make_mesh(tp))
        rec = measure.measure_decode(model, batch, context, steps, repeats=repeats, ceilings=None)
        # The collectives of the very program just timed (its loop body is one decode step);
        # compiling it again is mostly a hit in the persistent compilation cache.
        hlo = engine.compiled_decode_text(model, KVCache.create(cfg, batch, context + steps), steps=steps)
        rows.append({"tp": tp, "weight_bytes_per_device": weight_bytes_per_device(model),
                     "all_reduces": engine.count_all_reduces(hlo),
                     "all_gathers": sum(1 for op, *_ in engine.hlo_ops(hlo) if op.startswith("all-gather")),
                     "measured_step_s": rec.step_seconds})
    return rows


def tp_lesson(cfg_name: str = "tiny", degrees=(1, 2, 4), *, spec="H100_SXM", batch: int = 1,
              context: int = 64, steps: int = 8, repeats: int = 3, kernels: str = "reference",
              timeout: float = 120.0) -> list[dict]:
    """Tensor parallelism measured on simulated CPU devices, next to the roofline's prediction.

    The measuring runs in a child process started with
    ``XLA_FLAGS=--xla_force_host_platform_device_count=max(degrees)`` (the calling process,
    a notebook, already has its devices fixed). Returns one dict per degree:

    - ``tp``; ``weight_bytes_per_device``: bytes of weights on device 0 (about total / tp,
      the norms are replicated);
    - ``all_reduces``: all-reduce instructions in the compiled decode step (``2 * n_layers``
      + 1 for the vocabulary-split embedding when tp > 1), ``all_gathers``: the logits' one;
    - ``measured_step_s``: median decode step time at ``batch`` x ``context``;
    - ``predicted_step_s``: the roofline step time on ``spec`` (a preset name or a
      HardwareSpec; its name in ``spec``): ``predict_time(decode_cost(..., tp))`` +
      ``predicted_allreduce_s`` (``roofline.allreduce_time``; 0 when the spec has no
      interconnect, e.g. ``hardware.measure_ceilings()`` of this machine).

    ``kernels="reference"`` (XLA's kernels) by default: the lesson is about the split and its
    collectives; "interpret" works too but takes minutes. :func:`format_tp_rows` prints the
    rows as a table.

    Simulated CPU devices are threads sharing the same cores and the same memory, so the
    measured time does NOT shrink with tp (it grows: the same work plus the collectives).
    That is the lesson's point: tensor parallelism buys bandwidth only when each shard has
    its own memory, as each GPU has its own HBM; the prediction shows what it buys there.
    Takes ~10 s for ``tiny`` on two cores (most of it starting jax and compiling).
    """
    from inference_lab import hardware, roofline

    cfg = ModelConfig.preset(cfg_name)
    if isinstance(spec, str):
        if spec not in hardware.PRESETS:
            raise ValueError(f"spec={spec!r} is unknown; use one of {sorted(hardware.PRESETS)} or a HardwareSpec")
        spec = hardware.PRESETS[spec]
    degrees = [check_degree(cfg, t) for t in degrees]
    if not degrees:
        raise ValueError("degrees is empty; give at least one tp, e.g. (1, 2, 4)")
    for name, value in (("batch", batch), ("context", context), ("steps", steps), ("repeats", repeats)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")

    args = dict(cfg_name=cfg_name, degrees=degrees, batch=int(batch), context=int(context),
                steps=int(steps), repeats=int(repeats), kernels=kernels)
    rows = run_with_devices(max(degrees), [sys.executable, "-m", "inference_lab.parallel", json.dumps(args)],
                            timeout=timeout)
    for r in rows:
        tp = r["tp"]
        comm = roofline.allreduce_time(cfg, spec, batch, tp=tp) if tp > 1 and spec.interconnect_bandwidth else 0.0
        r["spec"] = spec.name
        r["predicted_allreduce_s"] = comm
        r["predicted_step_s"] = roofline.predict_time(roofline.decode_cost(cfg, batch, context, tp=tp),
                                                      spec, cfg.dtype) + comm
    return rows


def run_with_devices(n_devices: int, argv: list[str], *, timeout: float) -> list | dict:
    """Run ``argv`` in a child process that sees ``n_devices`` simulated CPU devices and
    return the JSON it prints on its last stdout line. The child is always ended."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n_devices}").strip()
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError(f"the tensor-parallel child process did not finish in {timeout:.0f} s") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise RuntimeError(f"the tensor-parallel child process failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def format_tp_rows(rows: list[dict]) -> str:
    """The rows of :func:`tp_lesson` as a text table."""
    spec = rows[0]["spec"] if rows else "?"
    lines = [f"{'tp':>3}{'weights/device':>16}{'all-reduces':>13}{'measured step (here)':>22}"
             f"{'predicted step (' + spec + ')':>30}"]
    for r in rows:
        lines.append(f"{r['tp']:>3}{r['weight_bytes_per_device'] / 1e6:>13.2f} MB{r['all_reduces']:>13}"
                     f"{r['measured_step_s'] * 1e3:>19.3f} ms{r['predicted_step_s'] * 1e6:>27.2f} us")
    return "\n".join(lines)


if __name__ == "__main__":  # the child process of tp_lesson
    print(json.dumps(_measure_rows(**json.loads(sys.argv[1]))))
