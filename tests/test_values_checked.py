"""Values the config, weights, engine, simulator and widgets accept (issue 25, root cause 6):
each bad one is refused in one line naming it, before any work; the odd-but-meaningful ones do
what they mean."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inference_lab.analytic import roofline, simulator
from inference_lab.analytic.phases import roofline_phases
from inference_lab.analytic.workload import Requests
from inference_lab.base import hardware
from inference_lab.base.config import ModelConfig

ROOT = Path(__file__).resolve().parent.parent
TINY = ModelConfig.preset("tiny")


@pytest.mark.parametrize("field, value", [("rope_theta", -1.0), ("rope_theta", "abc"), ("norm_eps", math.nan),
                                          ("tie_embeddings", "no"), ("tie_embeddings", 1), ("name", "")])
def test_config_fields_are_checked(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(TINY, **{field: value})


def test_a_weights_file_of_nan_is_refused(tmp_path):
    from inference_lab.model import weights
    from inference_lab.model.transformer import Transformer

    cfg = TINY.replace(n_layers=1, d_model=64, d_ff=128, n_heads=2, n_kv_heads=1, head_dim=32)
    model = Transformer(cfg, kernels="reference")
    params = model.params()
    params["layers"][0]["w_down"] = params["layers"][0]["w_down"] * np.nan
    weights.save(tmp_path / "nan.safetensors", cfg, params)
    with pytest.raises(ValueError, match="w_down.*NaN or infinite"):
        weights.read(tmp_path / "nan.safetensors")


@pytest.fixture(scope="module")
def shakespeare():
    from inference_lab.model import pretrained
    return pretrained.load(preset="shakespeare")


def test_generate_checks_seed_and_steps_and_a_tiny_temperature_is_greedy(shakespeare):
    from inference_lab.model.kv_cache import KVCache
    from inference_lab.runtime import generation

    for seed in (2**64, "x", 1.5, -1, True):
        with pytest.raises(ValueError, match="seed"):
            generation.generate(shakespeare, "ROMEO:", 4, temperature=0.5, seed=seed)
    greedy = generation.generate(shakespeare, "ROMEO:\n", 12)
    assert generation.generate(shakespeare, "ROMEO:\n", 12, temperature=1e-40) == greedy and "\x00" not in greedy
    with pytest.raises(ValueError, match="steps"):
        generation.decode_loop(shakespeare, np.zeros(1, np.int32), KVCache.create(shakespeare.cfg, 1, 16), True)


def test_flash_attention_causal_must_be_a_bool():
    import jax.numpy as jnp

    import pallas_kernels as pk

    q = jnp.zeros((1, 8, 2, 16))
    with pytest.raises(ValueError, match="causal"):
        pk.flash_attention(q, q, q, causal="no", mode="reference")


def test_roofline_headroom_and_simulator_inputs():
    spec = hardware.PRESETS["H100_SXM"]
    big = ModelConfig.preset("llama3_8b")
    with pytest.raises(ValueError, match="headroom"):
        roofline.fits(big, 64, 8192, spec, headroom=5)
    phases = roofline_phases(TINY, spec)
    ok = Requests(np.array([0.0, 0.1]), np.array([10, 20]), np.array([5, 5]))
    with pytest.raises(ValueError, match="transfer_latency_s"):
        simulator.simulate_requests(ok, phases, mode="colocated", transfer_latency_s=math.nan)
    for arrays, word in (((np.array([0.0, np.nan]), [10, 20], [5, 5]), "arrival"),
                         ((np.array([0.0]), [10, 20], [5, 5]), "entries"),
                         ((np.array([0.0, 0.1]), [10, 20], [0, 5]), "output_len"),
                         ((np.array([0.0, 0.1]), [10, 20], [5, 10**8]), "output_len")):
        with pytest.raises(ValueError, match=word):
            Requests(arrays[0], np.asarray(arrays[1]), np.asarray(arrays[2]))
    long = Requests(np.array([0.0]), np.array([100_000]), np.array([4]))
    with pytest.raises(ValueError, match="max_seq_len"):
        simulator.simulate_requests(long, phases, mode="colocated")


def test_widgets_and_records_refuse_nonsense(tmp_path):
    from inference_lab import widgets
    from inference_lab.measure import records

    with pytest.raises(ValueError, match="rel_tol"):
        widgets.numeric_quiz("how many?", 3.0, rel_tol=-1)
    with pytest.raises(ValueError, match="save_records takes PrefillRecord"):
        records.save_records([{"phase": "decode", "batch": 1}], tmp_path / "r.json")
    assert not list(tmp_path.iterdir())


def test_progress_with_stderr_closed_and_ctrl_c_while_importing():
    code = ("import os, sys\nos.environ['INFERENCE_LAB_PROGRESS'] = '1'\nsys.stderr.close()\n"
            "from inference_lab.base import progress\nwith progress.bar(total=3) as b:\n    b.update(3)\nprint('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    interrupted = ("import builtins, runpy\nreal = builtins.__import__\n"
                   "def stop(name, *a, **k):\n    if name == 'inference_lab.cli':\n        raise KeyboardInterrupt\n"
                   "    return real(name, *a, **k)\nbuiltins.__import__ = stop\n"
                   "runpy.run_module('inference_lab', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", interrupted], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr
