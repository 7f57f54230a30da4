"""Hugging Face folders (Llama, Qwen2, Mistral) as the lab's Transformer: logits and greedy tokens
equal a float64 NumPy forward written from each architecture's definition (tests/hf_checkpoints.py),
and every bad folder is refused in one line naming the file and the fix, before a tensor loads."""

from __future__ import annotations

import json

import numpy as np
import pytest

import hf_checkpoints as hf
from inference_lab.model import huggingface
from inference_lab.runtime.generation import generate

PROMPT = [5, 17, 250, 3, 99, 42, 7, 120, 64, 1, 299, 88]


def _logits(model, tokens):
    return np.asarray(model(np.asarray([tokens], np.int32))[0], np.float64)


def _close(lab, ref):
    """Relative to the largest logit: float32 arithmetic against float64."""
    return float(np.max(np.abs(lab - ref)) / np.max(np.abs(ref)))


CASES = {   # name: (architecture, config overrides, shards)
    "llama": ("llama", {}, 1),
    "llama-tied-llama3-rope": ("llama", {"tie_word_embeddings": True, "rope_scaling": hf.LLAMA3_SCALING}, 1),
    "qwen2-qkv-bias": ("qwen2", {}, 1),
    "mistral-sharded": ("mistral", {}, 3),
}


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(request, tmp_path_factory):
    kind, overrides, shards = CASES[request.param]
    c = hf.config(kind, **overrides)
    weights = hf.tensors(c, seed=len(request.param))
    folder = hf.write(tmp_path_factory.mktemp(request.param), c, weights, shards=shards)
    return c, weights, folder, huggingface.load(folder, dtype="float32")


def test_logits_equal_the_float64_forward_of_the_architecture(checkpoint):
    c, weights, folder, model = checkpoint
    assert _close(_logits(model, PROMPT), hf.forward(c, weights, PROMPT)) <= 1e-4


def test_greedy_tokens_equal_the_float64_forward(checkpoint):
    c, weights, folder, model = checkpoint
    assert generate(model, [PROMPT], max_new_tokens=32)[0] == hf.greedy(c, weights, PROMPT, 32)


def _transformers_model(folder):
    """Hugging Face's own model of the folder, float32 on the CPU (the optional `hf` extra)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return torch, transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def test_logits_and_greedy_tokens_equal_transformers_own_model(checkpoint):
    """The same folder through `transformers` (skipped without the `hf` extra: README, "Your own
    model"): logits within 1e-4 of the largest, and the same 32 greedy tokens."""
    c, weights, folder, model = checkpoint
    torch, reference = _transformers_model(folder)
    with torch.no_grad():
        ref = reference(torch.tensor([PROMPT])).logits[0].double().numpy()
        ref_tokens = reference.generate(torch.tensor([PROMPT]), max_new_tokens=32, min_new_tokens=32,
                                        do_sample=False, pad_token_id=0)[0, len(PROMPT):].tolist()
    assert _close(_logits(model, PROMPT), ref) <= 1e-4
    assert generate(model, [PROMPT], max_new_tokens=32)[0] == ref_tokens


def test_the_comparison_sees_a_missed_bias_or_rope_scaling(tmp_path):
    """The two features a wrong loader could drop silently change the logits far past the
    tolerance above: the check can fail."""
    for kind, overrides, drop in (("qwen2", {}, "bias"), ("llama", {"rope_scaling": hf.LLAMA3_SCALING}, "rope")):
        c = hf.config(kind, **overrides)
        weights = hf.tensors(c)
        model = huggingface.load(hf.write(tmp_path / kind, c, weights), dtype="float32")
        if drop == "bias":
            wrong = {k: (np.zeros_like(v) if k.endswith(".bias") else v) for k, v in weights.items()}
            ref = hf.forward(c, wrong, PROMPT)
        else:
            ref = hf.forward({**c, "rope_scaling": None}, weights, PROMPT)
        assert _close(_logits(model, PROMPT), ref) > 1e-2, drop


def test_config_maps_shape_dtype_context_and_features(tmp_path):
    c = hf.config("llama", tie_word_embeddings=True, rope_scaling=hf.LLAMA3_SCALING, torch_dtype="bfloat16",
                  max_position_embeddings=8192)
    folder = hf.write(tmp_path / "SmolLM-ish", c, hf.tensors(c))
    cfg = huggingface.read_config(folder)
    assert (cfg.name, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff) == \
        ("SmolLM-ish", 64, 2, 4, 2, 16, 96)
    assert cfg.dtype == "bfloat16" and cfg.tie_embeddings and not cfg.qkv_bias
    assert cfg.max_seq_len == huggingface.DEFAULT_MAX_MODEL_LEN and cfg.rope_scaling == (8.0, 1.0, 4.0, 64)
    assert huggingface.read_config(folder, max_model_len=8192).max_seq_len == 8192
    assert huggingface.read_config(hf.write(tmp_path / "q", hf.config("qwen2"), {}), dtype="float32").qkv_bias
    model = huggingface.load(folder)   # bfloat16 as the folder says
    assert model.cfg.dtype == "bfloat16" and model.params()["head"].dtype == np.dtype("bfloat16")


# ----------------------------------------------------------------------------- bad folders
def _folder(tmp_path, kind="llama", shards=1, **overrides):
    c = hf.config(kind, **overrides)
    return hf.write(tmp_path / "model", c, hf.tensors(c), shards=shards), c


def _edit_config(folder, **changes):
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("change, match", [
    ({"architectures": ["GPT2LMHeadModel"]}, r"config\.json: architecture 'GPT2LMHeadModel' is not supported"),
    ({"num_local_experts": 8}, r"config\.json: a mixture of experts is not supported"),
    ({"hidden_act": "gelu"}, r"hidden_act='gelu'"),
    ({"attention_bias": True}, r"attention_bias=true"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"rope_scaling of type 'yarn' is not supported"),
    ({"sliding_window": 128}, r"sliding_window=128 .*pass max_model_len <= 128"),
    ({"hidden_size": "64"}, r"hidden_size='64' must be a positive int"),
    ({"torch_dtype": "int8"}, r"torch_dtype='int8' is not a float dtype"),
])
def test_unsupported_or_damaged_configs_are_refused_by_name(tmp_path, change, match):
    folder, _ = _folder(tmp_path, "mistral")
    _edit_config(folder, **change)
    with pytest.raises(ValueError, match=match):
        huggingface.load(folder)


def test_a_sliding_window_longer_than_the_context_never_applies_and_loads(tmp_path):
    folder, _ = _folder(tmp_path, "mistral", sliding_window=128)
    assert huggingface.read_config(folder, max_model_len=128).max_seq_len == 128


@pytest.mark.parametrize("damage, match", [
    ("no config", r"config\.json: missing"),
    ("no weights", r"no model\.safetensors and no model\.safetensors\.index\.json"),
    ("truncated", r"model\.safetensors: not a readable safetensors file .*fetch it again"),
    ("missing tensor", r"tensor 'model\.layers\.1\.mlp\.down_proj\.weight' is missing"),
    ("wrong shape", r"tensor 'model\.layers\.0\.self_attn\.q_proj\.weight' has shape \(64, 64\) but config\.json "
                    r"implies \(32, 64\)"),
    ("int tensor", r"tensor 'model\.norm\.weight' is I32, not a float"),
    ("nan", r"tensor 'model\.layers\.0\.mlp\.up_proj\.weight' holds NaN"),
    ("not a folder", r"is not a folder"),
])
def test_damaged_folders_are_refused_naming_the_file(tmp_path, damage, match):
    from safetensors.numpy import save_file

    folder, c = _folder(tmp_path)
    weights = hf.tensors(c)
    target = folder / "model.safetensors"
    if damage == "no config":
        (folder / "config.json").unlink()
    elif damage == "no weights":
        target.unlink()
    elif damage == "truncated":
        data = target.read_bytes()
        target.write_bytes(data[: len(data) // 2])
    elif damage == "missing tensor":
        del weights["model.layers.1.mlp.down_proj.weight"]
        save_file(weights, str(target))
    elif damage == "wrong shape":
        _edit_config(folder, num_attention_heads=2, head_dim=16)   # q_proj of 2 x 16 rows; the file has 4 x 16
    elif damage == "int tensor":
        weights["model.norm.weight"] = weights["model.norm.weight"].astype(np.int32)
        save_file(weights, str(target))
    elif damage == "nan":
        weights["model.layers.0.mlp.up_proj.weight"][3, 4] = np.nan
        save_file(weights, str(target))
    elif damage == "not a folder":
        folder = target
    with pytest.raises(ValueError, match=match) as err:
        huggingface.load(folder)
    assert "\n" not in str(err.value)


def test_a_missing_shard_is_named(tmp_path):
    folder, _ = _folder(tmp_path, shards=2)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match=r"model-00002-of-00002\.safetensors: missing \(1 shard\(s\) of 2\)"):
        huggingface.load(folder)


def test_weights_too_large_for_the_memory_are_refused_before_loading(tmp_path, monkeypatch):
    folder, _ = _folder(tmp_path)
    monkeypatch.setattr(huggingface.hardware, "process_memory_limit", lambda: 1_000)
    monkeypatch.setattr(huggingface, "_read", lambda *a, **k: pytest.fail("read a tensor before the memory check"))
    with pytest.raises(ValueError, match=r"float32 weights do not fit the 0\.0 GB there is"):
        huggingface.load(folder)


# ----------------------------------------------------------------------------- writing a folder
def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("overrides", [
    {}, {"qkv_bias": True, "tie_embeddings": True}, {"rope_scaling": (8.0, 1.0, 4.0, 64), "dtype": "bfloat16"},
], ids=["llama", "qwen2-tied", "llama3-rope-bf16"])
def test_a_saved_model_reads_back_exactly_and_in_transformers(tmp_path, overrides):
    """huggingface.save writes what load (the same logits, bit for bit) and transformers read."""
    from flax import nnx

    from inference_lab.base.config import ModelConfig
    from inference_lab.model.transformer import Transformer

    model = Transformer(ModelConfig.preset("tiny", **overrides), rngs=nnx.Rngs(7))
    folder = huggingface.save(model, tmp_path / "mine")
    assert folder.stat().st_mode & 0o777 == 0o777 & ~_umask() and all(
        p.stat().st_mode & 0o777 == 0o666 & ~_umask() for p in folder.iterdir()), "made as any folder is"
    back = huggingface.load(folder)
    assert back.cfg.replace(name=model.cfg.name) == model.cfg
    assert np.array_equal(_logits(back, PROMPT), _logits(model, PROMPT))
    if model.cfg.dtype != "float32":
        return
    torch, reference = _transformers_model(folder)
    with torch.no_grad():
        ref = reference(torch.tensor([PROMPT])).logits[0].double().numpy()
    assert _close(_logits(model, PROMPT), ref) <= 1e-4


def test_a_saved_folder_tokenizes_as_the_lab_does(tmp_path):
    from flax import nnx

    from inference_lab.base import folder_tokenizer, tokenizer
    from inference_lab.base.config import ModelConfig
    from inference_lab.model.transformer import Transformer

    folder = huggingface.save(Transformer(ModelConfig.preset("tiny"), rngs=nnx.Rngs(0)), tmp_path / "mine")
    tok, byte = folder_tokenizer.load(folder), tokenizer.ByteTokenizer()
    text = "ROMEO:\nBut soft, what light — naïve 東京 🎭"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    assert tok.encode(text) == byte.encode(text) and tok.decode(byte.encode(text)) == text
    assert tok.apply_chat_template(messages) == byte.apply_chat_template(messages)
    assert (tok.bos_id, tok.eos_ids) == (tokenizer.BOS, (tokenizer.EOS,))
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    assert reference.encode(text) == byte.encode(text)
    assert reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                         return_dict=False) == byte.apply_chat_template(messages)


def test_save_refuses_an_existing_folder_and_quantized_weights(tmp_path):
    from flax import nnx

    from inference_lab.base.config import ModelConfig
    from inference_lab.model.transformer import Transformer

    model = Transformer(ModelConfig.preset("tiny"), rngs=nnx.Rngs(0))
    (tmp_path / "taken").mkdir()
    with pytest.raises(ValueError, match="exists; pass a new folder's path"):
        huggingface.save(model, tmp_path / "taken")
    with pytest.raises(ValueError, match="weights are int8; save the float model"):
        huggingface.save(model.quantized("int8"), tmp_path / "q")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"], "nothing half-written"


def test_the_comparison_with_transformers_measures_both_on_one_folder(checkpoint):
    """python -m inference_lab.measure.versus_transformers, on a tiny folder: the two models agree
    and each phase has a time from each (docs/benchmarks.md holds the SmolLM2-135M run)."""
    pytest.importorskip("transformers")
    from inference_lab.measure import versus_transformers

    c, weights, folder, model = checkpoint
    r = versus_transformers.compare(folder, prompt_len=16, steps=2, repeats=1)
    assert r["agreement"] <= 1e-4
    assert all(r[side][key] > 0 for side in ("lab", "transformers") for key in ("prefill_s", "decode_step_s"))
    assert "prefill of 16 tokens" in versus_transformers.format_table(r)
