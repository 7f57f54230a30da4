"""Tensor parallelism on a jax Mesh: how one model is split across ``tp`` devices, Megatron style.

    mesh = parallel.make_mesh(4)                 # a 1-D mesh with the axis "tp"
    tp_model = parallel.shard(model, mesh)       # a new Transformer whose weights are split
    logits, cache = prefill(tp_model, tokens, KVCache.create(cfg, B, S))   # unchanged API
    logits, cache = decode_step(tp_model, next_tokens, cache)

The layout (:data:`PARTITION`; ``D`` = d_model, ``V`` = vocab, ``F`` = d_ff):

* ``w_qkv [D, Hkv, G+2, Dh]`` is cut along its KV-head axis (output columns): each device
  holds whole KV heads *with their G query heads*, so attention runs locally, no
  communication. ``w_gate_up [D, 2, F]`` is cut along ``F`` (output columns).
* ``w_o [Hq*Dh, D]`` and ``w_down [F, D]`` are cut along their input rows: each device
  multiplies its slice of heads / of ``F`` and gets a *partial* ``[B, D]`` sum; one
  all-reduce (:func:`psum_tp`) per matrix adds them. Two all-reduces per layer, of ``B x D``.
* The KV cache ``[B, S, Hkv, Dh]`` is cut along ``Hkv``, like the heads that write it.
* ``embed [V, D]`` and ``head [D, V]`` are cut along the vocabulary: each device gathers the
  ids it owns (zeros elsewhere) and one all-reduce assembles the rows; each device computes
  logits for its slice of the vocabulary and one all-gather assembles ``[B, V]``.
* RMSNorm scales are tiny and replicated.

How it runs: the model's pure forward functions run per device inside ``jax.shard_map``
(:func:`per_device`), so every Pallas kernel sees only its device's local block and the
collectives are explicit. (Calling ``pallas_call`` on sharded arrays *outside* ``shard_map``
would make XLA all-gather the whole weight first on an Auto mesh, or fail on an Explicit one.)

Multi-host: every process runs the same program. Call ``jax.distributed.initialize(
coordinator_address="HOST:PORT", num_processes=P, process_id=i)`` first (on CPU also
``jax.config.update("jax_num_cpu_devices", n)``); :func:`make_mesh` then spans the devices of
all processes, and :func:`shard` builds each process's shards from the same seeded weights.

This module is the mechanism only; it sits below the model (``transformer.py`` imports it, and
reads nothing of it on a one-device model but :func:`psum_tp`, a no-op there). The
tensor-parallel lesson that measures it lives in ``inference_lab.lessons.tensor_parallel``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from inference_lab.base import checks

AXIS = "tp"
CACHE_SPEC = P(None, None, AXIS, None)   # K/V caches [B, S, Hkv, Dh]: split by KV heads

# How each parameter of a Transformer splits across the mesh axis (a PartitionSpec per name).
PARTITION = {
    "embed": P(AXIS, None),               # by vocabulary rows
    "head": P(None, AXIS),                # by vocabulary columns
    "final_norm": P(None),
    "attn_norm": P(None),
    "w_qkv": P(None, AXIS, None, None),   # by KV head (each with its query heads)
    "b_qkv": P(AXIS, None, None),         # its biases, by KV head the same way
    "w_o": P(AXIS, None),                 # by input rows = query heads -> partial sums, psum
    "mlp_norm": P(None),
    "w_gate_up": P(None, None, AXIS),     # by d_ff columns
    "w_down": P(AXIS, None),              # by d_ff rows -> partial sums, psum
}


# ----------------------------------------------------------------------------- inside the forward
def tp_size() -> int | None:
    """Size of the mesh axis "tp" when tracing inside shard_map over it, else None."""
    try:
        return jax.lax.axis_size(AXIS)
    except (NameError, KeyError, ValueError):
        return None


def psum_tp(x):
    """Sum partial results over "tp" when that axis exists (row-split matmuls), else ``x``."""
    return jax.lax.psum(x, AXIS) if tp_size() is not None else x


def embed_split_vocabulary(table, tokens, *, axis: int):
    """Embedding rows for ``tokens`` from a table split by vocabulary over "tp" (``axis`` 0:
    ``[V/tp, D]`` rows; 1: a tied head's ``[D, V/tp]`` columns) -> [..., D]: each device gathers
    the ids it holds (zeros for the others) and one all-reduce assembles the rows."""
    v_local = table.shape[axis]
    ids = tokens - jax.lax.axis_index(AXIS) * v_local   # this device holds ids [offset, offset + v_local)
    mine = (ids >= 0) & (ids < v_local)
    x = jnp.take(table, jnp.where(mine, ids, 0), axis=axis)
    if axis == 1:
        x = jnp.moveaxis(x, 0, -1)                      # [D, ...] -> [..., D]
    return jax.lax.psum(jnp.where(mine[..., None], x, 0), AXIS)


def gather_vocabulary(logits):
    """Logits ``[N, V/tp]`` of this device's slice of the vocabulary -> the whole ``[N, V]``."""
    return jax.lax.all_gather(logits, AXIS, axis=1, tiled=True)


# ----------------------------------------------------------------------------- checks, mesh
def make_mesh(tp: int, devices=None) -> Mesh:
    """A 1-D mesh of the first ``tp`` devices (of every process) with the axis ``"tp"``.

    Axis type Auto: XLA may place collectives itself outside ``shard_map`` (the default
    Explicit type would demand an ``out_sharding`` wherever a split dimension is contracted).
    """
    devices = list(jax.devices() if devices is None else devices)
    if not isinstance(tp, (int, np.integer)) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tp={tp!r} must be a positive integer (the number of devices)")
    checks.count("tp", tp)
    if tp > len(devices):
        raise ValueError(checks.too_few_devices(int(tp), len(devices), jax.default_backend()))
    return jax.make_mesh((int(tp),), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=devices[: int(tp)])


def check_mesh(mesh) -> Mesh:
    if not isinstance(mesh, Mesh) or AXIS not in mesh.axis_names:
        raise ValueError(f"mesh must be a jax Mesh with an axis named {AXIS!r}; build it with parallel.make_mesh(tp)")
    return mesh


def degree(model) -> int:
    """Tensor-parallel degree of a model (1 for a one-device model)."""
    mesh = getattr(model, "mesh", None)
    return int(mesh.shape[AXIS]) if mesh is not None else 1


# ----------------------------------------------------------------------------- placing arrays
def _map_params(fn, params: dict) -> dict:
    """Apply ``fn(name, value)`` to every entry of a ``Transformer.params()`` dict."""
    out = {k: fn(k, v) for k, v in params.items() if k != "layers"}
    out["layers"] = [{k: fn(k, v) for k, v in lp.items()} for lp in params["layers"]]
    return out


def param_specs(params: dict) -> dict:
    """The PartitionSpec of every weight (same dict structure as ``params``)."""
    return _map_params(lambda name, _: PARTITION[name], params)


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


def place_params(params: dict, mesh: Mesh) -> dict:
    """The weights split over ``mesh`` as :data:`PARTITION` says."""
    return _map_params(lambda name, x: _place(x, NamedSharding(mesh, PARTITION[name])), params)


def place_cache(mesh: Mesh | None, k_caches, v_caches):
    """The cache arrays split by KV heads over ``mesh`` (unchanged when ``mesh`` is None or
    they are already split). A fresh ``KVCache.create`` is one array per layer on one device:
    the engine calls this before handing caches to a sharded model."""
    if mesh is None:
        return list(k_caches), list(v_caches)
    s = NamedSharding(mesh, CACHE_SPEC)
    return [_place(k, s) for k in k_caches], [_place(v, s) for v in v_caches]


def shard(model, mesh: Mesh):
    """A new model holding ``model``'s weights split over ``mesh`` (the layout above).

    ``model`` itself is left as it was (handy to compare against). The returned model has
    ``.mesh`` set; ``prefill``, ``decode_step``, ``decode_loop``, ``generate`` and calling it
    then run under ``shard_map`` on that mesh, with the KV cache split by KV heads.
    """
    if not (hasattr(model, "params") and hasattr(model, "cfg") and hasattr(model, "kernels")):
        raise ValueError(f"model must be an inference_lab Transformer, got {type(model).__name__}")
    checks.tensor_parallel(model.cfg, check_mesh(mesh).shape[AXIS])
    return type(model)(model.cfg, kernels=model.kernels, params=model.params(), mesh=mesh)


def weight_bytes_per_device(model) -> int:
    """Bytes of weights ``model`` holds on its first device (all of them when nothing is split)."""
    total = 0
    for x in jax.tree.leaves(model.params()):
        shards = getattr(x, "addressable_shards", None)
        total += shards[0].data.nbytes if shards else x.nbytes
    return int(total)


# ----------------------------------------------------------------------------- running per device
def per_device(fn, mesh: Mesh, in_specs, out_specs):
    """``fn`` run on each device's block inside ``jax.shard_map`` over ``mesh``.

    ``check_vma=False``: the Pallas interpreter needs it, and the logits are replicated by an
    explicit all-gather inside the forward, which the vma type check cannot see.
    """
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
