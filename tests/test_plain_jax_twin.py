"""scripts/plain_jax_twin.py: the plain-JAX twin computes the lab's model (the same greedy tokens) and
its side-by-side table runs, so the benchmark in docs/benchmarks.md cannot rot."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from flax import nnx

from inference_lab.base.config import ModelConfig
from inference_lab.model.transformer import Transformer

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "plain_jax_twin.py"


def _twin():
    spec = importlib.util.spec_from_file_location("plain_jax_twin", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_twin_is_the_same_model_and_its_table_prints(capsys):
    twin = _twin()
    model = Transformer(ModelConfig.preset("tiny"), rngs=nnx.Rngs(0), kernels="reference")
    twin.check_same_tokens(model, twin.twin_weights(model), 12)      # raises if any token differs
    assert twin.main(["--preset", "tiny", "--prompt-len", "16", "--steps", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "prefill, batch 1" in out and "decode, batch 32" in out and "processor:" in out
