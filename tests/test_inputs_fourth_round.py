"""Nothing lost, nothing silently wrong, fourth round (issue 46): each of the fourteen inputs that
still gave a traceback or a wrong answer, answered in one line naming the argument and the fix, or
handled correctly. (The vLLM result files' three, 9-11, are in tests/test_vllm_bench.py.)"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inference_lab.base.config import ModelConfig

ROOT = Path(__file__).resolve().parent.parent
STORED = json.loads((ROOT / "docs" / "measurements" / "probe-2026-12-01-cpu-2core-small-reference.json").read_text())
MINI = ModelConfig(name="mini", vocab_size=259, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                   head_dim=16, d_ff=64, max_seq_len=64, rope_theta=10_000.0, tie_embeddings=False,
                   dtype="float32")


def _corpus(tmp_path) -> Path:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 40)
    return corpus


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


# ----------------------------------------------------------------------------- 1-3: train
def test_1_a_disk_that_fills_while_the_weights_are_written_loses_nothing(tmp_path, monkeypatch, capsys):
    """safetensors' own error (not an OSError) while writing --out: the finished training goes to
    the lab's cache folder, and the one line says where."""
    from inference_lab import train as training
    from inference_lab.base import disk_cache
    from inference_lab.model.transformer import Transformer

    out = tmp_path / "mini.safetensors"
    real_save = Transformer.save

    class SafetensorError(Exception):   # what safetensors raises: not an OSError
        pass

    def disk_full_at_out(self, path):
        if Path(path) == out:
            raise SafetensorError("Error while serializing: No space left on device (os error 28)")
        return real_save(self, path)

    monkeypatch.setattr(Transformer, "save", disk_full_at_out)
    monkeypatch.setattr(disk_cache, "cache_dir", lambda *parts: tmp_path.joinpath("cache", *parts))
    code = training.main(["--corpus", str(_corpus(tmp_path)), "--out", str(out), "--preset", "tiny", "--steps", "3",
                          "--batch", "2", "--seq-len", "32", "--eval-every", "2"])
    line = _one_line(capsys)
    assert code == 1 and "No space left on device" in line and "the trained weights are in" in line, line
    kept = Path(line.split("the trained weights are in ")[1].split(" instead")[0])
    assert kept.parent == tmp_path / "cache" / "unsaved-weights" and not out.exists()
    assert Transformer.load(kept, kernels="reference").cfg == ModelConfig.preset("tiny")


def test_1_too_little_room_for_the_weights_is_said_before_training(tmp_path, monkeypatch, capsys):
    from inference_lab import train as training

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(training.shutil, "disk_usage", lambda path: usage(10**12, 10**12 - 1000, 1000))
    monkeypatch.setattr(training, "sample_batch", lambda *a: pytest.fail("trained before checking the disk"))
    code = training.main(["--corpus", str(_corpus(tmp_path)), "--out", str(tmp_path / "w.safetensors"),
                          "--seq-len", "32"])
    line = _one_line(capsys)
    assert code == 2 and "MB free; free some space or choose another --out" in line, line


@pytest.mark.parametrize("flags, words", [
    (["--batch", str(2**40)], "lower --batch"),
    (["--batch", "200000", "--seq-len", "256"], "GB for one training step"),
    (["--seed", str(2**64)], "seed=18446744073709551616 must be an integer in 0..2**64 - 1"),
    (["--seed", "-1"], "seed=-1 must be an integer in 0..2**64 - 1"),
])
def test_2_3_a_batch_past_memory_and_a_seed_past_64_bits_are_refused_in_one_line(tmp_path, monkeypatch, capsys,
                                                                                  flags, words):
    from inference_lab import train as training
    from inference_lab.base import hardware

    monkeypatch.setattr(hardware, "process_memory_limit", lambda: 24 * 2**30)   # CI's machine
    monkeypatch.setattr(training, "sample_batch", lambda *a: pytest.fail("trained before checking"))
    code = training.main(["--corpus", str(_corpus(tmp_path)), "--out", str(tmp_path / "w.safetensors"), *flags])
    line = _one_line(capsys)
    assert code == 2 and words in line, line


def test_3_every_64_bit_seed_trains_and_the_small_ones_as_before(tmp_path):
    """The seed goes in through the lab's 64-bit key: seeds below 2**32 make the weights they always
    made (the shipped models' seed 0 included), and the top of the range trains too."""
    from flax import nnx

    from inference_lab import train as training
    from inference_lab.model.transformer import Transformer
    from inference_lab.runtime.generation import seed_key

    for seed in (0, 7):
        old = Transformer(MINI, rngs=nnx.Rngs(seed), kernels="reference").params()
        new = Transformer(MINI, rngs=nnx.Rngs(seed_key(seed)), kernels="reference").params()
        assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(old), jax.tree.leaves(new)))
    result = training.train(_corpus(tmp_path), tmp_path / "w.safetensors", cfg=MINI, steps=2, batch=2, seq_len=32,
                            seed=2**64 - 1, eval_every=2, progress=False)
    assert math.isfinite(result.heldout_nats_per_byte)


# ----------------------------------------------------------------------------- 4, 7, 8: class folders
def test_4_a_class_folder_that_cannot_be_listed_is_said_in_one_line(tmp_path, monkeypatch):
    from inference_lab.lessons import on_your_machine as classroom
    from inference_lab.measure import records, vllm_bench

    (tmp_path / "run.json").write_text(json.dumps(STORED))

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "iterdir", denied)   # (the tests run as root, for whom chmod 000 changes nothing)
    with pytest.raises(ValueError, match=r"cannot be listed \(Permission denied\); check its permissions"):
        records.load_records(tmp_path)
    with pytest.raises(ValueError, match=r"cannot be listed \(Permission denied\)"):
        vllm_bench.load_vllm_bench(tmp_path)
    runs = classroom.load_measured(tmp_path)
    assert not runs and runs.skipped == [(tmp_path, "cannot be listed (Permission denied); check its permissions")]


def test_7_a_link_back_to_the_class_folder_is_not_one_more_run(tmp_path):
    from inference_lab.lessons import on_your_machine as classroom

    (tmp_path / "run.json").write_text(json.dumps(STORED))
    (tmp_path / "loop.json").symlink_to(".")
    (tmp_path / "folder.json").mkdir()
    runs = classroom.load_measured(tmp_path)
    assert len(runs) == 1
    assert {p.name: why for p, why in runs.skipped} == {
        "folder.json": "is a folder (or a link to one), not a probe or records file",
        "loop.json": "is a folder (or a link to one), not a probe or records file"}


def test_8_an_aggregated_records_file_of_three_machines_is_three_runs(tmp_path):
    from inference_lab.lessons import on_your_machine as classroom
    from inference_lab.measure import records

    (tmp_path / "one.json").write_text(json.dumps(STORED))
    mine = records.load_records(tmp_path / "one.json")
    rows = [dataclasses.replace(r, machine_id=f"{i:08x}", machine_name=f"laptop {i}") for i in range(3) for r in mine]
    (tmp_path / "class").mkdir()
    records.save_records(rows, tmp_path / "class" / "all.csv")
    runs = classroom.load_measured(tmp_path / "class")
    assert sorted(runs) == [f"laptop {i} #{i:08x} [small] (class)" for i in range(3)]
    assert all(len(recs) == len(mine) for recs in runs.values())
    assert "3 run(s) from 3 machine(s)" in classroom.classroom_summary(runs)


# ----------------------------------------------------------------------------- 5: presets
def test_5_a_preset_renamed_by_its_name_field(tmp_path):
    cfg = ModelConfig.preset("tiny", name="mine")
    assert cfg.name == "mine" and cfg.d_model == ModelConfig.preset("tiny").d_model
    with pytest.raises(ValueError, match=r"d_modle= is not a ModelConfig field"):
        ModelConfig.preset("tiny", d_modle=64)
    with pytest.raises(ValueError, match=r"preset=\['tiny'\] is unknown"):
        ModelConfig.preset(["tiny"])


# ----------------------------------------------------------------------------- 6, 12: the simulator's phases
@pytest.mark.parametrize("value", ["0.001", float("nan"), float("inf"), -1e-3, True])
def test_6_12_a_step_overhead_that_is_not_a_time_is_refused(value):
    from inference_lab.analytic.phases import roofline_phases
    from inference_lab.base import hardware

    with pytest.raises(ValueError, match=r"step_overhead_s=.* must be a finite number in 0\.\.inf"):
        roofline_phases(ModelConfig.preset("llama3_8b"), hardware.PRESETS["H100_SXM"], step_overhead_s=value)


@pytest.mark.parametrize("cached", ["160", [1.5, 2.0], -1, [1, 2]])
def test_6_a_sibling_the_simulators_cached_prompt_is_checked_not_a_type_error(cached):
    from inference_lab.analytic import simulator, workload
    from inference_lab.analytic.phases import roofline_phases
    from inference_lab.base import hardware

    phases = roofline_phases(ModelConfig.preset("llama3_8b"), hardware.PRESETS["H100_SXM"])
    with pytest.raises(ValueError, match=r"cached_prompt must be prompt tokens >= 0: one int, or one per request"):
        simulator.simulate_requests(workload.sample_requests(3, 1.0), phases, cached_prompt=cached)


# ----------------------------------------------------------------------------- 13: token ids on the device
@pytest.fixture(scope="module")
def tiny():
    from flax import nnx

    from inference_lab.model.transformer import Transformer

    return Transformer(ModelConfig.preset("tiny"), rngs=nnx.Rngs(0), kernels="reference")


@pytest.mark.parametrize("bad", [512, 10**6, -1])
def test_13_token_ids_on_the_device_are_range_checked(tiny, bad):
    from inference_lab.model.kv_cache import KVCache
    from inference_lab.runtime import generation

    logits, cache = generation.prefill(tiny, np.array([[1, 2, 3]]), KVCache.create(tiny.cfg, batch=1, max_len=16))
    with pytest.raises(ValueError, match=r"next_tokens holds ids in .* but the vocabulary is 0\.\.511"):
        generation.decode_step(tiny, jnp.array([bad], jnp.int32), cache)
    with pytest.raises(ValueError, match=r"tokens holds ids in .* but the vocabulary is 0\.\.511"):
        generation.decode_loop(tiny, jnp.array([bad], jnp.int32), cache, 2)
    # the tokens the sampler drew go back in unread (no wait for the device), and decode on
    drawn = generation.sample(logits, jax.random.key(0))
    logits, cache = generation.decode_step(tiny, drawn, cache)
    assert np.isfinite(np.asarray(logits)).all()


# ----------------------------------------------------------------------------- 14: lengths under jit
def test_14_decode_attention_lengths_out_of_range_under_jit_give_zero_rows_not_nan():
    import pallas_kernels as pk

    rng = np.random.default_rng(0)
    b, hq, hkv, d, s = 3, 4, 2, 32, 32
    q = jnp.asarray(rng.standard_normal((b, hq, d)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((b, s, hkv, d)), jnp.float32) for _ in range(2))
    k_new, v_new = (jnp.asarray(rng.standard_normal((b, hkv, d)), jnp.float32) for _ in range(2))
    lengths = jnp.array([0, 5, s + 7], jnp.int32)
    good = pk.decode_attention(q, k, v, jnp.array([1, 5, s], jnp.int32), mode="reference")
    out = jax.jit(lambda q, k, v, n: pk.decode_attention(q, k, v, n, mode="reference"))(q, k, v, lengths)
    assert np.isfinite(np.asarray(out)).all()
    assert np.all(np.asarray(out)[[0, 2]] == 0)
    np.testing.assert_allclose(out[1], good[1], rtol=1e-5, atol=1e-6)
    # with this step's K/V: a bad row's write stays in its own row; the good row is exact
    fused = jax.jit(lambda q, k, v, n, kn, vn: pk.decode_attention(q, k, v, n, k_new=kn, v_new=vn, mode="reference"))
    out, k2, v2 = fused(q, k, v, lengths, k_new, v_new)
    assert np.isfinite(np.asarray(out)).all() and np.all(np.asarray(out)[[0, 2]] == 0)
    assert np.array_equal(np.asarray(k2)[1, 4], np.asarray(k_new)[1])
    changed = np.any(np.asarray(k2) != np.asarray(k), axis=(2, 3))             # [B, S]: positions written
    assert changed[1].sum() == 1 and changed[0].sum() <= 1 and changed[2].sum() <= 1
    # eagerly the same lengths are refused in one line, as before
    with pytest.raises(ValueError, match=r"lengths must lie in 1\.\.S_max=32"):
        pk.decode_attention(q, k, v, lengths, mode="reference")


def test_14_paged_decode_attention_lengths_out_of_range_under_jit_give_zero_rows():
    import pallas_kernels as pk

    rng = np.random.default_rng(1)
    b, hq, hkv, d, block, pages = 2, 4, 2, 32, 16, 2
    q = jnp.asarray(rng.standard_normal((b, hq, d)), jnp.float32)
    kp, vp = (jnp.asarray(rng.standard_normal((b * pages, block, hkv, d)), jnp.float32) for _ in range(2))
    tables = jnp.arange(b * pages, dtype=jnp.int32).reshape(b, pages)
    out = jax.jit(lambda n: pk.paged_decode_attention(q, kp, vp, tables, n, mode="reference"))(
        jnp.array([0, 9], jnp.int32))
    good = pk.paged_decode_attention(q, kp, vp, tables, jnp.array([1, 9], jnp.int32), mode="reference")
    assert np.isfinite(np.asarray(out)).all() and np.all(np.asarray(out)[0] == 0)
    np.testing.assert_allclose(out[1], good[1], rtol=1e-5, atol=1e-6)
