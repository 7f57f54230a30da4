"""The whole model on the Pallas path lowers through Triton for a CUDA device, on a CPU.

No GPU is needed to check that every kernel the model calls, at the real shapes of the
``base`` (Llama-3.2-1B) and ``llama3_8b`` presets, passes Pallas' Triton lowering (power-of-two
blocks, supported ops, dot sizes): an abstract H200 stands in for the device and weights are
abstract shapes (nothing is allocated). Triton's own compile to PTX and the device limits are
checked on a CPU too, with the ``triton`` package (``tests/test_triton_compile.py``, ``make
triton-report``); running the kernels needs a GPU (``gpu``-marked tests, ``make gpu-check``).
"""

import warnings

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import pallas_kernels.mode as mode_mod
from inference_lab.runtime import hlo
from inference_lab.model import transformer as M
from inference_lab.base.config import ModelConfig

S = jax.ShapeDtypeStruct


@pytest.fixture
def abstract_h200(monkeypatch):
    from jax._src import mesh as mesh_lib  # private: AbstractDevice has no public export yet

    # Draw weights with jax (traceable) so eval_shape builds the parameter tree without data.
    monkeypatch.setattr(M._Initializer, "HOST_MAX_PARAMS", 0)
    device = mesh_lib.AbstractDevice(device_kind="NVIDIA H200", num_cores=None, platform="cuda")
    # The compiled modes check for a real GPU; here the lowering target is an abstract H200.
    with mode_mod.assume_gpu("NVIDIA H200", (9, 0)):
        yield mesh_lib.AbstractMesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=device)


def _lowered(mesh, fn, *args) -> str:
    with jax.sharding.use_abstract_mesh(mesh), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the Triton backend's deprecation
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("preset", ["base", "llama3_8b"])
@pytest.mark.parametrize("batch,prompt_len", [(1, 2048), (64, 512)])
def test_prefill_and_decode_lower_for_cuda(abstract_h200, preset, batch, prompt_len):
    tier = "triton"
    cfg = ModelConfig.preset(preset, n_layers=2)  # every layer has the same shapes
    params = jax.eval_shape(lambda: M.Transformer(cfg, rngs=nnx.Rngs(0), kernels="reference").params())
    cache = [S((batch, prompt_len + 64, cfg.n_kv_heads, cfg.head_dim), jnp.dtype(cfg.dtype))] * cfg.n_layers
    lengths = S((batch,), jnp.int32)
    # Per layer: QKV, attention-out, gate/up and down matmuls plus one attention; then the head.
    expected = 5 * cfg.n_layers + 1

    def prefill(p, tokens, n, k, v):
        return M.prefill_forward(p, tokens, n, k, v, cfg=cfg, mode=tier)

    def decode(p, tokens, n, k, v):
        return M.decode_forward(p, tokens, n, k, v, cfg=cfg, mode=tier)

    text = _lowered(abstract_h200, prefill, params, S((batch, prompt_len), jnp.int32), lengths, cache, cache)
    assert hlo.count_pallas_calls(text) == expected
    text = _lowered(abstract_h200, decode, params, S((batch,), jnp.int32), lengths, cache, cache)
    assert hlo.count_pallas_calls(text) == expected
    # The decode-attention kernel writes the new K/V into the caches itself: no scatter kernels.
    assert "stablehlo.scatter" not in text


def test_pallas_mode_picks_the_mosaic_tier_on_hopper(abstract_h200):
    """On an (abstract) H200, "pallas" runs the Mosaic GPU tier for the model's bf16 shapes:
    every matmul and attention lowers to a Mosaic GPU custom call, none to Triton."""
    cfg = ModelConfig.preset("base", n_layers=1)
    params = jax.eval_shape(lambda: M.Transformer(cfg, rngs=nnx.Rngs(0), kernels="reference").params())
    cache = [S((1, 576, cfg.n_kv_heads, cfg.head_dim), jnp.bfloat16)] * cfg.n_layers

    def decode(p, tokens, n, k, v):
        return M.decode_forward(p, tokens, n, k, v, cfg=cfg, mode="pallas")

    text = _lowered(abstract_h200, decode, params, S((1,), jnp.int32), S((1,), jnp.int32), cache, cache)
    assert hlo.count_pallas_calls(text) == 0
    assert text.count("mosaic_gpu") >= 5 * cfg.n_layers + 1


@pytest.mark.parametrize("tier,decode_rows", [("triton", 8), ("triton", 0), ("pallas", 8)])
def test_the_serving_step_lowers_for_cuda(abstract_h200, tier, decode_rows):
    """The serving engine's one forward (transformer.step_forward): 8 slots' decode rows and 4
    prompt pieces of 16 tokens over a 2048-position cache. Per layer: the four matmuls, decode
    attention for the rows and flash attention (with q_offsets) for the pieces; then the head.
    On Hopper ("pallas") the pieces' attention runs on the Triton tier (the Mosaic flash
    attention takes no q_offsets), everything else on the Mosaic tier."""
    cfg = ModelConfig.preset("base", n_layers=2)
    params = jax.eval_shape(lambda: M.Transformer(cfg, rngs=nnx.Rngs(0), kernels="reference").params())
    cache = [S((8, 2048, cfg.n_kv_heads, cfg.head_dim), jnp.dtype(cfg.dtype))] * cfg.n_layers
    i32 = jnp.int32
    args = (params, S((decode_rows,), i32), S((decode_rows,), i32), S((decode_rows,), jnp.bool_), S((4, 16), i32),
            S((4,), i32), S((4,), i32), S((decode_rows + 4,), i32), cache, cache)

    def step(p, tokens, lengths, active, pieces, slots, starts, heads, k, v):
        return M.step_forward(p, tokens, lengths, active, pieces, slots, starts, heads, k, v, cfg=cfg, mode=tier)

    text = _lowered(abstract_h200, step, *args)
    per_layer = 4 + (decode_rows > 0) + 1
    if tier == "triton":
        assert hlo.count_pallas_calls(text) == per_layer * cfg.n_layers + 1
    else:
        assert hlo.count_pallas_calls(text) == cfg.n_layers            # the pieces' attention, per layer
        assert text.count("mosaic_gpu") >= (per_layer - 1) * cfg.n_layers + 1


@pytest.mark.parametrize("tier,block", [("triton", 16), ("pallas", 16), ("pallas", 64)])
def test_the_paged_serving_step_lowers_for_cuda(abstract_h200, tier, block):
    """The same step over a paged cache (a pool of blocks, block tables): per layer the four
    matmuls, paged decode attention for the rows and flash attention for the pieces over their
    gathered blocks; then the head. On Hopper ("pallas") the matmuls run on the Mosaic tier, and
    the paged attention too where blocks hold 64 positions or more (blocks of 16 run it on the
    Triton tier); the pieces' attention stays on the Triton tier (the Mosaic flash attention takes
    no q_offsets)."""
    cfg = ModelConfig.preset("base", n_layers=2)
    params = jax.eval_shape(lambda: M.Transformer(cfg, rngs=nnx.Rngs(0), kernels="reference").params())
    pool = [S((8 * 2048 // block + 1, block, cfg.n_kv_heads, cfg.head_dim), jnp.dtype(cfg.dtype))] * cfg.n_layers
    i32 = jnp.int32
    args = (params, S((8,), i32), S((8,), i32), S((8,), jnp.bool_), S((4, 16), i32), S((4,), i32), S((4,), i32),
            S((12,), i32), pool, pool, S((8, 2048 // block), i32))

    def step(p, tokens, lengths, active, pieces, slots, starts, heads, k, v, table):
        return M.step_forward(p, tokens, lengths, active, pieces, slots, starts, heads, k, v, cfg=cfg, mode=tier,
                              block_table=table)

    text = _lowered(abstract_h200, step, *args)
    if tier == "triton":
        assert "paged_decode_attention" in text and hlo.count_pallas_calls(text) == 6 * cfg.n_layers + 1
    elif block == 16:
        assert hlo.count_pallas_calls(text) == 2 * cfg.n_layers            # both attentions, per layer
        assert text.count("mosaic_gpu") >= 4 * cfg.n_layers + 1
    else:
        assert hlo.count_pallas_calls(text) == cfg.n_layers                # the pieces' attention alone
        assert text.count("mosaic_gpu") >= 5 * cfg.n_layers + 1
