"""Nothing lost (issue 25, root cause 1): an output that is the input is refused; two runs given
one new file name do not silently replace each other; a long name is tested as it will be
written; an interrupted or disk-full training says in one line what it kept."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from pathlib import Path

import pytest

from inference_lab.base.config import ModelConfig
from pallas_kernels import files

ROOT = Path(__file__).resolve().parent.parent
MINI = ModelConfig(name="mini", vocab_size=259, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                   head_dim=16, d_ff=64, max_seq_len=64, rope_theta=10_000.0, tie_embeddings=False,
                   dtype="float32")


def test_an_exclusive_write_never_replaces_another_runs_file(tmp_path):
    path = tmp_path / "probe.json"
    files.atomic_write_text(path, "first")
    with pytest.raises(ValueError, match="created by another run"):
        files.atomic_write(path, lambda fh: fh.write("second"), exclusive=True)
    assert path.read_text() == "first" and os.listdir(tmp_path) == ["probe.json"]   # no temp file left
    fresh = tmp_path / "new.json"
    files.atomic_write(fresh, lambda fh: fh.write("mine"), exclusive=True)
    assert fresh.read_text() == "mine"


STORED = ROOT / "docs" / "measurements" / "probe-2026-12-01-cpu-2core-small-reference.json"


def test_the_probe_creates_its_file_exclusively_unless_forced(tmp_path):
    from inference_lab.measure import probe

    result = json.loads(STORED.read_text())
    path = tmp_path / "run.json"
    probe.write(path, result, exclusive=True)
    with pytest.raises(ValueError, match="another run"):
        probe.write(path, {**result, "ratio": 2.0}, exclusive=True)   # a second probe to the same new name
    probe.write(path, {**result, "ratio": 3.0})                       # its own later writes replace it
    assert json.loads(path.read_text())["ratio"] == 3.0


def test_the_probe_never_writes_what_its_loader_refuses(tmp_path):
    """Root cause 2: 70 batch sizes, or ceilings no machine measures, never reach a file."""
    from inference_lab.base import hardware
    from inference_lab.measure import probe

    result = json.loads(STORED.read_text())
    for bad in ({**result, "decode": result["decode"] * 70},
                {**result, "ceilings": {**result["ceilings"], "bandwidth_bytes_per_s": 1e19}},
                {**result, "ceilings": {**result["ceilings"], "matmul_flops_per_s": 1e-3}}):
        with pytest.raises(ValueError, match="cannot be saved"):
            probe.write(tmp_path / "bad.json", bad)
    assert not list(tmp_path.iterdir())
    assert probe.main(["--batch", ",".join(str(b) for b in range(1, 71)), "--json", str(tmp_path)]) == 2
    ident = {"device": "x"}
    good = {"ident": ident, "name": "cpu", "flops": {"float32": 1e11}, "bandwidth": 3e10,
            "sources": {"flops": "m", "bandwidth": "m"}, "overhead_s": 2e-5}
    assert hardware._cache_problem(good, ident, "float32") is None
    for field, value in (("bandwidth", 1e19), ("flops", {"float32": 1e-3}), ("overhead_s", 1e6)):
        assert "outside what any machine measures" in hardware._cache_problem({**good, field: value}, ident, "float32")


def test_a_long_name_is_checked_as_it_will_be_written(tmp_path):
    fine = tmp_path / ("r" * 250 + ".json")                     # 255 bytes: the most a name may have
    files.check_output_path(fine)
    files.atomic_write_text(fine, "{}")                         # its temporary name is short
    assert fine.read_text() == "{}"
    with pytest.raises(ValueError, match="cannot create a file of this name"):
        files.check_output_path(tmp_path / ("r" * 300 + ".json"))
    assert sorted(os.listdir(tmp_path)) == [fine.name]


def test_train_refuses_to_write_over_its_corpus(tmp_path, capsys):
    from inference_lab.cli import main

    corpus = tmp_path / "text.txt"
    corpus.write_text("some text " * 100)
    for out in (corpus, tmp_path / "." / "text.txt"):
        assert main(["train", "--corpus", str(corpus), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is the corpus itself" in err[0]
    assert corpus.read_text() == "some text " * 100


def test_ctrl_c_during_training_keeps_the_weights_so_far(tmp_path, monkeypatch):
    from inference_lab import train as training
    from inference_lab.model.transformer import Transformer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 40)
    out = tmp_path / "mini.safetensors"
    real, calls = training.sample_batch, []

    def interrupted_at_step_4(*args):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(training, "sample_batch", interrupted_at_step_4)
    with pytest.raises(training.TrainingInterrupted) as stop:
        training.train(corpus, out, cfg=MINI, steps=50, batch=4, seq_len=32, eval_every=25, progress=False)
    assert (stop.value.step, stop.value.steps, stop.value.saved) == (3, 50, out)
    assert Transformer.load(out, kernels="reference").cfg == MINI
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt", "mini.safetensors"]


@pytest.mark.parametrize("failure, code, words", [
    ("interrupted", 130, "saved the weights of step 7 to"),
    ("interrupted-unsaved", 130, "nothing saved"),
    ("disk full", 1, "No space left on device"),
])
def test_train_command_says_in_one_line_what_it_kept(tmp_path, capsys, monkeypatch, failure, code, words):
    from inference_lab import train as training

    def fails(*args, **kwargs):
        if failure == "disk full":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        raise training.TrainingInterrupted(7, 50, None if failure.endswith("unsaved") else tmp_path / "w.safetensors")

    fails.__kwdefaults__ = training.train.__kwdefaults__   # the parser shows train()'s defaults
    monkeypatch.setattr(training, "train", fails)
    (tmp_path / "text.txt").write_text("text " * 50)
    assert training.main(["--corpus", str(tmp_path / "text.txt"), "--out", str(tmp_path / "w.safetensors")]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and "Traceback" not in err[0], err


def test_a_name_that_is_a_formula_is_written_as_text(tmp_path):
    """Root cause 7: a machine named like a spreadsheet formula reaches the CSV export as text
    (a leading apostrophe) and reads back as it was named."""
    from inference_lab.measure import records

    base = records.load_records(STORED)
    evil = [dataclasses.replace(r, machine_name="=HYPERLINK(\"http://x\",\"click\")") for r in base]
    path = records.save_records(evil, tmp_path / "class.csv")
    cells = [line.split(",") for line in path.read_text().splitlines()[1:]]
    assert all(not cell.lstrip('"').startswith(("=", "+", "-", "@")) for row in cells for cell in row if cell)
    assert [r.machine_name for r in records.load_records(path)] == [r.machine_name for r in evil]
