"""The probe: its JSON follows schema_version 2 exactly, its table prints, its errors are clear
and come before any measurement, and what it measured survives an interrupt or an OOM."""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from inference_lab import cli
from inference_lab.base import hardware
from inference_lab.measure import probe, probe_args, records, schema as probe_schema, timing
from inference_lab.base.config import ModelConfig

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def quick_ceilings(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERENCE_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hardware, "ceiling_sizes", lambda backend, key: (256, 2**20))


def test_probe_json_matches_schema(tmp_path, quick_ceilings, capsys):
    path = tmp_path / "probe.json"
    code = probe.main(["--preset", "tiny", "--prompt-len", "16", "--batch", "2", "--new-tokens", "3",
                       "--kernels", "reference", "--repeats", "1", "--json", str(path)])
    assert code == 0
    r = json.loads(path.read_text())
    assert tuple(r) == probe.TOP_KEYS and r["schema_version"] == 2
    assert probe_schema.validate_probe(r) == 2
    assert set(r["machine"]) == {"id", "name", "processor"} and r["machine"]["name"] is None
    assert len(r["machine"]["id"]) == 8 and r["machine"]["processor"]
    assert (r["complete"], r["skipped"]) == (True, [])
    assert set(r["versions"]) == {"python", "jax", "jaxlib", "flax"}
    assert set(r["model"]) == {"preset", "params", "dtype", "quantization", "group_size", "kv_cache_dtype", "shape"} \
        and r["model"]["preset"] == "tiny"
    assert (r["model"]["quantization"], r["model"]["group_size"]) == ("none", None)
    assert set(r["ceilings"]) == {"matmul_flops_per_s", "bandwidth_bytes_per_s", "copy_bandwidth_bytes_per_s", "method"}
    assert "read-only" in r["ceilings"]["method"]                 # MBU is against what this machine reads
    assert tuple(r["prefill"]) == probe.PREFILL_KEYS
    assert [d["batch"] for d in r["decode"]] == [1, 2]            # batch 1 added for the ratio
    assert all(tuple(d) == probe.DECODE_KEYS and d["context"] == 16 for d in r["decode"])
    b1 = r["decode"][0]
    assert r["ratio"] == pytest.approx(r["prefill"]["prefill_tokens_per_s"] / b1["decode_tokens_per_s"])
    assert b1["decode_tokens_per_s"] == pytest.approx(1 / b1["step_seconds"])
    assert 0 < b1["mbu"] and 0 < r["prefill"]["mfu"]
    # each point says what making its programs cost in its warm-up (0 where this process made them
    # before: tests/test_experiments.py shows both cases)
    assert all(point["compile_seconds"] >= 0 for point in [r["prefill"], *r["decode"]])
    streamed = r["streamed_decode"]                               # the same steps, a token to the host at a time
    assert tuple(streamed) == probe.STREAMED_KEYS and (streamed["batch"], streamed["context"]) == (1, 16)
    assert streamed["decode_tokens_per_s"] == pytest.approx(1 / streamed["step_seconds"])
    assert (r["kernels"], r["tp"], r["all_reduces_per_step"]) == ("reference", 1, 0)
    assert r["weight_bytes_per_device"] == 4 * r["model"]["params"]
    out = capsys.readouterr().out
    assert "prefill" in out and "decode" in out and "MBU" in out and "at batch 1" in out and "streamed" in out
    assert "compile" in out and f"{r['prefill']['compile_seconds']:,.1f} s" in out
    recs = records.load_records(path)                               # the classroom path
    assert [x.phase for x in recs] == ["prefill", "decode", "decode"]
    # each point's spread travels with the file, so a verdict on a classroom's files can weigh its noise
    assert [x.spread for x in recs] == [r["prefill"]["spread"]] + [d["spread"] for d in r["decode"]]


def test_probe_errors(capsys):
    assert probe.main(["--preset", "tiny", "--tp", "3"]) == 2     # checked before any device work
    assert "--tp 3: tp=3 does not divide" in capsys.readouterr().err
    assert probe.main(["--preset", "tiny", "--tp", "0"]) == 2
    assert "--tp: 0 is outside 1.." in capsys.readouterr().err
    assert probe.main(["--preset", "nope"]) == 2
    assert "preset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        probe_args.build_parser().parse_args(["--batch", "1,x"])


def test_probe_measures_a_hugging_face_folder(tmp_path, quick_ceilings, capsys):
    """--model DIR: the folder's model (Qwen2's biases included) in the file, named by its folder,
    its parameters and bytes the loaded model's; a class's loader reads the file."""
    import hf_checkpoints as hf
    from inference_lab.model import huggingface

    c = hf.config("qwen2")
    folder = hf.write(tmp_path / "tiny-qwen2", c, hf.tensors(c))
    path = tmp_path / "probe.json"
    code = probe.main(["--model", str(folder), "--max-model-len", "64", "--prompt-len", "16", "--batch", "2",
                       "--new-tokens", "3", "--kernels", "reference", "--repeats", "1", "--json", str(path)])
    assert code == 0, capsys.readouterr().err
    r = json.loads(path.read_text())
    assert probe_schema.validate_probe(r) == 2 and r["complete"]
    cfg = huggingface.read_config(folder)
    assert (r["model"]["preset"], r["model"]["params"], r["model"]["dtype"]) == ("tiny-qwen2", cfg.num_params, "float32")
    assert r["weight_bytes_per_device"] == 4 * cfg.num_params and cfg.bias_params > 0
    assert r["model"]["shape"]["d_model"] == cfg.d_model and r["model"]["shape"]["qkv_bias"]
    # the file carries the folder's shape: a class's loader sizes its steps as the probe did (MFU, MBU)
    loaded = records.load_records(path)
    assert [x.phase for x in loaded] == ["prefill", "decode", "decode"]
    assert loaded[0].mfu == pytest.approx(r["prefill"]["mfu"], rel=1e-6)
    assert [x.mbu for x in loaded[1:]] == pytest.approx([d["mbu"] for d in r["decode"]], rel=1e-6)
    # without it (an older file), the same figures load as written, with no FLOPs of their own
    del r["model"]["shape"]
    path.write_text(json.dumps(r))
    assert records.load_records(path)[0].flops is None


@pytest.mark.parametrize("flags, blamed", [
    (["--preset", "tiny"], "--model and --preset: pick one"),
    (["--prompt-len", "64"], "--prompt-len 64 leaves no room for --new-tokens within the --max-model-len 64"),
    (["--max-model-len", "999"], "max_model_len=999 must be an integer from 1 to the checkpoint's"),
])
def test_bad_model_flags_are_refused_in_one_line(tmp_path, flags, blamed, never_measures, capsys):
    import hf_checkpoints as hf

    c = hf.config("llama", max_position_embeddings=128)
    folder = hf.write(tmp_path / "m", c, hf.tensors(c))
    base = ["--model", str(folder), "--max-model-len", "64"]
    assert probe.main(base + flags) == 2
    err = capsys.readouterr().err
    assert blamed in err and err.count("\n") == 1, err
    assert probe.main(["--preset", "tiny", "--max-model-len", "64"]) == 2
    assert "--max-model-len applies to --model only" in capsys.readouterr().err
    assert probe.main(["--model", str(tmp_path / "nothing")]) == 2
    assert "is not a folder" in capsys.readouterr().err


@pytest.fixture
def never_measures(monkeypatch):
    """Any measurement fails the test: the refusals below must come first."""
    def boom(*a, **k):
        raise AssertionError("measured before the arguments were checked")
    monkeypatch.setattr(probe, "run", boom)


@pytest.mark.parametrize("flags, blamed", [
    (["--preset", ""], "--preset: '' is not a preset"),
    (["--new-tokens", "1e9"], "--new-tokens: '1e9' is not a whole number"),
    (["--new-tokens", "100000"], "--new-tokens 100000: --prompt-len 16 + --new-tokens 100000 is past"),
    (["--prompt-len", "512"], "--prompt-len 512 leaves no room for --new-tokens within the tiny preset's"),
    (["--batch", "0"], "--batch: '0': every batch size"),
    (["--name", "   "], "--name"),
    (["--kernels", "fast"], "--kernels fast: mode='fast' is not a kernel mode"),
    (["--json", ""], "--json '': give a file name"),
    (["--json", "no/such/folder/p.json"], "the folder 'no/such/folder' does not exist"),
    (["--json", "no-such-folder/"], "the folder 'no-such-folder' does not exist"),
    (["--json", "/dev/null"], "exists and is not a regular file"),
])
def test_bad_flags_are_refused_in_one_line_before_any_work(flags, blamed, never_measures, capsys):
    base = ["--preset", "tiny", "--prompt-len", "16"]
    assert probe.main(base + flags) == 2
    err = capsys.readouterr().err
    assert blamed in err and err.count("\n") == 1, err


def test_existing_file_needs_force(tmp_path, never_measures, capsys):
    path = tmp_path / "mine.json"
    path.write_text("keep me")
    assert probe.main(["--preset", "tiny", "--prompt-len", "16", "--json", str(path)]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err and path.read_text() == "keep me"
    assert probe_args.output_path(probe_args.build_parser().parse_args(["--json", str(path), "--force"])) == path


def _unwritable_folder(tmp_path) -> Path | None:
    """A folder nobody can create files in: a read-only one where permissions bind (not root),
    else one of the kernel's own (root ignores permission bits)."""
    ro = tmp_path / "read-only"
    ro.mkdir()
    ro.chmod(0o500)
    for folder in (ro, Path("/proc"), Path("/sys")):
        try:
            fd, name = tempfile.mkstemp(dir=folder)
        except OSError:
            return folder
        os.close(fd)
        os.unlink(name)
    return None


def test_unwritable_output_fails_fast_with_rc_2(tmp_path):
    """The whole command in its own process: refused in seconds, before the model is built."""
    folder = _unwritable_folder(tmp_path)
    if folder is None:
        pytest.skip("found no folder this user cannot write to")
    env = dict(os.environ, INFERENCE_LAB_CACHE=str(tmp_path / "cache"))
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "inference_lab", "probe", "--preset", "small",
                          "--json", str(folder / "probe.json")], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env=env)
    elapsed = time.monotonic() - t0
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("probe: error: --json") and "cannot create files" in out.stderr
    assert out.stdout == ""                                          # no ceilings, no table: nothing ran
    assert elapsed < 15, f"took {elapsed:.1f} s to refuse"


def test_env_and_probe_report_a_bad_kernel_mode_alike(monkeypatch, capsys):
    from pallas_kernels import mode

    monkeypatch.setenv(mode.ENV_VAR, "garbage")
    assert cli.main(["env"]) == 2
    env_out = capsys.readouterr()
    assert probe.main(["--preset", "tiny"]) == 2
    probe_err = capsys.readouterr().err
    assert env_out.err.removeprefix("env: ") == probe_err.removeprefix("probe: ")
    assert probe_err.count("\n") == 1 and "PALLAS_KERNELS_MODE='garbage' is not a kernel mode" in probe_err
    if not mode.pallas_supported():
        monkeypatch.setenv(mode.ENV_VAR, "pallas")
        assert cli.main(["env"]) == 2
        out = capsys.readouterr()
        assert 'runs "pallas"' not in out.out and "PALLAS_KERNELS_MODE=pallas cannot run here" in out.err


def _fake_measurements(monkeypatch, oom_at=None, interrupt_at=None):
    """Instant measurements (the probe's bookkeeping is under test, not the timings): every run
    takes a millisecond; the decode point of batch ``oom_at`` runs out of memory, the one of
    batch ``interrupt_at`` is interrupted."""
    def prepare(self):
        if self.batch == oom_at:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1 bytes")
        if self.batch == interrupt_at:
            raise KeyboardInterrupt

    monkeypatch.setattr(timing.PrefillPoint, "prepare", lambda self: None)
    monkeypatch.setattr(timing.DecodePoint, "prepare", prepare)    # the streamed point's too
    for point in (timing.PrefillPoint, timing.DecodePoint, timing.StreamedDecodePoint):
        monkeypatch.setattr(point, "run", lambda self: 1e-3)


def test_out_of_memory_keeps_the_points_measured(tmp_path, quick_ceilings, monkeypatch, capsys):
    _fake_measurements(monkeypatch, oom_at=4)
    path = tmp_path / "p.json"
    code = probe.main(["--preset", "tiny", "--prompt-len", "16", "--batch", "2,4,8", "--new-tokens", "2",
                       "--kernels", "reference", "--json", str(path)])
    assert code == 0
    r = json.loads(path.read_text())
    assert [d["batch"] for d in r["decode"]] == [1, 2] and r["complete"] is False
    assert [s["batch"] for s in r["skipped"]] == [4, 8] and "out of memory" in r["skipped"][0]["reason"]
    assert "not tried" in r["skipped"][1]["reason"] and r["ratio"] > 0
    out = capsys.readouterr().out
    assert "PARTIAL RESULT" in out and "skipped: out of memory" in out
    assert [x.batch for x in records.load_records(path) if x.phase == "decode"] == [1, 2]


def test_interrupt_keeps_the_points_measured(tmp_path, quick_ceilings, monkeypatch, capsys):
    _fake_measurements(monkeypatch, interrupt_at=8)
    path = tmp_path / "p.json"
    code = probe.main(["--preset", "tiny", "--prompt-len", "16", "--batch", "2,8", "--new-tokens", "2",
                       "--kernels", "reference", "--json", str(path)])
    assert code == 130
    r = json.loads(path.read_text())
    assert [d["batch"] for d in r["decode"]] == [1, 2] and r["complete"] is False
    assert r["all_reduces_per_step"] is None                         # never reached
    assert "interrupted: kept the 3 point(s) measured" in capsys.readouterr().err
    assert len(records.load_records(path)) == 3


def test_memory_check_blames_every_flag_that_sizes_the_cache(monkeypatch, quick_ceilings, capsys):
    monkeypatch.setattr(timing, "device_memory_bytes", lambda: 10**6)
    assert probe.main(["--preset", "tiny", "--prompt-len", "16", "--batch", "4", "--new-tokens", "400",
                       "--kernels", "reference"]) == 2
    err = capsys.readouterr().err
    assert "--batch 1 with --prompt-len 16 and --new-tokens 400" in err and "this process may use" in err


def test_probe_tp_runs_on_simulated_devices(tmp_path):
    """--tp 2 in its own process, which starts with one CPU device: the probe adds the second."""
    path = tmp_path / "probe_tp.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", INFERENCE_LAB_CACHE=str(tmp_path / "cache"))
    script = Path(__file__).parent / "parallel_scripts" / "probe_tp.py"
    proc = subprocess.Popen([sys.executable, str(script), "--preset", "tiny", "--tp", "2", "--prompt-len", "16",
                             "--batch", "1", "--new-tokens", "3", "--repeats", "1", "--json", str(path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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


def test_two_probes_to_one_new_name_do_not_replace_each_other(tmp_path, quick_ceilings, capsys, monkeypatch):
    """Another run creates the file after this one checked the name: this one's first write is
    refused in one line and the other's result is left as it was (issue 25: lost data)."""
    from inference_lab.measure import probe_args

    path = tmp_path / "probe.json"
    checked = probe.output_path

    def another_run_writes_meanwhile(args):
        got = checked(args)
        path.write_text('{"other": "run"}')
        return got

    monkeypatch.setattr(probe, "output_path", another_run_writes_meanwhile)
    assert probe_args.output_path is not another_run_writes_meanwhile
    code = probe.main(["--preset", "tiny", "--prompt-len", "16", "--batch", "1", "--new-tokens", "2",
                       "--kernels", "reference", "--repeats", "1", "--json", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "created by another run" in err[-1] and len(err) == 1, err
    assert json.loads(path.read_text()) == {"other": "run"}
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]          # no temporary file left


def test_the_default_prompt_fits_every_preset():
    """Issue 26: the probe's default prompt length leaves room for --new-tokens in any preset."""
    from inference_lab.base.config import PRESETS
    from inference_lab.measure import probe_args

    for name, cfg in PRESETS.items():
        args = probe_args.build_parser().parse_args(["--preset", name, "--kernels", "reference"])
        probe_args.check_args(args)
        assert args.prompt_len + args.new_tokens <= cfg.max_seq_len and args.prompt_len == min(512, cfg.max_seq_len - 32)
