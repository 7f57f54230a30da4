"""A Hugging Face model folder as the lab's Transformer: Llama, Qwen2 and Mistral checkpoints.

    from inference_lab.model import huggingface
    model = huggingface.load("models/SmolLM2-135M")          # the folder's dtype, kernels="auto"
    model = huggingface.load(folder, dtype="float32", max_model_len=1024)

The folder is one a learner fetched beforehand (``huggingface-cli download HuggingFaceTB/SmolLM2-135M
--local-dir models/SmolLM2-135M``; the lab never downloads): ``config.json``, and the weights as
``model.safetensors`` or as shards listed by ``model.safetensors.index.json``. The weights land
in the lab's own layout (``transformer`` module docstring), so the model runs on the lab's
matmul and attention kernels like every preset:

=========================================== ============================= ===========================
Hugging Face tensor (per layer ``i``)       shape                         the lab's
=========================================== ============================= ===========================
model.embed_tokens.weight                   [V, D]                        embed (tied: head = its transpose)
lm_head.weight                              [V, D]                        head [D, V]
model.norm.weight                           [D]                           final_norm
model.layers.i.input_layernorm.weight       [D]                           attn_norm
model.layers.i.self_attn.{q,k,v}_proj       [Hq*Dh, D], [Hkv*Dh, D] x 2   w_qkv [D, Hkv, G + 2, Dh]
model.layers.i.self_attn.{q,k,v}_proj.bias  (Qwen2) [Hq*Dh], [Hkv*Dh] x 2 b_qkv [Hkv, G + 2, Dh]
model.layers.i.self_attn.o_proj.weight      [D, Hq*Dh]                    w_o [Hq*Dh, D]
model.layers.i.post_attention_layernorm     [D]                           mlp_norm
model.layers.i.mlp.{gate,up}_proj.weight    [F, D] x 2                    w_gate_up [D, 2, F]
model.layers.i.mlp.down_proj.weight         [D, F]                        w_down [F, D]
=========================================== ============================= ===========================

Query head ``h`` uses KV head ``h // G`` in both (Hugging Face's ``repeat_kv``), so regrouping the
three projections by KV head is a reshape. RoPE needs no conversion: Hugging Face's Llama-family
checkpoints store Q and K in the "rotate half" order the lab's ``rope`` uses (its conversion
script permuted Meta's interleaved pairs once, for every such checkpoint).

What cannot run as the checkpoint was trained is refused in one line naming it, before any
tensor is read: another architecture, mixtures of experts, a sliding window shorter than the
context asked for, RoPE scalings other than Llama 3's, biases the lab's layers do not have.
Every tensor's name, shape and dtype is checked against ``config.json`` from the files' headers
first; the weights' bytes in the requested dtype are checked against the memory there is; then
each tensor is read, checked finite and converted on its own, and each layer goes to the device
as soon as its tensors are in: a bad tensor stops the load with nothing kept.

The other way, :func:`save` writes any float model of the lab (a preset's random weights, the
trained Shakespeare models) as such a folder, the byte-level tokenizer with it: ``transformers``
and vLLM read it, so the lab and vLLM can serve the same weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from inference_lab.base import hardware
from inference_lab.base.config import DTYPES, ModelConfig
from inference_lab.model import weights
from inference_lab.model.transformer import Transformer

SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
DEFAULT_MAX_MODEL_LEN = 2048   # positions per sequence unless max_model_len says otherwise (the KV cache's size)
SINGLE_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
_FLOAT_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
_IGNORED = ("rotary_emb.inv_freq",)   # buffers some older checkpoints saved: recomputed, never read


def _config_json(folder: Path) -> dict:
    path = folder / "config.json"
    if not folder.is_dir():
        raise ValueError(f"model={str(folder)!r} is not a folder; pass a local Hugging Face model folder "
                         "(config.json and model.safetensors), fetched beforehand")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: missing; a Hugging Face model folder has config.json beside its weights "
                         "(fetch the whole folder)") from None
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not readable JSON ({str(err)[:100]}); fetch the folder again") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: holds a JSON {type(data).__name__}, not an object; fetch the folder again")
    return data


def read_config(folder, *, dtype: str | None = None, max_model_len: int | None = None) -> ModelConfig:
    """The lab's :class:`ModelConfig` for the checkpoint in ``folder`` (nothing else is read).

    ``dtype``: what the model computes and is stored in, "float32" or "bfloat16"; None takes the
    folder's (a float16 checkpoint becomes float32: exact, and the lab's kernels have no float16
    path). ``max_model_len`` (vLLM's flag): positions per sequence, at most the checkpoint's
    ``max_position_embeddings``; None takes that or :data:`DEFAULT_MAX_MODEL_LEN`, the smaller."""
    folder = Path(folder).expanduser()
    c = _config_json(folder)
    where = folder / "config.json"
    archs = c.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch not in SUPPORTED:
        raise ValueError(f"{where}: architecture {arch!r} is not supported; the lab runs {', '.join(SUPPORTED)}")

    def need(key, kind=int):
        value = c.get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{where}: {key}={value!r} must be a positive {kind.__name__}; the file is damaged "
                             "or not a decoder's config")
        return value

    unsupported = [what for what, present in (
        ("a mixture of experts", any(c.get(k) for k in ("num_local_experts", "num_experts", "n_routed_experts"))),
        (f"hidden_act={c.get('hidden_act')!r} (the lab's MLP is SwiGLU: silu)", c.get("hidden_act", "silu") != "silu"),
        ("attention_bias=true (biases on every attention projection, o_proj included)", bool(c.get("attention_bias"))),
        ("mlp_bias=true", bool(c.get("mlp_bias")))) if present]
    if unsupported:
        raise ValueError(f"{where}: {unsupported[0]} is not supported; the lab's layers are Llama's "
                         "(pick a Llama, Qwen2 or Mistral checkpoint without it)")
    hidden, n_heads = need("hidden_size"), need("num_attention_heads")
    n_kv_heads = c.get("num_key_value_heads") or n_heads
    head_dim = c.get("head_dim") or hidden // n_heads
    longest = need("max_position_embeddings")
    context = min(longest, DEFAULT_MAX_MODEL_LEN) if max_model_len is None else max_model_len
    if not isinstance(context, int) or isinstance(context, bool) or not 1 <= context <= longest:
        raise ValueError(f"max_model_len={max_model_len!r} must be an integer from 1 to the checkpoint's "
                         f"max_position_embeddings={longest}")
    window = c.get("sliding_window") if (arch != "Qwen2ForCausalLM" or c.get("use_sliding_window")) else None
    if window is not None and window < context:
        raise ValueError(f"{where}: sliding_window={window} attends to the last {window} positions only, and the lab's "
                         f"attention sees the whole context; pass max_model_len <= {window} (the window then never "
                         "applies)")
    return ModelConfig(
        name=folder.resolve().name, vocab_size=need("vocab_size"), d_model=hidden, n_layers=need("num_hidden_layers"),
        n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, d_ff=need("intermediate_size"),
        max_seq_len=context, rope_theta=float(c.get("rope_theta", 10_000.0)), norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)), dtype=_dtype(c, dtype, where),
        rope_scaling=_rope_scaling(c.get("rope_scaling"), where), qkv_bias=arch == "Qwen2ForCausalLM")


def _dtype(c: dict, dtype: str | None, where: Path) -> str:
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r} must be one of {', '.join(DTYPES)}")
        return dtype
    stored = c.get("torch_dtype") or c.get("dtype") or "float32"
    if stored not in (*DTYPES, "float16"):
        raise ValueError(f"{where}: torch_dtype={stored!r} is not a float dtype the lab loads; pass dtype= "
                         f"({', '.join(DTYPES)})")
    return "float32" if stored == "float16" else stored


def _rope_scaling(scaling, where: Path) -> tuple | None:
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
    if kind == "default":
        return None
    if kind != "llama3":
        raise ValueError(f"{where}: rope_scaling of type {kind!r} is not supported; the lab runs plain RoPE and "
                         "Llama 3's (rope_type 'llama3')")
    try:
        return (float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"]),
                int(scaling["original_max_position_embeddings"]))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{where}: rope_scaling lacks a usable {err}; Llama 3's has factor, low_freq_factor, "
                         "high_freq_factor and original_max_position_embeddings") from None


# ----------------------------------------------------------------------------- the weights
def hf_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of ``cfg`` must hold, Hugging Face name -> shape (a tied
    checkpoint may also hold ``lm_head.weight``: it is not read)."""
    d, dh, f, v = cfg.d_model, cfg.head_dim, cfg.d_ff, cfg.vocab_size
    hq, hkv = cfg.n_heads * dh, cfg.n_kv_heads * dh
    out = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = (v, d)
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                    p + "self_attn.q_proj.weight": (hq, d), p + "self_attn.k_proj.weight": (hkv, d),
                    p + "self_attn.v_proj.weight": (hkv, d), p + "self_attn.o_proj.weight": (d, hq),
                    p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                    p + "mlp.down_proj.weight": (d, f)})
        if cfg.qkv_bias:
            out.update({p + "self_attn.q_proj.bias": (hq,), p + "self_attn.k_proj.bias": (hkv,),
                        p + "self_attn.v_proj.bias": (hkv,)})
    return out


def _weight_files(folder: Path) -> tuple[dict[str, Path], Path]:
    """(tensor name -> the safetensors file that holds it, the file that lists them): one file,
    or the index's shards."""
    index = folder / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{index}: not a usable shard index ({str(err)[:100]}); fetch the folder again") from None
        files = {name: folder / str(shard) for name, shard in weight_map.items()}
        missing = sorted({p for p in files.values() if not p.is_file()})
        if missing:
            raise ValueError(f"{missing[0]}: missing ({len(missing)} shard(s) of {len(set(files.values()))}); "
                             "the download is partial: fetch the folder again")
        return files, index
    single = folder / SINGLE_FILE
    if not single.is_file():
        raise ValueError(f"{folder}: no {SINGLE_FILE} and no {INDEX_FILE}; the lab reads safetensors weights "
                         "(fetch them, or convert a .bin checkpoint to safetensors)")
    return {name: single for name in _headers(single)}, single


def _headers(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, safetensors dtype code) from one file's header, nothing loaded. A file
    shorter than its header says (a cut-off download) is refused here."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            out = {}
            for name in f.keys():
                sl = f.get_slice(name)
                out[name] = (tuple(int(x) for x in sl.get_shape()), sl.get_dtype())
            return out
    except Exception as err:   # safetensors raises its own SafetensorError for any damage
        raise ValueError(f"{path}: not a readable safetensors file ({str(err)[:120]}); the file is damaged or cut "
                         "short: fetch it again") from None


def _check(cfg: ModelConfig, files: dict[str, Path], listing: Path) -> None:
    want = hf_tensors(cfg)
    headers = {}
    for path in sorted(set(files.values())):
        headers.update(_headers(path))
    for name, shape in want.items():
        if name not in headers:
            raise ValueError(f"{listing}: tensor {name!r} is missing, and config.json's shape needs it; the folder's "
                             "weights and config disagree (or the download is partial)")
        have, code = headers[name]
        if have != shape:
            raise ValueError(f"{files[name]}: tensor {name!r} has shape {have} but config.json implies {shape}; "
                             "the weights and config.json are of different models")
        if code not in _FLOAT_DTYPES:
            raise ValueError(f"{files[name]}: tensor {name!r} is {code}, not a float (F32, BF16, F16); the lab loads "
                             "unquantized checkpoints")
    extra = sorted(n for n in headers if n not in want and not n.endswith(_IGNORED)
                   and not (cfg.tie_embeddings and n == "lm_head.weight"))
    if extra:
        raise ValueError(f"{files.get(extra[0], listing)}: tensor {extra[0]!r} is not part of a {cfg.name} with this "
                         "config.json; the weights and config disagree")


def _check_memory(cfg: ModelConfig) -> None:
    need = cfg.num_params * cfg.dtype_bytes
    stats = jax.devices()[0].memory_stats() or {}
    have = stats.get("bytes_limit") or hardware.process_memory_limit()
    if have and need > 0.9 * have:
        raise ValueError(f"{cfg.name}: {need / 1e9:.1f} GB of {cfg.dtype} weights do not fit the "
                         f"{have / 1e9:.1f} GB there is (90% usable); pass dtype='bfloat16' or pick a smaller model")


def _read(files: dict[str, Path], names, dtype: str):
    """Yield (name, array in ``dtype``), one tensor at a time, each checked finite."""
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(files[name], []).append(name)
    target = jnp.dtype(dtype)   # a NumPy dtype (bfloat16 through ml_dtypes)
    for path, wanted in by_file.items():
        try:
            with safe_open(str(path), framework="numpy") as f:
                for name in wanted:
                    x = f.get_tensor(name)
                    if not weights.all_finite(x):
                        raise ValueError(f"{path}: tensor {name!r} holds NaN or infinite values; the file is damaged: "
                                         "fetch it again")
                    yield name, x.astype(target)
        except ValueError:
            raise
        except Exception as err:
            raise ValueError(f"{path}: reading its tensors failed ({str(err)[:120]}); fetch it again") from None


def _lab_layer(cfg: ModelConfig, t: dict) -> dict:
    """One layer's Hugging Face tensors (names without their ``model.layers.i.`` prefix) in the
    lab's layout (this module's table)."""
    d, dh, hkv = cfg.d_model, cfg.head_dim, cfg.n_kv_heads
    g = cfg.n_heads // hkv
    # [out, D] -> [D, out], then the out axis split by KV head: its G query heads, then K, then V
    q = t["self_attn.q_proj.weight"].T.reshape(d, hkv, g, dh)
    k = t["self_attn.k_proj.weight"].T.reshape(d, hkv, 1, dh)
    v = t["self_attn.v_proj.weight"].T.reshape(d, hkv, 1, dh)
    layer = {"attn_norm": t["input_layernorm.weight"], "w_qkv": np.concatenate([q, k, v], axis=2),
             "w_o": t["self_attn.o_proj.weight"].T, "mlp_norm": t["post_attention_layernorm.weight"],
             "w_gate_up": np.stack([t["mlp.gate_proj.weight"].T, t["mlp.up_proj.weight"].T], axis=1),
             "w_down": t["mlp.down_proj.weight"].T}
    if cfg.qkv_bias:
        layer["b_qkv"] = np.concatenate([t["self_attn.q_proj.bias"].reshape(hkv, g, dh),
                                         t["self_attn.k_proj.bias"].reshape(hkv, 1, dh),
                                         t["self_attn.v_proj.bias"].reshape(hkv, 1, dh)], axis=1)
    return layer


def read_params(folder, cfg: ModelConfig) -> dict:
    """The checkpoint's weights as a :meth:`Transformer.params` dict for ``cfg`` (from
    :func:`read_config`): checked from the headers, then read a tensor at a time and placed on
    the device layer by layer."""
    folder = Path(folder).expanduser()
    files, listing = _weight_files(folder)
    _check(cfg, files, listing)
    _check_memory(cfg)
    want = hf_tensors(cfg)
    per_layer = sum(n.startswith("model.layers.0.") for n in want)
    top, partial, layers = {}, {}, [None] * cfg.n_layers
    for name, x in _read(files, list(want), cfg.dtype):   # shard by shard: layers may come in any order
        if not name.startswith("model.layers."):
            top[name] = x
            continue
        index, _, short = name[len("model.layers."):].partition(".")
        layer = partial.setdefault(int(index), {})
        layer[short] = x
        if len(layer) == per_layer:   # complete: into the lab's layout, on the device, host copy dropped
            layers[int(index)] = {k: jnp.asarray(np.ascontiguousarray(a)) for k, a in _lab_layer(cfg, layer).items()}
            del partial[int(index)]
    embed = top["model.embed_tokens.weight"]
    params = {"final_norm": jnp.asarray(top["model.norm.weight"]), "layers": layers,
              "head": jnp.asarray(np.ascontiguousarray((embed if cfg.tie_embeddings else top["lm_head.weight"]).T))}
    if not cfg.tie_embeddings:
        params["embed"] = jnp.asarray(embed)
    return params


def load(folder, *, dtype: str | None = None, max_model_len: int | None = None, kernels: str = "auto"):
    """The checkpoint in ``folder`` as a :class:`~inference_lab.model.transformer.Transformer`
    (:func:`read_config`'s ``dtype`` and ``max_model_len``; ``kernels`` as for every model)."""
    cfg = read_config(folder, dtype=dtype, max_model_len=max_model_len)
    return Transformer(cfg, kernels=kernels, params=read_params(folder, cfg))


# ----------------------------------------------------------------------------- writing a folder
def hf_config(cfg: ModelConfig) -> dict:
    """The ``config.json`` of a Hugging Face checkpoint of ``cfg``'s shape: Llama's, or Qwen2's when
    the layers have QKV biases (the inverse of :func:`read_config`)."""
    arch = "Qwen2ForCausalLM" if cfg.qkv_bias else "LlamaForCausalLM"
    c = {"architectures": [arch], "model_type": "qwen2" if cfg.qkv_bias else "llama",
         "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff,
         "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
         "head_dim": cfg.head_dim, "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
         "rope_theta": cfg.rope_theta, "hidden_act": "silu", "tie_word_embeddings": cfg.tie_embeddings,
         "torch_dtype": cfg.dtype, "attention_bias": False, "mlp_bias": False, "rope_scaling": None}
    if cfg.rope_scaling is not None:
        factor, low, high, original = cfg.rope_scaling
        c["rope_scaling"] = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                             "high_freq_factor": high, "original_max_position_embeddings": original}
    if cfg.qkv_bias:
        c["use_sliding_window"] = False
    return c


def _hf_layer(cfg: ModelConfig, layer: dict) -> dict:
    """One layer of the lab's layout as Hugging Face tensors (the inverse of :func:`_lab_layer`)."""
    d, g = cfg.d_model, cfg.n_heads // cfg.n_kv_heads
    w = layer["w_qkv"]                                   # [D, Hkv, G + 2, Dh]
    out = {"input_layernorm.weight": layer["attn_norm"], "post_attention_layernorm.weight": layer["mlp_norm"],
           "self_attn.q_proj.weight": w[:, :, :g].reshape(d, -1).T,
           "self_attn.k_proj.weight": w[:, :, g].reshape(d, -1).T,
           "self_attn.v_proj.weight": w[:, :, g + 1].reshape(d, -1).T, "self_attn.o_proj.weight": layer["w_o"].T,
           "mlp.gate_proj.weight": layer["w_gate_up"][:, 0].T, "mlp.up_proj.weight": layer["w_gate_up"][:, 1].T,
           "mlp.down_proj.weight": layer["w_down"].T}
    if cfg.qkv_bias:
        b = layer["b_qkv"]                               # [Hkv, G + 2, Dh]
        out.update({"self_attn.q_proj.bias": b[:, :g].reshape(-1), "self_attn.k_proj.bias": b[:, g].reshape(-1),
                    "self_attn.v_proj.bias": b[:, g + 1].reshape(-1)})
    return out


def save(model, folder) -> Path:
    """``model`` (a float :class:`~inference_lab.model.transformer.Transformer`: a preset's, a
    trained one, a loaded folder's) as a Hugging Face folder that :func:`load`, ``transformers`` and
    vLLM read: ``config.json`` (:func:`hf_config`), ``model.safetensors`` in the model's dtype, and
    the lab's byte-level tokenizer as ``tokenizer.json`` with its chat template
    (:func:`inference_lab.base.folder_tokenizer.save_byte_tokenizer`). A learner can then serve the
    same weights with the lab and with vLLM. ``folder`` must not exist yet: the folder is written
    beside it and renamed into place, so it is whole or absent."""
    import os
    import shutil
    import tempfile

    from safetensors.flax import save_file

    from inference_lab.base import folder_tokenizer

    cfg = model.cfg
    if cfg.quantization != "none":
        raise ValueError(f"the model's weights are {cfg.quantization}; save the float model (before .quantized())")
    folder = Path(folder).expanduser()
    if folder.exists():
        raise ValueError(f"folder={str(folder)!r} exists; pass a new folder's path (nothing is overwritten)")
    params = model.params()
    tensors = {"model.norm.weight": params["final_norm"],
               "model.embed_tokens.weight": params["head"].T if cfg.tie_embeddings else params["embed"]}
    if not cfg.tie_embeddings:
        tensors["lm_head.weight"] = params["head"].T
    for i, layer in enumerate(params["layers"]):
        tensors.update({f"model.layers.{i}.{name}": x for name, x in _hf_layer(cfg, layer).items()})
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        (staging / "config.json").write_text(json.dumps(hf_config(cfg), indent=2) + "\n")
        save_file({name: jnp.asarray(x) for name, x in tensors.items()}, str(staging / SINGLE_FILE),
                  metadata={"format": "pt"})   # "pt": what transformers asks of a safetensors file
        folder_tokenizer.save_byte_tokenizer(staging)
        mask = os.umask(0)
        os.umask(mask)   # (read the umask: the staging folder and safetensors' file were made private)
        for path in staging.iterdir():
            path.chmod(0o666 & ~mask)
        staging.chmod(0o777 & ~mask)
        staging.rename(folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder
