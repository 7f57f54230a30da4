"""The kernel benchmark runs end to end (on CPU: tiny shapes, flagged as not representative)."""

from __future__ import annotations

import json

import pytest

from pallas_kernels import bench
from pallas_kernels.mode import pallas_supported


@pytest.mark.skipif(pallas_supported(), reason="the CPU path; on a GPU scripts/gpu_check.sh runs the full benchmark")
def test_bench_quick_on_cpu(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert bench.main(["--quick", "--repeats", "1", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "NOT REPRESENTATIVE" in printed
    result = json.loads(path.read_text())
    assert result["meta"]["representative"] is False
    assert result["ceilings"]["matmul_flops"] > 0 and result["ceilings"]["bandwidth"] > 0
    kernels = {row["kernel"] for row in result["rows"]}
    assert kernels == {"matmul", "matmul_decode", "flash_attention", "decode_attention"}
    timed = [row for row in result["rows"] if "seconds" in row]
    assert all(row["seconds"] > 0 for row in timed)
    # Every kernel was timed both as Pallas (interpreted) and as XLA.
    for kernel in kernels:
        impls = {row["impl"] for row in timed if row["kernel"] == kernel}
        assert "pallas[interpret]" in impls and len(impls) >= 2, (kernel, impls)


def test_bench_rejects_bad_repeats():
    with pytest.raises(SystemExit):
        bench.main(["--repeats", "0"])


def test_bench_checks_its_output_path_before_running(tmp_path, monkeypatch, capsys):
    def boom(**k):
        raise AssertionError("benchmarked before checking --json")

    monkeypatch.setattr(bench, "run", boom)
    cases = [("", "--json '': give a file name"),
             (str(tmp_path / "missing" / "b.json"), "does not exist; create it first"),
             (str(tmp_path), "is a folder; give a file name")]
    for path, message in cases:
        assert bench.main(["--json", path]) == 2
        err = capsys.readouterr().err
        assert err.startswith("bench: error: ") and message in err and err.count("\n") == 1, err
    existing = tmp_path / "old.json"
    existing.write_text("{}")
    assert bench.main(["--json", str(existing)]) == 2
    assert "pass --force" in capsys.readouterr().err and existing.read_text() == "{}"
    monkeypatch.setattr(bench, "run", lambda **k: {"rows": []})
    assert bench.main(["--json", str(existing), "--force"]) == 0
    assert json.loads(existing.read_text()) == {"rows": []}
