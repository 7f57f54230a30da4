"""Tiny random Hugging Face checkpoints, written in the test (CI has no network), and a float64
NumPy forward pass written from the architectures' definitions (Hugging Face's modeling_llama /
modeling_qwen2 / modeling_mistral), reading the checkpoint's own tensor names: it shares no code
with the lab's model, so a wrong regrouping of Q/K/V, a transposed matrix, a missed bias or
RoPE scaling shows up as different logits."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}


def config(kind: str, *, tied: bool = False, rope_scaling: dict | None = None, **overrides) -> dict:
    """A config.json as Hugging Face writes it for ``kind`` ("llama", "qwen2", "mistral"), tiny:
    2 layers, 4 query heads sharing 2 KV heads of 16, a vocabulary of 300."""
    c = {"architectures": [ARCHITECTURES[kind]], "model_type": kind, "vocab_size": 300, "hidden_size": 64,
         "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10_000.0 if kind != "qwen2" else 1e6,
         "hidden_act": "silu", "tie_word_embeddings": tied, "torch_dtype": "float32", "rope_scaling": rope_scaling,
         "bos_token_id": 1, "eos_token_id": 2}
    if kind == "mistral":
        c["sliding_window"] = 4096
    if kind == "qwen2":
        c.update(use_sliding_window=False, sliding_window=4096)
    return {**c, **overrides}


def tensors(c: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights with the names and shapes of ``c``'s architecture (norm scales
    around 1, biases small, everything else std 1/sqrt(fan_in))."""
    rng = np.random.default_rng(seed)
    d, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    dh = c.get("head_dim") or d // c["num_attention_heads"]
    hq, hkv = c["num_attention_heads"] * dh, c["num_key_value_heads"] * dh

    def w(*shape):
        return (rng.standard_normal(shape) / math.sqrt(shape[-1])).astype(np.float32)

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    out = {"model.embed_tokens.weight": rng.standard_normal((v, d)).astype(np.float32), "model.norm.weight": norm(d)}
    if not c["tie_word_embeddings"]:
        out["lm_head.weight"] = w(v, d)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": norm(d), p + "post_attention_layernorm.weight": norm(d),
                    p + "self_attn.q_proj.weight": w(hq, d), p + "self_attn.k_proj.weight": w(hkv, d),
                    p + "self_attn.v_proj.weight": w(hkv, d), p + "self_attn.o_proj.weight": w(d, hq),
                    p + "mlp.gate_proj.weight": w(f, d), p + "mlp.up_proj.weight": w(f, d),
                    p + "mlp.down_proj.weight": w(d, f)})
        if c["architectures"][0] == "Qwen2ForCausalLM":
            out.update({p + "self_attn.q_proj.bias": (0.5 * rng.standard_normal(hq)).astype(np.float32),
                        p + "self_attn.k_proj.bias": (0.5 * rng.standard_normal(hkv)).astype(np.float32),
                        p + "self_attn.v_proj.bias": (0.5 * rng.standard_normal(hkv)).astype(np.float32)})
    return out


def write(folder: Path, c: dict, weights: dict[str, np.ndarray], *, shards: int = 1) -> Path:
    """config.json and the weights as Hugging Face lays them out: ``model.safetensors``, or
    ``shards`` files ``model-0000k-of-0000n.safetensors`` and their index."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(c, indent=2))
    if shards == 1:
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder
    names = list(weights)[::-1]   # the last layers first: a loader must not rely on the order
    weight_map = {}
    for k in range(shards):
        part = names[k::shards]
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: weights[n] for n in part}, str(folder / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(x.nbytes for x in weights.values())}, "weight_map": weight_map}))
    return folder


SPECIAL = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]   # ids 0..4: config()'s bos 1 and eos 2
TEXT = ("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and "
        "arrows of outrageous fortune, or to take arms against a sea of troubles.")
# ChatML, as SmolLM2's and Qwen2's templates write it, with a refusal as Llama 2's and Mistral's have
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}"
                 "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
                 "{{ raise_exception('Unknown role: ' + m['role']) }}{% endif %}"
                 "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tokenizer(folder: Path, vocab_size: int = 280, generation_config: dict | None = None,
                    chat_template: str | None = CHAT_TEMPLATE) -> Path:
    """A byte-level BPE ``tokenizer.json`` trained here with ``tokenizers`` (Llama 3's and Qwen2's
    kind: 256 byte symbols, five special tokens, the rest merges), adding ``<s>`` in front as
    Llama's post-processor does; ``tokenizer_config.json`` with the chat template (none when
    ``chat_template`` is None); and ``generation_config.json`` when given."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT] * 4, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "add_bos_token": True, "model_max_length": 256}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if generation_config is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation_config))
    return folder


# ----------------------------------------------------------------------------- the float64 reference
def _rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _inv_freq(c: dict, dh: int) -> np.ndarray:
    inv = 1.0 / c["rope_theta"] ** (np.arange(0, dh, 2) / dh)
    s = c.get("rope_scaling")
    if s:   # Llama 3: slow the long wavelengths down, keep the short, blend between
        factor, low, high, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
        out = []
        for f in inv:
            wavelength = 2 * math.pi / f
            if wavelength < old / high:
                out.append(f)
            elif wavelength > old / low:
                out.append(f / factor)
            else:
                smooth = (old / wavelength - low) / (high - low)
                out.append((1 - smooth) * f / factor + smooth * f)
        inv = np.array(out)
    return inv


def _rotate(x, cos, sin):   # x [T, H, Dh]; Hugging Face's rotate_half
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def forward(c: dict, w: dict[str, np.ndarray], tokens) -> np.ndarray:
    """float64 logits [T, V] of one sequence, every position."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    d, nh, nkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    dh = c.get("head_dim") or d // nh
    t = len(tokens)
    x = w["model.embed_tokens.weight"][np.asarray(tokens)]
    angles = np.arange(t)[:, None] * _inv_freq(c, dh)[None, :]
    cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))
    causal = np.tril(np.ones((t, t), bool))
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rms_norm(x, w[p + "input_layernorm.weight"], c["rms_norm_eps"])

        def proj(name):
            y = h @ w[p + f"self_attn.{name}.weight"].T
            return y + w[p + f"self_attn.{name}.bias"] if p + f"self_attn.{name}.bias" in w else y
        q = _rotate(proj("q_proj").reshape(t, nh, dh), cos, sin)
        k = _rotate(proj("k_proj").reshape(t, nkv, dh), cos, sin)
        v = proj("v_proj").reshape(t, nkv, dh)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)   # repeat_kv
        scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(dh)
        scores = np.where(causal[None], scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(t, nh * dh)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], c["rms_norm_eps"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = _rms_norm(x, w["model.norm.weight"], c["rms_norm_eps"])
    head = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def greedy(c: dict, w: dict[str, np.ndarray], prompt, n: int) -> list[int]:
    """``n`` greedy tokens after ``prompt``, each from a whole forward pass again (no cache)."""
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(np.argmax(forward(c, w, tokens)[-1])))
    return tokens[len(prompt):]
