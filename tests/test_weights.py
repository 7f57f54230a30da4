"""A weights file loads only if every tensor is the one its config needs; inputs a compiled
program would get wrong silently are refused at every public entry point."""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from inference_lab.model import weights
from inference_lab.base.config import ModelConfig
from inference_lab.model.transformer import Transformer

# A model small enough that each file is a few hundred KB; no square matrix, so a transposed
# one shows in its shape (a transposed square matrix has the right shape: no check can see it).
CFG = ModelConfig(name="mini", vocab_size=320, d_model=64, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8,
                  d_ff=96, max_seq_len=64)


def good_tensors(cfg=CFG, dtype=np.float32):
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal(shape).astype(dtype) for name, shape in weights.expected(cfg).items()}


def meta(cfg=CFG, **changes):
    fields = dict(vars(cfg), **changes)
    return {"config": json.dumps(fields), "format": weights.FORMAT}


def changed(**edit):
    def make():
        t = good_tensors()
        for name, value in edit.items():
            name = name.replace("__", ".")
            if value is None:
                del t[name]
            else:
                t[name] = value(t.get(name))
        return t, meta()
    return make


def with_config(**changes):
    return lambda: (good_tensors(), meta(**changes))


BAD = {
    "missing tensor": (changed(layers__0__w_down=None), "tensor 'layers.0.w_down' is missing"),
    "missing embedding": (changed(embed=None), "tensor 'embed' is missing"),
    "extra tensor": (changed(lm_head=lambda _: np.zeros((64, 320), np.float32)), "tensor 'lm_head' is not part"),
    "extra layer": (changed(layers__1__w_o=lambda _: np.zeros((32, 64), np.float32)), "'layers.1.w_o' is not part"),
    "transposed": (changed(layers__0__w_o=lambda w: np.ascontiguousarray(w.T)),
                   "'layers.0.w_o' has shape (64, 32) (transposed?) but the config needs (32, 64)"),
    "transposed head": (changed(head=lambda w: np.ascontiguousarray(w.T)), "(320, 64) (transposed?)"),
    "axes swapped": (changed(layers__0__w_qkv=lambda w: np.ascontiguousarray(w.transpose(0, 2, 1, 3))),
                     "(axes in another order?)"),
    "wrong shape": (changed(layers__0__w_gate_up=lambda w: w[:, :, :48].copy()), "needs (64, 2, 96) = [d_model, 2, d_ff]"),
    "wrong dtype": (changed(layers__0__mlp_norm=lambda w: w.astype(np.float16)), "is float16 but the config's dtype"),
    "all bf16 in an f32 config": (lambda: (good_tensors(dtype=np.float16), meta()), "is float16"),
    "config: bigger vocabulary": (with_config(vocab_size=512), "tensor 'embed' has shape (320, 64)"),
    "config: more layers": (with_config(n_layers=2), "'layers.1.attn_norm' is missing"),
    "config: tied": (with_config(tie_embeddings=True), "tensor 'embed' is not part"),
    "config: other heads": (with_config(n_kv_heads=4), "'layers.0.w_qkv' has shape (64, 2, 4, 8)"),
    "config: invalid": (with_config(n_kv_heads=3), "not a valid ModelConfig"),
    "config: unknown field": (with_config(n_experts=8), "not a valid ModelConfig"),
    "config: not JSON": (lambda: (good_tensors(), {"config": "{d_model: 64", "format": weights.FORMAT}),
                         "not a valid ModelConfig"),
    "config: a list": (lambda: (good_tensors(), {"config": "[1, 2]", "format": weights.FORMAT}), "not an object"),
    "no config": (lambda: (good_tensors(), {}), "no inference_lab config"),
}


@pytest.mark.parametrize("kind", list(BAD))
def test_each_kind_of_bad_weights_file_is_refused_naming_the_mismatch(tmp_path, kind):
    make, message = BAD[kind]
    tensors, metadata = make()
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    with pytest.raises(ValueError) as err:
        Transformer.load(path, kernels="reference")
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_a_damaged_file_is_refused(tmp_path, damage):
    path = tmp_path / "w.safetensors"
    save_file(good_tensors(), str(path), metadata=meta())
    raw = path.read_bytes()
    path.write_bytes({"garbage": b"not a safetensors file at all", "truncated": raw[: len(raw) // 2],
                      "empty": b""}[damage])
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        Transformer.load(path, kernels="reference")


def test_a_good_file_loads_and_round_trips(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file(good_tensors(), str(path), metadata=meta())
    m = Transformer.load(path, kernels="reference")
    assert m.cfg == CFG
    m.save(tmp_path / "again.safetensors")                     # atomic save; loads back the same
    back = Transformer.load(tmp_path / "again.safetensors", kernels="reference")
    np.testing.assert_array_equal(np.asarray(back.params()["layers"][0]["w_o"]),
                                  good_tensors()["layers.0.w_o"])


def test_params_given_directly_are_checked_too():
    params = weights.nest(good_tensors(), CFG)
    params["layers"][0]["w_o"] = params["layers"][0]["w_o"][:, :16]
    with pytest.raises(ValueError, match=r"params: tensor 'layers.0.w_o' has shape \(32, 16\)"):
        Transformer(CFG, kernels="reference", params=params)
    with pytest.raises(ValueError, match="not an array"):
        Transformer(CFG, kernels="reference", params=dict(weights.nest(good_tensors(), CFG), head=[[1.0]]))


def test_a_failed_save_keeps_the_old_file(tmp_path, monkeypatch):
    import safetensors.flax

    path = tmp_path / "w.safetensors"
    save_file(good_tensors(), str(path), metadata=meta())
    before = path.read_bytes()
    m = Transformer.load(path, kernels="reference")

    def disk_full(tensors, filename, metadata=None):
        with open(filename, "wb") as fh:
            fh.write(b"\0" * 100)                                  # half a file, then ENOSPC
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.flax, "save_file", disk_full)
    with pytest.raises(OSError):
        m.save(path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]
