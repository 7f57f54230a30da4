"""The transformer: float64 NumPy agreement, kernel modes, init, save/load, shard_map-ready."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from inference_lab.base.config import ModelConfig
from inference_lab.model.transformer import Transformer, forward, head_counts
from inference_lab.model.parallel import PARTITION

TINY = ModelConfig.preset("tiny")


@pytest.fixture(scope="module")
def model():
    return Transformer(TINY, rngs=nnx.Rngs(0), kernels="reference")


def numpy_forward(params, tokens, cfg):
    """An independent float64 NumPy forward pass (logits at every position)."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    dh = cfg.head_dim
    b, t = tokens.shape

    def norm(x, s):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * s

    def rope(x):  # x [B, T, H, Dh]
        half = dh // 2
        freq = cfg.rope_theta ** (-np.arange(half) * 2.0 / dh)
        ang = np.arange(t)[:, None] * freq                     # [T, half]
        cos, sin = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    x = p["embed"][tokens] if "embed" in p else p["head"].T[tokens]
    for lp in p["layers"]:
        h = norm(x, lp["attn_norm"])
        w = lp["w_qkv"]                                          # [D, Hkv, G+2, Dh]
        hkv, g = w.shape[1], w.shape[2] - 2
        qkv = np.einsum("btd,dkge->btkge", h, w)
        q = rope(qkv[:, :, :, :g].reshape(b, t, hkv * g, dh))
        k, v = rope(qkv[:, :, :, g]), qkv[:, :, :, g + 1]
        kk, vv = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)   # query head h -> kv head h // g
        s = np.einsum("bthe,bshe->bhts", q, kk) / np.sqrt(dh)
        s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("bhts,bshe->bthe", a, vv).reshape(b, t, -1)
        x = x + o @ lp["w_o"]
        h = norm(x, lp["mlp_norm"])
        gu = np.einsum("btd,dkf->btkf", h, lp["w_gate_up"])
        gate, up = gu[:, :, 0], gu[:, :, 1]
        x = x + (gate / (1 + np.exp(-gate)) * up) @ lp["w_down"]
    return norm(x, p["final_norm"]) @ p["head"]


@pytest.mark.parametrize("tied", [False, True])
def test_forward_matches_float64_numpy(tied):
    cfg = TINY.replace(tie_embeddings=tied)
    m = Transformer(cfg, rngs=nnx.Rngs(1), kernels="reference")
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 11))
    got = np.asarray(m(tokens), np.float64)
    want = numpy_forward(m.params(), tokens, cfg)
    assert got.shape == (2, 11, cfg.vocab_size)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_interpret_equals_reference():
    """The Pallas kernels (interpreted) and the jnp references give the same logits:
    prefill of a ragged batch, then one decode step."""
    from inference_lab.model.kv_cache import KVCache
    from inference_lab.runtime.generation import decode_step, prefill

    tokens = np.random.default_rng(2).integers(0, TINY.vocab_size, (2, 7))
    out = {}
    for mode in ("reference", "interpret"):
        m = Transformer(TINY, rngs=nnx.Rngs(0), kernels=mode)
        cache = KVCache.create(TINY, 2, 12)
        first, cache = prefill(m, tokens, cache, lengths=[7, 4])
        second, cache = decode_step(m, [3, 300], cache)
        out[mode] = np.asarray(first), np.asarray(second)
    for ref, interp in zip(out["reference"], out["interpret"]):
        np.testing.assert_allclose(interp, ref, rtol=1e-4, atol=1e-4)


def test_param_layout_and_counts(model):
    p = model.params()
    assert set(p) == {"embed", "head", "final_norm", "layers"} and len(p["layers"]) == TINY.n_layers
    assert p["layers"][0]["w_qkv"].shape == (256, 4, 4, 32)     # D, Hkv, G + 2, Dh
    assert head_counts(p) == (TINY.n_heads, TINY.n_kv_heads)
    n = sum(x.size for x in jax.tree.leaves(p))
    assert n == TINY.num_params and model.nbytes == 4 * n
    tied = Transformer(TINY.replace(tie_embeddings=True), kernels="reference")
    assert "embed" not in tied.params()
    assert sum(x.size for x in jax.tree.leaves(tied.params())) == TINY.replace(tie_embeddings=True).num_params
    assert set(PARTITION) >= set(p) - {"layers"} | set(p["layers"][0])


def test_seeded_init():
    a = Transformer(TINY, rngs=nnx.Rngs(0), kernels="reference").params()
    b = Transformer(TINY, rngs=nnx.Rngs(0), kernels="reference").params()
    c = Transformer(TINY, rngs=nnx.Rngs(1), kernels="reference").params()
    np.testing.assert_array_equal(a["layers"][1]["w_down"], b["layers"][1]["w_down"])
    assert not np.array_equal(a["layers"][1]["w_down"], c["layers"][1]["w_down"])
    w = np.asarray(a["layers"][0]["w_down"])
    assert abs(w.std() * np.sqrt(TINY.d_ff) - 1) < 0.05      # std 1/sqrt(fan_in), not zeros


def test_save_load_bf16_round_trip(tmp_path):
    cfg = TINY.replace(dtype="bfloat16", tie_embeddings=True)
    m = Transformer(cfg, rngs=nnx.Rngs(3), kernels="reference")
    path = tmp_path / "tiny.safetensors"
    m.save(path)
    back = Transformer.load(path, kernels="reference")
    assert back.cfg == cfg
    for x, y in zip(jax.tree.leaves(m.params()), jax.tree.leaves(back.params())):
        assert y.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))
    tokens = np.array([[1, 2, 3, 4]])
    np.testing.assert_array_equal(np.asarray(m(tokens)), np.asarray(back(tokens)))


def test_load_rejects_foreign_file(tmp_path):
    from safetensors.flax import save_file

    path = tmp_path / "other.safetensors"
    save_file({"w": jnp.ones((2, 2))}, str(path))
    with pytest.raises(ValueError, match="Transformer.save"):
        Transformer.load(path)


def test_constructor_errors():
    with pytest.raises(ValueError, match="ModelConfig"):
        Transformer("tiny")
    with pytest.raises(ValueError, match="mode"):
        Transformer(TINY, kernels="fast")
    with pytest.raises(ValueError, match="path=.*is not a file"):
        Transformer.load("/nonexistent/model.safetensors")


def test_runs_inside_shard_map_unchanged(model):
    """The pure forward runs inside shard_map over a "tp" axis (psums become live)."""
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((1,), ("tp",), axis_types=(jax.sharding.AxisType.Auto,))
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, TINY.vocab_size, (2, 6)), jnp.int32)
    fn = jax.shard_map(lambda p, t: forward(p, t, cfg=TINY, mode="reference"), mesh=mesh,
                       in_specs=(P(), P()), out_specs=P(), check_vma=False)
    inside = jax.jit(fn).lower(model.params(), tokens).compile()
    assert "all-reduce" in inside.as_text()            # the row-split matmuls are reduced
    np.testing.assert_allclose(np.asarray(inside(model.params(), tokens)), np.asarray(model(tokens)),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_pallas_model_matches_reference_bf16_base_shape():
    """Compiled on a GPU: the whole model on the Pallas kernels against the XLA reference, in
    bf16 at the base (Llama-3.2-1B) shape with 3 layers: a ragged prefill, then 16 decode steps
    fed the reference's greedy tokens. bf16 logits of size ~O(1): compared at 3% of their scale."""
    from inference_lab.runtime.generation import decode_step, prefill
    from inference_lab.model.kv_cache import KVCache

    cfg = ModelConfig.preset("base", n_layers=3)
    ref = Transformer(cfg, rngs=nnx.Rngs(0), kernels="reference")
    pal = Transformer(cfg, kernels="pallas", params=ref.params())
    tokens = np.random.default_rng(5).integers(0, 256, (2, 300))
    lengths = [300, 177]
    caches = {}
    logits = {}
    for name, m in (("ref", ref), ("pal", pal)):
        logits[name], caches[name] = prefill(m, tokens, KVCache.create(cfg, 2, 320), lengths=lengths)
    worst = 0.0
    for step in range(17):
        a, b = np.asarray(logits["ref"], np.float32), np.asarray(logits["pal"], np.float32)
        scale = float(np.max(np.abs(a)))
        worst = max(worst, float(np.max(np.abs(a - b))) / scale)
        assert np.mean(a.argmax(-1) == b.argmax(-1)) >= 0.5, f"step {step}: greedy tokens disagree"
        if step == 16:
            break
        nxt = a.argmax(-1).astype(np.int32)
        for name, m in (("ref", ref), ("pal", pal)):
            logits[name], caches[name] = decode_step(m, nxt, caches[name])
    assert worst < 3e-2, f"largest logit difference {worst:.3g} of the logit scale"
