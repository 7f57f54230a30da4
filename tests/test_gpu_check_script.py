"""scripts/gpu_check.sh is one command a GPU owner can run and read: it parses, limits every
step, keeps at most 8 result files, exits non-zero on a failure, and its summary reads the
benchmark's and the probe's JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_summary  # noqa: E402


def test_script_parses_and_limits_every_step():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    steps = [line for line in text.splitlines() if line.strip().startswith("step ") and "()" not in line]
    assert len(steps) >= 5
    limits = [int(line.split()[2]) for line in steps]
    assert sum(limits) <= 8 * 60, f"the steps may take {sum(limits)} s: more than ~8 minutes"
    assert 'exit "$failed"' in text and "timeout" in text
    # at most 8 files come back from a device run
    outputs = {"run.log", "gpu_tests.xml", "bench.json", "probe_base.json", "probe_llama3_8b.json", "summary.txt"}
    assert all(name in text for name in outputs) and len(outputs) <= 8


def test_summary_reads_bench_and_probe(tmp_path):
    bench = {"meta": {"device": "NVIDIA H200", "jax": "0.11.2", "kernel_mode": "pallas"},
             "rows": [{"kernel": "matmul", "shape": "8192x8192x8192 bfloat16", "impl": "pallas[pallas]", "ours": True,
                       "bound": "compute", "tflops": 700.0, "pct_matmul_peak": 90.0},
                      {"kernel": "decode_attention", "shape": "B64", "impl": "pallas[pallas]", "ours": True,
                       "error": "RuntimeError: boom"},
                      {"kernel": "matmul_decode", "shape": "base qkv M1", "impl": "xla jnp.dot", "bound": "memory",
                       "tbps": 3.9, "pct_bandwidth": 91.0}]}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    probe = {"device": "NVIDIA H200", "kernels": "pallas", "model": {"preset": "base", "dtype": "bfloat16"},
             "prefill": {"prompt_len": 512, "prefill_tokens_per_s": 150000.0, "mfu": 0.4}, "ratio": 120.0,
             "decode": [{"batch": 1, "decode_tokens_per_s": 1250.0, "step_seconds": 0.0008, "mbu": 0.45, "mfu": 0.01}]}
    (tmp_path / "probe_base.json").write_text(json.dumps(probe))
    text = gpu_summary.summary(tmp_path)
    assert "700.0 TFLOP/s" in text and "FAILED" in text and "3.900 TB/s" in text
    assert "decode batch    1" in text and "MBU  45%" in text and "120.0x" in text
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no bench.json" in gpu_summary.summary(empty)
