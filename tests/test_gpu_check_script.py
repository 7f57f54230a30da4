"""scripts/gpu_check.sh is one command a GPU owner can run and read: it parses, limits every
step, keeps at most 8 result files, exits non-zero on a failure, and its summary reads the
benchmark's and the probe's JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_summary  # noqa: E402


def _plan(text: str) -> dict:
    """{step: (full-run limit, QUICK=1 limit)} from the script's PLAN table."""
    table = text.split('PLAN="', 1)[1].split('"', 1)[0]
    return {name: (int(full), int(quick)) for name, full, quick in (line.split() for line in table.strip().splitlines())}


def test_script_parses_and_keeps_to_its_time_plan():
    """A cold H200 lease is 15 minutes: the check promises 5 (QUICK=1: 2), every step limited by
    its line of the plan, and a step outside the plan (the twin) runs only on the time left."""
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    plan = _plan(text)
    assert set(plan) == {"env", "gpu_tests", "bench", "probe_base", "probe_8b"}
    assert sum(full for full, _ in plan.values()) <= 5 * 60
    assert sum(quick for _, quick in plan.values()) <= 2 * 60
    assert plan["gpu_tests"][1] > 0 and plan["probe_base"][1] > 0      # what a rerun is for
    steps = [line.split()[1] for line in text.splitlines() if line.strip().startswith("step ") and "()" not in line]
    assert set(plan) <= set(steps) and set(steps) - set(plan) == {"twin_base", "twin_8b"}
    assert 'exit "$failed"' in text and "timeout" in text and "BUDGET - SECONDS" in text
    # at most 8 files come back from a device run
    outputs = {"run.log", "gpu_tests.xml", "bench.json", "probe_base.json", "probe_llama3_8b.json", "summary.txt"}
    assert all(name in text for name in outputs) and len(outputs) <= 8


def test_script_rehearses_on_a_cpu(tmp_path):
    """The whole script on this CPU with tiny presets (the GPU tests skip): every step passes and
    only the promised files are left, the test groups' reports merged into one."""
    env = dict(os.environ, GPU_CHECK_BASE="tiny", GPU_CHECK_BIG="tiny", GPU_CHECK_BATCHES="1,2",
               GPU_CHECK_PROMPT_LEN="32", QUICK="1", OUT=str(tmp_path), PY=sys.executable, INFERENCE_LAB_PROGRESS="0")
    done = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert {p.name for p in tmp_path.iterdir()} == {"run.log", "gpu_tests.xml", "probe_base.json", "summary.txt"}
    assert "bench        skipped (not in this plan)" in done.stdout
    assert "compiled in" in (tmp_path / "summary.txt").read_text()
    suites = ET.parse(tmp_path / "gpu_tests.xml").getroot()
    assert suites.tag == "testsuites" and len(suites) == 3


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
