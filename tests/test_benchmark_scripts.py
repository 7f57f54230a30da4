"""The benchmark scripts whose tables docs/benchmarks.md keeps run, so the tables cannot rot:
scripts/plain_jax_twin.py (the plain-JAX twin computes the lab's model: the same greedy tokens) and
scripts/read_ceiling_check.py (every stream beside the read ceiling)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from flax import nnx

from inference_lab.base.config import ModelConfig
from inference_lab.model.transformer import Transformer

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _script(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_twin_is_the_same_model_and_its_table_prints(capsys):
    twin = _script("plain_jax_twin")
    model = Transformer(ModelConfig.preset("tiny"), rngs=nnx.Rngs(0), kernels="reference")
    twin.check_same_tokens(model, twin.twin_weights(model), 12)      # raises if any token differs
    assert twin.main(["--preset", "tiny", "--prompt-len", "16", "--steps", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "prefill, batch 1" in out and "decode, batch 32" in out and "processor:" in out


def test_the_read_ceiling_check_prints_every_stream(capsys):
    code = _script("read_ceiling_check").main(["--preset", "tiny", "--repeats", "2", "--buffer-mib", "16"])
    out = capsys.readouterr().out
    assert "read ceiling (MBU is against it)" in out and "in-place copy" in out and "tiny decode step" in out
    assert code in (0, 1) and (code == 1) == ("NOT A CEILING" in out)   # a verdict either way, never silent


def test_the_quantization_bench_times_every_formulation_and_format():
    bench = _script("quantization_bench")
    cfg = ModelConfig.preset("tiny")
    names = [n for n in bench.FORMULATIONS if "baseline" in n or "kept" in n or "blocked" in n]
    part1 = bench.formulations(cfg, batches=(1,), repeats=1, names=names)
    assert list(part1[1]) == names and all(t > 0 for t in part1[1].values())
    formats = {k: bench.FORMATS[k] for k in ("float32", "int8 (kept: int8 activations)", "int4 g32")}
    part2 = bench.models("tiny", batches=(1,), context=8, prompt_len=16, repeats=1, formats=formats)
    assert part2["int8 (kept: int8 activations)"]["weight_bytes"] < part2["float32"]["weight_bytes"] / 3
    table = bench.markdown(part1, part2, "tiny")
    assert "rows padded to 2 (kept)" in table and "| int4 g32 |" in table and "fused" not in table
