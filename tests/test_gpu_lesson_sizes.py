"""The GPU branch of every lesson, checked without a GPU.

On a GPU the notebooks measure the ``base`` preset (the Llama-3.2-1B shape, bf16) at
``lessons.machine.GPU_SIZES``. Nothing in CI runs that branch, so here: every sequence a lesson
builds fits ``base``'s ``max_seq_len``, every batch fits an H200's memory (``roofline``), and the
largest decode step and prefill of those sizes trace with abstract arrays (nothing allocated) and
lower for CUDA on the Pallas path (an abstract H200 stands in for the device).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
import pytest

import pallas_kernels.mode as mode_mod
from inference_lab.base import hardware
from inference_lab.base.config import ModelConfig
from inference_lab.lessons import machine
from inference_lab.model import transformer as M
from inference_lab.model import weights
from inference_lab.runtime import hlo

S = jax.ShapeDtypeStruct
BASE = ModelConfig.preset("base")
H200 = hardware.PRESETS["H200"]


def abstract_params(cfg):
    """The parameter tree of ``cfg`` as shapes only (weights.expected: the file's layout)."""
    flat = {name: S(shape, jnp.dtype(cfg.dtype)) for name, shape in weights.expected(cfg).items()}
    params = {k: v for k, v in flat.items() if not k.startswith("layers.")}
    params["layers"] = [{k.split(".", 2)[2]: v for k, v in flat.items() if k.startswith(f"layers.{i}.")}
                        for i in range(cfg.n_layers)]
    return params


def test_every_gpu_lesson_fits_the_gpu_model_and_an_h200():
    assert machine.GPU_SIZES.problems(BASE, H200.memory_bytes) == []


def test_every_cpu_lesson_fits_the_cpu_model_and_a_ci_machine():
    assert machine.CPU_SIZES.problems(ModelConfig.preset("small"), 24e9) == []


def test_the_check_catches_what_would_crash_on_the_first_gpu():
    # The sizes these lessons had: a context sweep to 32,768 tokens on a model of 8,192.
    old = dataclasses.replace(machine.GPU_SIZES, decode_contexts=(512, 8192, 32768))
    problems = old.problems(BASE, H200.memory_bytes)
    assert problems == ["03: the context sweep: 32800 tokens pass base's max_seq_len=8192"]
    huge = dataclasses.replace(machine.GPU_SIZES, batch_sizes=(1, 65536))
    assert any("05: the batch sweep: batch 65536" in p and "GB of the" in p for p in huge.problems(BASE, 80e9))


def test_the_lone_matmul_is_sized_past_the_last_level_cache():
    assert machine.cpu_sizes(32 * 2**20).kernel_size == 4096          # 64 MiB of float32 beside 32 MiB
    assert machine.cpu_sizes(260 * 2**20).kernel_size == 16384        # 1 GiB beside the Xeon's 260 MiB
    assert machine.cpu_sizes(0).kernel_size == machine.CPU_SIZES.kernel_size


@pytest.mark.parametrize("where,batch,tokens", [d for d in machine.GPU_SIZES.demands()
                                                if d[0].startswith(("03: the context", "05"))])
def test_the_largest_gpu_decode_steps_trace(where, batch, tokens):
    params = abstract_params(BASE)
    cache = [S((batch, tokens, BASE.n_kv_heads, BASE.head_dim), jnp.bfloat16)] * BASE.n_layers
    step = functools.partial(M.decode_forward, cfg=BASE, mode="reference")
    logits, ks, _ = jax.eval_shape(step, params, S((batch,), jnp.int32), S((batch,), jnp.int32), cache, cache)
    assert logits.shape == (batch, BASE.vocab_size) and ks[0].shape == cache[0].shape, where


def test_the_longest_gpu_prefill_traces():
    t = max(machine.GPU_SIZES.prefill_lengths)
    params = abstract_params(BASE)
    cache = [S((1, t, BASE.n_kv_heads, BASE.head_dim), jnp.bfloat16)] * BASE.n_layers
    fill = functools.partial(M.prefill_forward, cfg=BASE, mode="reference")
    logits, _, _ = jax.eval_shape(fill, params, S((1, t), jnp.int32), S((1,), jnp.int32), cache, cache)
    assert logits.shape == (1, BASE.vocab_size)


def test_the_gpu_context_sweep_lowers_for_cuda_on_the_pallas_path():
    """03's longest context on one layer of ``base``, lowered for an (abstract) H200: every kernel
    of the decode step passes Pallas' lowering at that cache length."""
    from jax._src import mesh as mesh_lib  # private: AbstractDevice has no public export yet

    cfg = BASE.replace(n_layers=1)
    tokens = max(machine.GPU_SIZES.decode_contexts) + machine.GPU_SIZES.decode_steps
    cache = [S((1, tokens, cfg.n_kv_heads, cfg.head_dim), jnp.bfloat16)]
    device = mesh_lib.AbstractDevice(device_kind="NVIDIA H200", num_cores=None, platform="cuda")
    mesh = mesh_lib.AbstractMesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=device)
    step = functools.partial(M.decode_forward, cfg=cfg, mode="triton")
    with mode_mod.assume_gpu("NVIDIA H200", (9, 0)), jax.sharding.use_abstract_mesh(mesh), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        text = jax.jit(step).trace(abstract_params(cfg), S((1,), jnp.int32), S((1,), jnp.int32), cache,
                                   cache).lower(lowering_platforms=("cuda",)).as_text()
    assert hlo.count_pallas_calls(text) == 5 * cfg.n_layers + 1
