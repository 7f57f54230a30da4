"""The benchmark scripts whose tables docs/benchmarks.md keeps run, so the tables cannot rot:
scripts/plain_jax_twin.py (the plain-JAX twin computes the lab's model: the same greedy tokens) and
scripts/read_ceiling_check.py (every stream beside the read ceiling) and scripts/tune_decode.py (the
decode kernels' candidates, timed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from flax import nnx

from inference_lab.base.config import ModelConfig
from inference_lab.model.transformer import Transformer

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _script(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # a dataclass of the script looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_twin_is_the_same_model_and_its_table_prints(capsys):
    twin = _script("plain_jax_twin")
    model = Transformer(ModelConfig.preset("tiny"), rngs=nnx.Rngs(0), kernels="reference")
    twin.check_same_tokens(model, twin.twin_weights(model), 12)      # raises if any token differs
    # in bfloat16 (the GPU presets' dtype) its caches are bfloat16 too and its logits agree to 8 bits;
    # a twin with one matrix wrong is refused there as well
    half = Transformer(ModelConfig.preset("tiny", dtype="bfloat16"), rngs=nnx.Rngs(0), kernels="reference")
    w = twin.twin_weights(half)
    assert "the twin is the lab's model" in twin.check_same_tokens(half, w, 12)
    w["layers"][0]["wo"] = w["layers"][0]["wo"] * 3
    with pytest.raises(AssertionError, match="prefill logits differ"):
        twin.check_same_tokens(half, w, 12)
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


def test_the_tuning_script_tries_each_candidate_and_keeps_the_fastest(tmp_path, capsys):
    """scripts/tune_decode.py rehearsed on the CPU (interpreted kernels, tiny shapes): each case times
    the plan's own config and the candidates after it, keeps the fastest, and names the winner."""
    import json

    tune = _script("tune_decode")
    path = tmp_path / "tuned.json"
    assert tune.main(["--quick", "--tiers", "triton", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "NOT REPRESENTATIVE" in out and "wins: triton" in out
    results = json.loads(path.read_text())["results"]
    assert [r["kernel"] for r in results] == ["matmul", "decode_attention", "paged_decode_attention"]
    for r in results:
        tried = r["tiers"]["triton"]["tried"]
        assert tried[0]["config"] == "plan" and len(tried) == 2
        assert r["tiers"]["triton"]["best_s"] == min(t["seconds"] for t in tried)
    # the GPU grids: the plan first, every Mosaic candidate fits a Hopper CTA's shared memory
    for tier in ("triton", "mosaic"):
        grid = tune.matmul_candidates(1, 2048, 3072, tier, quick=True)
        assert grid[0] is None and len(grid) > 4 and len(set(grid)) == len(grid)
        assert tune.attention_candidates(64, 4096, 8, 128, tier, False, quick=True)[0] is None
    assert tune.main(["--tiers", "cuda"]) == 2
