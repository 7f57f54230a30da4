"""The probe: its JSON follows schema_version 1 exactly, its table prints, its errors are clear."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inference_lab import hardware, measure, probe
from inference_lab.config import ModelConfig


@pytest.fixture
def quick_ceilings(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERENCE_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hardware, "_ceiling_sizes", lambda backend, key: (256, 2**20))


def test_probe_json_matches_schema(tmp_path, quick_ceilings, capsys):
    path = tmp_path / "probe.json"
    code = probe.main(["--preset", "tiny", "--prompt-len", "16", "--batch", "2", "--new-tokens", "3",
                       "--kernels", "reference", "--repeats", "1", "--json", str(path)])
    assert code == 0
    r = json.loads(path.read_text())
    assert tuple(r) == probe.TOP_KEYS and r["schema_version"] == 1
    assert set(r["versions"]) == {"python", "jax", "jaxlib", "flax"}
    assert set(r["model"]) == {"preset", "params", "dtype"} and r["model"]["preset"] == "tiny"
    assert set(r["ceilings"]) == {"matmul_flops_per_s", "bandwidth_bytes_per_s", "method"}
    assert tuple(r["prefill"]) == probe.PREFILL_KEYS
    assert [d["batch"] for d in r["decode"]] == [1, 2]            # batch 1 added for the ratio
    assert all(tuple(d) == probe.DECODE_KEYS and d["context"] == 16 for d in r["decode"])
    b1 = r["decode"][0]
    assert r["ratio"] == pytest.approx(r["prefill"]["prefill_tokens_per_s"] / b1["decode_tokens_per_s"])
    assert b1["decode_tokens_per_s"] == pytest.approx(1 / b1["step_seconds"])
    assert 0 < b1["mbu"] and 0 < r["prefill"]["mfu"]
    assert (r["kernels"], r["tp"], r["all_reduces_per_step"]) == ("reference", 1, 0)
    assert r["weight_bytes_per_device"] == 4 * r["model"]["params"]
    out = capsys.readouterr().out
    assert "prefill" in out and "decode" in out and "MBU" in out and "at batch 1" in out
    recs = measure.load_records(path)                               # the classroom path
    assert [x.phase for x in recs] == ["prefill", "decode", "decode"]


def test_probe_errors(capsys):
    assert probe.main(["--preset", "tiny", "--tp", "3"]) == 2     # checked before any device work
    assert "--tp 3: tp=3 does not divide" in capsys.readouterr().err
    assert probe.main(["--preset", "tiny", "--tp", "0"]) == 2
    assert "must be >= 1" in capsys.readouterr().err
    assert probe.main(["--preset", "nope"]) == 2
    assert "preset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        probe.build_parser().parse_args(["--batch", "1,x"])


def test_probe_tp_runs_on_simulated_devices(tmp_path):
    """--tp 2 in its own process, which starts with one CPU device: the probe adds the second."""
    path = tmp_path / "probe_tp.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", INFERENCE_LAB_CACHE=str(tmp_path / "cache"))
    script = Path(__file__).parent / "parallel_scripts" / "probe_tp.py"
    proc = subprocess.Popen([sys.executable, str(script), "--preset", "tiny", "--tp", "2", "--prompt-len", "16",
                             "--batch", "1", "--new-tokens", "3", "--kernels", "reference", "--repeats", "1",
                             "--json", str(path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log = proc.communicate(timeout=180)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, log[-3000:]
    r = json.loads(path.read_text())
    assert tuple(r) == probe.TOP_KEYS and r["tp"] == 2
    cfg = ModelConfig.preset("tiny")
    norms = 4 * cfg.d_model * (2 * cfg.n_layers + 1)                 # replicated RMSNorm scales
    assert r["weight_bytes_per_device"] == (4 * cfg.num_params - norms) // 2 + norms
    # Counted in the compiled decode step: 2 per layer + 1 for the vocabulary-split embedding.
    assert r["all_reduces_per_step"] == 2 * cfg.n_layers + 1
    assert r["decode"][0]["step_seconds"] > 0
    assert "tp 2, weights per device" in log
