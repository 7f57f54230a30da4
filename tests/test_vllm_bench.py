"""Reading `vllm bench serve --save-result` files: a hand-made file in vLLM's format
(tests/fixtures/vllm_bench_serve.json, its aggregates computed the way vLLM computes them)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from inference_lab.measure import vllm_bench
from inference_lab.analytic.serving_metrics import SLO

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_bench_serve.json"
DETAILED = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "generated_texts", "errors")


def test_reads_the_run_and_recomputes_vllms_own_aggregates():
    (run,) = vllm_bench.load_vllm_bench(FIXTURE)
    data = json.loads(FIXTURE.read_text())
    assert (run.label, run.request_rate, run.completed, run.failed) == ("vllm", 4.0, 5, 1)
    assert run.model_id == "meta-llama/Llama-3.1-8B-Instruct" and run.duration == data["duration"]
    assert run.trace is not None and run.trace.completed == 5  # the failed request is left out
    row = run.summary()
    # Our definitions (serving_metrics) give vLLM's numbers from vLLM's per-request lists.
    for ours, theirs in vllm_bench.VLLM_METRIC_NAMES.items():
        assert row[f"{ours}_mean_ms"] == pytest.approx(data[f"mean_{theirs}_ms"], rel=1e-9), ours
        assert row[f"{ours}_p50_ms"] == pytest.approx(data[f"median_{theirs}_ms"], rel=1e-9), ours
        for q in (90, 99):
            assert row[f"{ours}_p{q}_ms"] == pytest.approx(data[f"p{q}_{theirs}_ms"], rel=1e-9), (ours, q)
    assert row["request_throughput"] == pytest.approx(data["request_throughput"])
    assert row["output_tokens_per_s"] == pytest.approx(data["output_throughput"])
    assert row["rate"] == 4.0 and row["mode"] == "vllm" and row["source"] == "vllm bench serve"
    # Goodput for any SLO, after the fact: TTFTs 142, 118, 71, 305, 129 ms -> four within 200 ms.
    assert run.summary(SLO(ttft_ms=200))["goodput_rps"] == pytest.approx(4 / data["duration"])
    assert run.summary()["goodput_rps"] is None


def test_without_save_detailed_the_aggregates_are_used(tmp_path):
    data = json.loads(FIXTURE.read_text())
    full = vllm_bench.load_vllm_bench(FIXTURE)[0].summary()
    for k in DETAILED:
        data.pop(k)
    for k in [k for k in data if k.startswith("p90_")]:
        data.pop(k)  # the default --metric-percentiles is 99 alone
    data["request_goodput"] = 2.5
    path = tmp_path / "vllm-4.0qps-Llama-3.1-8B-Instruct-20261130-101500.json"
    path.write_text(json.dumps(data))
    (run,) = vllm_bench.load_vllm_bench(path)
    row = run.summary()
    assert run.trace is None
    assert row["ttft_p99_ms"] == pytest.approx(full["ttft_p99_ms"]) and math.isnan(row["ttft_p90_ms"])
    assert row["tpot_p50_ms"] == pytest.approx(full["tpot_p50_ms"])
    assert row["goodput_rps"] == 2.5 and "not saved" in row["slo"]
    with pytest.raises(ValueError, match="save-detailed"):
        run.summary(SLO(ttft_ms=200))


def test_appended_runs_and_folders(tmp_path):
    data = json.loads(FIXTURE.read_text())
    second = dict(data, request_rate="inf", label="chunked-512", max_concurrency=8)
    (tmp_path / "results.json").write_text(json.dumps(data) + "\n" + json.dumps(second) + "\n")  # --append-result
    (tmp_path / "results.pytorch.json").write_text("[]")  # vLLM's side file: skipped
    runs = vllm_bench.load_vllm_bench(tmp_path)
    assert [r.label for r in runs] == ["vllm", "chunked-512"]
    assert math.isinf(runs[1].request_rate) and runs[1].max_concurrency == 8


def test_clear_errors(tmp_path):
    bad = tmp_path / "probe.json"
    bad.write_text(json.dumps({"schema_version": 1, "device": "cpu"}))
    with pytest.raises(ValueError, match="'duration'"):
        vllm_bench.load_vllm_bench(bad)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        vllm_bench.load_vllm_bench(bad)
    bad.write_text(json.dumps({"duration": 10.0, "completed": 3}))
    with pytest.raises(ValueError, match="nothing to read"):
        vllm_bench.load_vllm_bench(bad)
    with pytest.raises(ValueError, match="does not exist"):
        vllm_bench.load_vllm_bench(tmp_path / "missing.json")


# ----------------------------------------------------------------------------- gates and real layouts (issue 25)
HAND = Path(__file__).parent / "fixtures" / "vllm"


def test_each_writers_layout_reads_right():
    old, = vllm_bench.load_vllm_bench(HAND / "benchmark_serving-0.6.json")
    data = json.loads((HAND / "benchmark_serving-0.6.json").read_text())
    e2e = 1e3 * (np.array(data["ttfts"]) + np.array([sum(g) for g in data["itls"]]))
    row = old.summary()
    assert row["e2e_mean_ms"] == pytest.approx(e2e.mean()) and row["e2e_p50_ms"] == pytest.approx(np.median(e2e))
    assert data["mean_e2el_ms"] == pytest.approx(np.median(e2e))          # the file's own, swapped
    assert math.isinf(old.request_rate) and old.completed == 8
    goodput, = vllm_bench.load_vllm_bench(HAND / "benchmark_serving-0.8-goodput.json")
    assert goodput.request_goodput == 1.5 and goodput.completed == 7 and goodput.trace.completed == 7
    failed, = vllm_bench.load_vllm_bench(HAND / "all-failed.json")
    s = failed.summary()
    assert failed.completed == 0 and all(math.isnan(s[f"{m}_p50_ms"]) for m in ("ttft", "tpot", "itl", "e2e"))
    assert len(vllm_bench.load_vllm_bench(HAND / "appended.json")) == 2


def test_a_sweep_folder_counts_each_run_once(tmp_path):
    runs = vllm_bench.load_vllm_bench(HAND / "sweep")
    assert [r.request_rate for r in runs] == [1.0, 2.0]
    assert [(p.name, why.split(" (")[0]) for p, why in runs.skipped] == [("summary.json", "is a vllm bench sweep summary")]


BAD_FIELDS = [
    ({"duration": float("nan")}, "NaN"),
    ({"duration": "inf"}, "duration"),
    ({"completed": -1}, "completed"),
    ({"completed": 2.5}, "completed"),
    ({"mean_tpot_ms": True}, "'mean_tpot_ms'=.True. is not a time in ms"),   # a bool is not a latency
    ({"mean_ttft_ms": -3.0}, "'mean_ttft_ms'=.-3.0. is not a time in ms"),
    ({"p99_itl_ms": "slow"}, "'p99_itl_ms'"),
    ({"request_throughput": -0.5}, "'request_throughput'=-0.5 is negative"),
    ({"ttfts": "fast"}, "lists"),
    ({"itls": [[0.01, "x"]] + [[]] * 5}, r"itls\[0\]\[1\]"),
    ({"output_lens": [1.5] + [1] * 5}, r"output_lens\[0\]"),
]


@pytest.mark.parametrize("change, word", BAD_FIELDS, ids=[str(i) for i in range(len(BAD_FIELDS))])
def test_every_field_is_gated(tmp_path, change, word):
    data = dict(json.loads(FIXTURE.read_text()), **change)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=word) as err:
        vllm_bench.load_vllm_bench(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_key_written_twice_is_refused_and_a_missing_rate_is_unlimited(tmp_path):
    """Two "duration" keys: json keeps the last, and input tokens/s came out 2,500x too high; the
    probe's reader refuses such a file, and so does this one. No request_rate: vLLM's "inf"."""
    text = FIXTURE.read_text()
    path = tmp_path / "run.json"
    path.write_text(text.replace('"duration":', '"duration": 0.001, "duration":', 1))
    with pytest.raises(ValueError, match="the key 'duration' appears twice in one object"):
        vllm_bench.load_vllm_bench(path)
    data = json.loads(text)
    del data["request_rate"]
    path.write_text(json.dumps(data))
    run, = vllm_bench.load_vllm_bench(path)
    assert run.request_rate == math.inf


def test_files_that_are_not_results(tmp_path):
    base = tmp_path / "r.json"
    for content, word in ((b"\x00\xff\xfe binary", "not UTF-8"), (b"[" * 100_000, "nested too deeply|not JSON"),
                          (b'{"duration": NaN, "completed": 1}', "NaN"), (b"", "no vllm bench serve results|not JSON")):
        base.write_bytes(content)
        with pytest.raises(ValueError, match=word):
            vllm_bench.load_vllm_bench(base)
    base.write_bytes(b"\xef\xbb\xbf" + FIXTURE.read_bytes())          # a byte-order mark is fine
    assert len(vllm_bench.load_vllm_bench(base)) == 1
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "dir.json").mkdir()
    runs = vllm_bench.load_vllm_bench(tmp_path)                       # neither hangs nor fails the folder
    assert len(runs) == 1 and {p.name for p, _ in runs.skipped} == {"fifo.json", "dir.json"}
