"""Tensor parallelism: sharded logits equal one device's, bytes split 1/tp, collectives as laid out.

The multi-device checks run in their own processes (the number of simulated CPU devices is
fixed when jax starts): tests/parallel_scripts/sharded_checks.py with 4 devices, and two
processes of 2 devices each joined by jax.distributed into one 4-device mesh. Every child
has a timeout and is always ended.
"""

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inference_lab.model import parallel
from inference_lab.lessons import tensor_parallel
from inference_lab.base.checks import tensor_parallel as check_tp
from inference_lab.base.config import ModelConfig

SCRIPTS = Path(__file__).parent / "parallel_scripts"
TINY = ModelConfig.preset("tiny")


@pytest.fixture(scope="module")
def checks():
    """One 4-device child process runs every sharded model; the tests below read its JSON."""
    return tensor_parallel.run_with_devices(4, [sys.executable, str(SCRIPTS / "sharded_checks.py")], timeout=300)


def test_sharded_logits_equal_one_device(checks):
    # float32 logits of size ~3: the psums only reorder sums, so agreement is ~1e-6.
    assert 1 < checks["logit_scale"] < 100
    for tp in ("1", "2", "4"):
        r = checks["reference"][tp]
        assert r["prefill"] < 5e-5 and r["decode"] < 5e-5, (tp, r)
    r = checks["interpret"]["4"]  # Pallas kernels under the interpreter, inside shard_map
    assert r["prefill"] < 5e-5 and r["decode"] < 5e-5, r
    # The KV cache comes back split by KV heads (axis 2 of [B, S, Hkv, Dh]).
    assert checks["reference"]["4"]["cache_spec"] == "P(None, None, 'tp')"
    assert checks["reference"]["2"]["cache_spec"] == "P(None, None, 'tp')"


def test_generate_and_call_work_unchanged_on_a_sharded_model(checks):
    assert checks["generate"] == checks["generate_expected"]
    assert checks["call"] < 5e-5


def test_weights_per_device_are_one_tp_th(checks):
    b = checks["bytes"]
    assert b["total"] == 4 * TINY.num_params
    assert b["norms"] == 4 * TINY.d_model * (2 * TINY.n_layers + 1)
    for tp in (1, 2, 4):
        # Every matrix is split exactly; only the RMSNorm scales are replicated.
        assert b[str(tp)] == (b["total"] - b["norms"]) // tp + b["norms"], tp


def test_collectives_in_the_compiled_decode_step_match_the_layout(checks):
    c, layers = checks["collectives"], TINY.n_layers   # (one device: 0, see test_probe.py)
    # tp=1 mesh: attention-out and MLP-down psums over a 1-device axis; no vocabulary split.
    assert c["1"] == {"all_reduces": 2 * layers, "all_gathers": 0}
    for tp in ("2", "4"):
        # + 1 all-reduce assembling the vocabulary-split embedding rows, + 1 all-gather of
        # the vocabulary-split logits.
        assert c[tp] == {"all_reduces": 2 * layers + 1, "all_gathers": 1}, tp


def test_the_roofline_and_the_mechanism_accept_the_same_degrees():
    # One rule: the roofline refuses what parallel.shard would (the Shakespeare model's vocabulary of
    # 259 does not split in two), and accepts what it does.
    from inference_lab.analytic import costs

    bard = ModelConfig.preset("shakespeare")
    with pytest.raises(ValueError, match="vocab_size=259"):
        costs.weight_bytes(bard, tp=2)
    with pytest.raises(ValueError, match="vocab_size=259"):
        check_tp(bard, 2)
    assert costs.weight_bytes(TINY, tp=4) < costs.weight_bytes(TINY) and check_tp(TINY, 4) == 4


def test_degree_and_mesh_errors():
    with pytest.raises(ValueError, match=r"tp=3 does not divide .*n_kv_heads=4.*choose tp in \[1, 2, 4\]"):
        check_tp(TINY, 3)
    with pytest.raises(ValueError, match="n_kv_heads=2"):    # fewer KV heads than devices
        check_tp(TINY.replace(n_kv_heads=2), 4)
    with pytest.raises(ValueError, match="vocab_size=514"):
        check_tp(TINY.replace(vocab_size=514), 4)
    with pytest.raises(ValueError, match="integer >= 1"):
        check_tp(TINY, 0)
    with pytest.raises(ValueError, match="needs 8 devices but jax sees 2"):
        check_tp(TINY.replace(n_heads=8, n_kv_heads=8), 8, n_devices=2)
    import jax

    n = len(jax.devices())
    with pytest.raises(ValueError, match=f"tp={n + 1} needs {n + 1} devices.*xla_force_host_platform_device_count"):
        parallel.make_mesh(n + 1)
    from inference_lab.model.transformer import Transformer

    other = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    with pytest.raises(ValueError, match="axis named 'tp'"):
        parallel.shard(Transformer(TINY, kernels="reference"), other)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_form_one_mesh_and_match_one_process(tmp_path):
    """Two processes x 2 CPU devices, joined by jax.distributed.initialize on localhost."""
    out = tmp_path / "logits.npz"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(SCRIPTS / "two_process.py"), str(port), str(i), str(out)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=180)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(x[-2000:] for x in logs)

    from inference_lab.runtime import generation
    from inference_lab.model.kv_cache import KVCache
    from inference_lab.model.transformer import Transformer

    got = np.load(out)
    one = Transformer(TINY, kernels="reference")
    pre, cache = generation.prefill(one, got["tokens"], KVCache.create(TINY, 2, 8), lengths=[6, 4])
    dec, _ = generation.decode_step(one, [5, 7], cache)
    np.testing.assert_allclose(got["prefill"], np.asarray(pre), atol=5e-5, rtol=0)
    np.testing.assert_allclose(got["decode"], np.asarray(dec), atol=5e-5, rtol=0)


def test_tp_lesson_rows():
    from inference_lab.base import hardware
    from inference_lab.analytic import costs, roofline

    rows = tensor_parallel.tp_lesson("tiny", (1, 2, 4), spec="H100_SXM", steps=4, repeats=2)
    assert [r["tp"] for r in rows] == [1, 2, 4]
    total = 4 * TINY.num_params
    for r in rows:
        assert abs(r["weight_bytes_per_device"] - total / r["tp"]) < 0.01 * total, r
        assert r["measured_step_s"] > 0
    assert [r["all_reduces"] for r in rows] == [0, 2 * TINY.n_layers + 1, 2 * TINY.n_layers + 1]
    h100 = hardware.PRESETS["H100_SXM"]
    for r in rows:  # prediction = roofline step on the spec + ring all-reduces at half NVLink
        base = roofline.predict_time(costs.decode_cost(TINY, 1, 64, tp=r["tp"]), h100, TINY.dtype)
        assert r["predicted_step_s"] == pytest.approx(base + r["predicted_allreduce_s"])
    assert rows[0]["predicted_allreduce_s"] == 0 < rows[1]["predicted_allreduce_s"]
    # The tiny model's weights take about a microsecond on an H100; every split adds 2 x n_layers
    # all-reduces of ~8 us latency each: more devices, a longer predicted step (the latency term's doing).
    assert rows[1]["predicted_allreduce_s"] >= 2 * TINY.n_layers * h100.allreduce_latency_s
    assert rows[0]["predicted_step_s"] < rows[1]["predicted_step_s"]
    bytes_only = dataclasses.replace(h100, allreduce_latency_s=None)   # bytes alone: splitting shortens the step
    assert (roofline.predict_time(costs.decode_cost(TINY, 1, 64, tp=2), h100, TINY.dtype)
            + roofline.allreduce_time(TINY, bytes_only, 1, tp=2)) < rows[0]["predicted_step_s"]
    table = tensor_parallel.format_tp_rows(rows)
    assert table.count("\n") == 3 and "all-reduces" in table
