"""The shipped trained model: golden greedy text, Pallas (interpreted) = reference, cached
decode = uncached recomputation, training lowers the loss, and damaged files fail clearly."""

import dataclasses
import json
import math
import os

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from inference_lab.model import pretrained
from inference_lab.base import tokenizer
from inference_lab.base.config import ModelConfig
from inference_lab.runtime.generation import generate
from inference_lab.model.transformer import Transformer

PROMPT = "ROMEO:"
# Greedy continuation of PROMPT by the shipped weights, reference kernels (f32, on a CPU).
# Regenerate with: generate(pretrained.load(kernels="reference"), "ROMEO:", len(GOLDEN)) after
# retraining. Every step's top-1 logit leads the runner-up by more than 0.018 (checked when
# it was stored), so it does not hinge on the last bits of float32 rounding.
GOLDEN = ('\nI will not be so soon a sight of the seas\n'
          'To see his head and the sea to be so stand,\nAnd then the ')
INTERPRET_TOKENS = 6     # the interpreted Pallas kernels are slow on a CPU: a short continuation

# A small config for the tests that write files and train (fast to compile and run).
MINI = ModelConfig(name="mini", vocab_size=259, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                   head_dim=16, d_ff=64, max_seq_len=64)


@pytest.fixture(scope="module")
def model():
    return pretrained.load(kernels="reference")


def test_shipped_weights_match_the_preset(model):
    assert model.cfg == ModelConfig.preset("shakespeare")
    assert pretrained.WEIGHTS_PATH.is_file()
    assert model.kernels == "reference"


def test_greedy_continuation_is_the_golden_text(model):
    assert generate(model, PROMPT, len(GOLDEN)) == GOLDEN


def test_interpreted_pallas_kernels_write_the_same_tokens():
    pallas_model = pretrained.load(kernels="interpret")
    assert pallas_model.kernels == "interpret"
    assert generate(pallas_model, PROMPT, INTERPRET_TOKENS) == GOLDEN[:INTERPRET_TOKENS]


def test_cached_decode_equals_uncached_argmax_ragged_batch(model):
    """generate (prefill + KV-cached decode loop) vs recomputing the whole prefix every step."""
    steps = 64
    prompts = [tokenizer.encode("ROMEO:"), tokenizer.encode("JULIET:\nO Romeo, Romeo! wherefore art thou")]
    cached = generate(model, prompts, steps)

    lengths = [len(p) for p in prompts]
    buf = np.full((len(prompts), max(lengths) + steps), tokenizer.PAD, np.int32)
    for i, p in enumerate(prompts):
        buf[i, : len(p)] = p
    uncached = [[] for _ in prompts]
    for _ in range(steps):
        # One fixed width for every step (one compile): causal attention means the padding to
        # the right of each row's prefix cannot change the logits at its last real token.
        logits = np.asarray(model(buf))                         # [B, W, V], no cache
        for i, n in enumerate(lengths):
            nxt = int(np.argmax(logits[i, n - 1]))
            uncached[i].append(nxt)
            buf[i, n] = nxt
            lengths[i] = n + 1
    assert cached == uncached
    assert lengths[0] != lengths[1]                             # the batch really was ragged


def test_training_lowers_the_loss(tmp_path):
    from inference_lab.train import train

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 60)
    out = tmp_path / "mini.safetensors"
    result = train(corpus, out, cfg=MINI, steps=40, batch=8, seq_len=32, lr=1e-2, warmup=5,
                   eval_every=10, seed=0, progress=False)
    held = [h for _, _, h in result.history]
    assert held[0] < math.log(MINI.vocab_size)                # already learning at the first eval
    assert held[-1] < 0.5 * held[0], held                      # and the held-out loss keeps falling
    assert result.heldout_nats_per_byte == held[-1]
    assert result.heldout_bits_per_byte == pytest.approx(held[-1] / math.log(2))
    assert result.tokens_seen == 40 * 8 * 32
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt", "mini.safetensors"]  # no temp file left
    assert Transformer.load(out, kernels="reference").cfg == MINI
    assert pretrained.load(path=out, kernels="reference").cfg == MINI


@pytest.mark.parametrize("args, message", [
    (["--corpus", "{tmp}/nope.txt"], "does not exist"),
    (["--corpus", "{tmp}/empty.txt"], "is empty"),
    (["--corpus", "{tmp}/text.txt", "--out", "{tmp}/no/such/folder/x.safetensors"], "folder"),
    (["--corpus", "{tmp}/text.txt", "--steps", "0"], "steps=0 must be a positive integer"),
    (["--corpus", "{tmp}/text.txt", "--lr", "nan"], "lr=nan"),
    (["--corpus", "{tmp}/text.txt", "--seq-len", "100000"], "max_seq_len"),
])
def test_train_cli_fails_in_one_line_before_training(tmp_path, capsys, args, message):
    from inference_lab.cli import main

    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "text.txt").write_text("some text " * 100)
    argv = ["train", "--out", str(tmp_path / "out.safetensors")] + [a.format(tmp=tmp_path) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train: error: ") and message in err[0], err
    assert not (tmp_path / "out.safetensors").exists()


# ----------------------------------------------------------------------------- damaged files
@pytest.fixture(scope="module")
def mini_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("mini") / "mini.safetensors"
    Transformer(MINI, kernels="reference").save(path)
    return path


def _rewrite(src, dst, change):
    tensors = load_file(str(src))
    change(tensors)
    save_file(tensors, str(dst), metadata={"config": json.dumps(dataclasses.asdict(MINI)),
                                           "format": "inference_lab.Transformer/1"})
    return dst


def test_a_good_file_loads(mini_file):
    assert pretrained.load(path=mini_file, kernels="reference").cfg == MINI


def test_wrong_shape_names_the_tensor(mini_file, tmp_path):
    def change(t):
        t["layers.0.w_down"] = np.zeros((MINI.d_ff + 1, MINI.d_model), np.float32)
    bad = _rewrite(mini_file, tmp_path / "shape.safetensors", change)
    with pytest.raises(ValueError, match=r"tensor 'layers\.0\.w_down' has shape \(65, 32\) but the config needs \(64, 32\)"):
        pretrained.load(path=bad)


def test_missing_tensor_names_the_tensor(mini_file, tmp_path):
    bad = _rewrite(mini_file, tmp_path / "missing.safetensors", lambda t: t.pop("final_norm"))
    with pytest.raises(ValueError, match=r"tensor 'final_norm' is missing"):
        pretrained.load(path=bad)


def test_wrong_dtype_names_the_tensor(mini_file, tmp_path):
    def change(t):
        t["embed"] = t["embed"].astype(np.float16)
    bad = _rewrite(mini_file, tmp_path / "dtype.safetensors", change)
    with pytest.raises(ValueError, match=r"tensor 'embed' is float16 but the config's dtype is float32"):
        pretrained.load(path=bad)


def test_extra_tensor_and_missing_file_are_reported(mini_file, tmp_path):
    def change(t):
        t["layers.1.w_o"] = np.zeros((32, 32), np.float32)
    bad = _rewrite(mini_file, tmp_path / "extra.safetensors", change)
    with pytest.raises(ValueError, match=r"tensor 'layers\.1\.w_o' is not part of a model with this config"):
        pretrained.load(path=bad)
    with pytest.raises(ValueError, match="is not a file"):
        pretrained.load(path=tmp_path / "absent.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        pretrained.load(path=tmp_path / "junk.safetensors")


# ----------------------------------------------------------------------------- the second model
# Greedy continuation of LARGE_PROMPT by the shipped shakespeare_large weights (reference kernels,
# f32 on a CPU), as for GOLDEN above. Every step's top-1 logit leads the runner-up by more than
# 0.024 (checked when it was stored; from "ROMEO:" the lead fell to 0.0017, too close to the last
# bits of float32 rounding on another processor).
LARGE_PROMPT = "MENENIUS:"
GOLDEN_LARGE = "\nI will be so much a stand the state the state,\nAnd then the statue of the state"


@pytest.fixture(scope="module")
def large():
    return pretrained.load(kernels="reference", preset="shakespeare_large")


def test_large_model_matches_its_preset_and_is_stored_in_bf16(large):
    from safetensors import safe_open

    assert large.cfg == ModelConfig.preset("shakespeare_large") and large.cfg.dtype == "float32"
    assert all(str(x.dtype) == "float32" for x in jax.tree.leaves(large.params()))
    with safe_open(str(pretrained.SHIPPED["shakespeare_large"]), framework="numpy") as f:
        assert {f.get_slice(n).get_dtype() for n in f.keys()} == {"BF16"}
        assert json.loads(f.metadata()["config"])["dtype"] == "bfloat16"
    # bigger than the first model, and past a 32 MiB last-level cache as float32
    assert large.nbytes > 1.5 * 32 * 2**20 and large.cfg.num_params > 7 * ModelConfig.preset("shakespeare").num_params


def test_large_model_greedy_text_is_golden(large):
    assert generate(large, LARGE_PROMPT, len(GOLDEN_LARGE)) == GOLDEN_LARGE


def test_heldout_prompts_come_from_text_neither_model_trained_on():
    prompts = pretrained.heldout_prompts()
    assert len(prompts) == 8 and all(48 <= len(p) <= 110 and p.endswith(":\n") for p in prompts)
    source = json.loads(pretrained.HELDOUT_PROMPTS.read_text())
    assert all(p["offset"] >= 1_003_855 for p in source["prompts"])      # the held-out 10% starts there


def test_unknown_preset_and_cast_weights(tmp_path, mini_file):
    from inference_lab.model import weights

    with pytest.raises(ValueError, match="no shipped weights"):
        pretrained.load(preset="small")
    half = tmp_path / "half.safetensors"
    weights.cast(mini_file, half, "bfloat16")
    cfg, params = weights.read(half)
    assert cfg == dataclasses.replace(MINI, dtype="bfloat16") and str(params["head"].dtype) == "bfloat16"
    with pytest.raises(ValueError, match="dtype="):
        weights.cast(mini_file, half, "float16")


def test_evaluate_reads_the_held_out_end(tmp_path, mini_file):
    from inference_lab import train

    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"to be or not to be, that is the question. " * 40)
    loss = train.evaluate(corpus, pretrained.load(path=mini_file, kernels="reference"), seq_len=32)
    assert 0 < loss < 2 * math.log(259)                                   # an untrained model: about ln 259
