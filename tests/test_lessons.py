"""The plain functions behind the notebooks' cells and dashboards, on the tiny preset."""

import dataclasses
import json

import pytest
from matplotlib.figure import Figure

from inference_lab import plots
from inference_lab.analytic import costs, economics, roofline
from inference_lab.analytic.phases import roofline_phases
from inference_lab.runtime import generation
from inference_lab.measure import matmuls, timing
from inference_lab.base import hardware, tokenizer
from inference_lab.lessons import arithmetic_intensity as intensity
from inference_lab.lessons import batching, machine, setup_check
from inference_lab.lessons import decode_is_bandwidth_bound as decode
from inference_lab.lessons import on_your_machine as classroom
from inference_lab.lessons import one_model_two_speeds as two_speeds
from inference_lab.lessons import prefill_is_compute_bound as prefill
from inference_lab.lessons import serving_economics as serving
from inference_lab.base.config import ModelConfig

H100 = hardware.PRESETS["H100_SXM"]
CFG8B = ModelConfig.preset("llama3_8b")
SIZES = dataclasses.replace(machine.CPU_SIZES, prompt_len=32, prompt_lengths=(16, 32), prefill_lengths=(1, 32),
                            decode_contexts=(16, 48), context=16, batch_sizes=(1, 4), probe_batches=(1, 4),
                            rag_prompt=32, roofline_batches=(1, 4))


@pytest.fixture(scope="module")
def here():
    return dataclasses.replace(machine.this_machine("tiny"), sizes=SIZES)


@pytest.fixture(scope="module")
def model(here):
    return machine.lesson_model(here)


def _png(fig, tmp_path, name="f"):
    assert isinstance(fig, Figure)
    path = tmp_path / f"{name}.png"
    fig.savefig(path)
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_machine_summary_names_device_kernels_and_versions(here):
    text = here.summary()
    for word in ("device:", "kernels:", "tiny", "jax", "flax"):
        assert word in text
    assert here.spec.bandwidth > 0 and here.spec.peak_flops(here.dtype) > 0
    assert "ridge" in machine.ceilings_line(here.spec, here.dtype)
    assert here.config.name in setup_check.plan_line(here)
    plan = setup_check.plan_table(here)
    assert "05 batching" in plan and str(max(here.sizes.batch_sizes)) in plan

def test_pallas_kernels_match_their_twins_and_float64():
    for check in (setup_check.pallas_vs_reference, prefill.prefill_kernels_check, decode.decode_kernel_check):
        errors = check()
        assert errors and all(0 <= e < 1e-4 for e in errors.values()), errors


def test_decode_split_is_memory_bound_at_batch_one(tmp_path):
    cfg = ModelConfig.preset("base")
    one = setup_check.decode_split(cfg, H100, "bf16", batch=1, context=512)
    assert one["memory_s"] > 50 * one["compute_s"]
    fig, text = setup_check.decode_split_view(cfg, H100, "bf16", batch=1, context=512)
    assert text.startswith("batch size 1:") and "memory-bound" in text
    _png(fig, tmp_path)
    here = dataclasses.replace(H100, overhead_s=1e-5)
    assert setup_check.decode_split(cfg, here, "bf16", batch=1, context=512)["overhead_s"] == 1e-5
    assert setup_check.decode_split(cfg, here, "bf16", batch=1, context=512)["regime"] == "memory"


def test_two_speeds_measures_both_phases(model, here, tmp_path):
    result = two_speeds.two_speeds(model, prompt_len=32, new_tokens=4)
    assert result.prefill_tokens_per_s > 0 and result.decode_tokens_per_s > 0
    assert result.ratio == pytest.approx(result.prefill_tokens_per_s / result.decode_tokens_per_s)
    assert "prompt length 32, new tokens 4" in result.line()
    gap = result.gap(model.cfg, here.spec)
    assert gap.measured == pytest.approx(result.ratio)
    assert gap.measured == pytest.approx(gap.ideal * gap.mfu / gap.mbu)    # the identity the lesson teaches
    assert "MFU" in gap.table("here") and "MBU" in gap.table("here")
    _png(plots.two_speeds_bars(result, reference=two_speeds.REFERENCE_NODE), tmp_path, "bars")


def test_the_two_speeds_dashboard_redraws_from_its_grid_without_timing(model, monkeypatch, tmp_path):
    """Issue 26: 01's dashboard re-timed on every slider move (5-14 s, and two visits to one
    setting disagreed). The grid times every prompt length once; a view times nothing and two
    views of one setting agree; measure() times them all again."""
    grid = two_speeds.TwoSpeedsGrid(model, (16, 32), steps=4)
    assert set(grid.measured) == {16, 32} and grid.rounds == 1

    def no_timing(*a, **k):
        raise AssertionError("a slider move timed something")

    monkeypatch.setattr(timing, "measure_points", no_timing)
    fig, text = two_speeds.two_speeds_view(grid, 32, 4)
    assert text.startswith("prompt length 32, new tokens 4:") and "gap" in text and "measurement 1" in text
    assert two_speeds.two_speeds_view(grid, 32, 4)[1] == text
    longer = grid.at(32, 8)
    assert longer.decode_s == pytest.approx(2 * grid.at(32, 4).decode_s) and longer.ttft_s == grid.at(32, 4).ttft_s
    _png(fig, tmp_path)
    with pytest.raises(ValueError, match=r"prompt_len=64 was not measured; the grid has \(16, 32\)"):
        grid.at(64, 4)
    monkeypatch.undo()
    grid.measure()
    assert grid.rounds == 2 and "measurement 2" in two_speeds.two_speeds_view(grid, 16, 4)[1]


def test_streamed_answer_and_the_cache_comparison(model, capsys, tmp_path):
    answer = two_speeds.stream_answer(model, "Hello there", 12, seed=1)
    shown = capsys.readouterr().out
    assert answer.text and shown.startswith(answer.text)             # printed as it came
    assert answer.tokens == tuple(generation.generate(model, [tokenizer.encode("Hello there")], 12,
                                                  temperature=0.8, top_k=40, seed=1)[0])
    assert len(answer.itl_s) == 11 and all(g >= 0 for g in answer.itl_s) and answer.ttft_s > 0
    assert "12 tokens" in answer.line() and "tokens/s" in answer.line()
    cmp = two_speeds.with_and_without_cache(model, "Hello there", 10)
    assert cmp.same_until == 10 and cmp.line().startswith("the same 10 tokens both ways")
    assert cmp.lengths == tuple(range(12, 22)) and len(cmp.cached_s) == len(cmp.uncached_s) == 10
    assert all(b > a for a, b in zip(cmp.predicted_uncached_s, cmp.predicted_uncached_s[1:]))  # more text, more work
    _png(plots.cache_vs_recompute(cmp.lengths, cmp.uncached_s, cmp.cached_s), tmp_path, "cache")
    assert "words/s" in two_speeds.human_line(answer) and "TPOT under" in two_speeds.human_line(answer)
    broken = dataclasses.replace(cmp, uncached_tokens=cmp.cached_tokens[:3] + (0,) * 7)
    assert broken.same_until == 3 and "part at token 4 of 10" in broken.line()

def test_weight_stream_rates_table(model):
    from inference_lab.model import pretrained

    bard = pretrained.load(kernels="reference")
    rates = two_speeds.weight_stream_rates(model, bard, context=8)
    assert rates.small.batch == rates.large.batch == 1 and rates.small_read > 0 and rates.large_read > 0
    assert rates.small_hollow.bytes_per_step < rates.small.bytes_per_step / 10     # hollow: almost no bytes
    assert rates.small_hollow.preset == "tiny (hollow)" and rates.large_hollow.preset == "shakespeare (hollow)"
    table = rates.table()
    assert "tiny" in table and "shakespeare" in table and "GB/s" in table and "read ceiling" in table
    assert "this machine:" in rates.caches_line() and "cores" in rates.caches_line()

def test_reference_node_reconciles_30x_with_the_ridge():
    ref = two_speeds.reference_gap()
    cfg = two_speeds.REFERENCE_SHAPE
    assert 26e9 < cfg.num_params < 28e9
    assert ref.measured == pytest.approx(3288 / 108)
    assert 0.9 * 295 < ref.ideal < 1.1 * 295              # the ceilings allow about the ridge in bf16
    assert 0.03 < ref.mfu < 0.07 and 0.35 < ref.mbu < 0.5
    assert ref.decode_share(19, 1) > 0.5 > ref.decode_share(47, 1)
    assert "decode takes longer" in two_speeds.who_dominates(19, 1, ref.measured)
    assert "prefill takes longer" in two_speeds.who_dominates(47, 1, ref.measured)


def test_the_reference_node_read_two_ways():
    text = two_speeds.reference_readings()
    a, b, _ = text.splitlines()
    assert "30.4x slower" in a and "4.5%" in a and "62%" in a and "39%" in a
    assert "sqrt(19 x 47) = 29.9:1" in b and "2% away" in b          # the mix that reading B predicts
    # The real model keeps a KV cache in 16 of its 64 layers, 4 KV heads of 256: 64 KiB per token.
    assert two_speeds.qwen35_kv_bytes_per_token() == 2 * 16 * 4 * 256 * 2
    note = two_speeds.reference_shape_note()
    assert "256 KiB" in note and "64 KiB" in note and "4x less" in note and "Gated DeltaNet" in note
    step = two_speeds.reference_decode_step()
    assert "9.26 ms step" in step and "128 all-reduces" in step and "1.03 ms" in step


def test_reference_knees_and_decode_levers():
    knees = batching.reference_knees(two_speeds.REFERENCE_SHAPE, H100, tp=4, context=4096)
    assert "compute-bound at batch 296" in knees and "(the predicted knee) at batch 27," in knees and "never" in knees
    assert "the same bend" in knees           # the node's "~32" is a throughput bend, not the 1.5x knee itself
    levers = batching.decode_levers(CFG8B, H100, context=4096).splitlines()
    tok = [float(line.split()[-2].replace(",", "")) for line in levers[2:6]]
    assert tok == sorted(tok) and tok[1] / tok[0] > 1.8                 # fewer bytes per parameter, faster
    assert "12.9B of its 46.7B" in levers[6] and "batch 32 46.7B" in levers[6]


def test_sweeps_tables_and_views(model, here, tmp_path):
    pre = prefill.prefill_sweep(model, (1, 32))
    assert len(pre.table().splitlines()) == 3 and [r.prompt_len for r in pre.records] == [1, 32]
    kernels = matmuls.matmul_sweep((1, 32), k=256, n=256, repeats=2)
    assert "of the measured peak" in prefill.kernel_against_peak(kernels, here.spec, here.dtype)
    fig, text = prefill.prefill_point_view(pre, here.spec, here.dtype, 32, kernels)
    assert text.startswith("prompt length 32:") and "lone matmul" in text
    _png(fig, tmp_path, "pre")
    assert "kernel-scaled" in prefill.prediction_table(pre, kernels, model.cfg, here.spec, here.dtype)
    assert prefill.first_compute_bound_length(model.cfg, here.spec, here.dtype, (1, 32, 4096)) in (32, 4096)

    exp = decode.decode_experiments(model, batches=(1, 2), contexts=(16, 48), context=16, steps=2, kernel_size=256)
    assert [r.batch for r in exp.batch] == [1, 2] and [r.context for r in exp.context] == [16, 48]
    assert "time x" in exp.table() and "GB/s" in exp.kernel_line() and "hollow twin" in exp.kernel_line()
    assert exp.hollow.preset == "tiny (hollow)" and exp.hollow.bytes_per_step < exp.batch[0].bytes_per_step / 10
    reading = decode.context_reading(exp, here.spec, here.dtype)
    assert reading.startswith("context 16 -> 48: a compute-bound step would take x") and "attention" in reading
    fig, text = decode.experiment_view(exp, 2)
    assert text.startswith("batch size 2:") and "MBU" in text
    _png(fig, tmp_path, "dec")
    assert "MFLOP" in decode.decode_bytes_table(model.cfg, 1, (16, 48))

    batches = batching.batch_sweep(model, (1, 4), context=16, steps=2)
    assert batches.at(4).batch == 4 and "batch" in batches.table()
    fig, text = batching.users_view(batches, 4)
    assert text.startswith("batch size 4:") and "each user" in text
    _png(fig, tmp_path, "batch")
    ks = batching.kernel_sweep((1, 4), 256, "float32")
    mm = batching.model_matmuls(model, (1, 4))
    table = batching.kernel_table(ks, mm)
    assert "weight GB/s" in table and "weight matrices alone" in table
    knee = batching.knee_explanation(batches, mm, here.spec, model.cfg, here.dtype, lone=ks)
    assert "weight matrices alone" in knee and "knee of one [m, 256]" in knee
    fig = plots.kernel_vs_model(batches.records, ks + mm, cfg=model.cfg, spec=here.spec)
    assert len(fig.axes[0].get_lines()) >= 4        # model, two kernel series, roofline
    _png(fig, tmp_path, "knee")
    _png(plots.flops_or_bytes(exp.batch, exp.context), tmp_path, "fob")
    with pytest.raises(KeyError):
        batches.at(3)


def test_kv_capacity_table():
    gqa = CFG8B
    table = batching.kv_capacity_table([gqa, gqa.replace(name="mha", n_kv_heads=32)], H100, contexts=(4096,))
    assert "128KiB" in table and "512KiB" in table and f"{roofline.max_batch(gqa, H100, 4096):>11,}" in table


def test_kernels_are_shown_by_their_bodies():
    import pallas_kernels as pk

    names = [f.__name__ for f in machine.kernel_parts(pk.flash_attention)]
    assert names == ["flash_attention_kernel", "launch", "update"]
    assert [f.__name__ for f in machine.kernel_parts(pk.matmul)] == ["matmul_kernel", "launch"]
    text = machine.function_source(costs.decode_cost)
    assert text.splitlines()[1].startswith("def decode_cost") and "kv_read" in text
    excerpt = machine.function_source(costs.decode_cost, start="kv_tok =", stop="return _cost(")
    assert excerpt.splitlines()[1].startswith("kv_tok =") and "(excerpt)" in excerpt
    with pytest.raises(ValueError, match="no line"):
        machine.function_source(costs.decode_cost, start="not in the source")


def test_regimes_and_roofline_points(model, here, tmp_path):
    ops = intensity.regime_sweep(stream_bytes=(256, 4096, 2**16, 2**20), matmul_sizes=(16, 64), repeats=2)
    assert [o.kind for o in ops] == ["stream"] * 4 + ["matmul"] * 2
    assert "regime" in intensity.regime_table(ops, here.spec, here.dtype)
    points = intensity.roofline_points(model, (16, 32), (1, 4), context=16, steps=2)
    assert len(points.prefill) == 2 and len(points.decode) == 2
    fig, text = intensity.roofline_batch_view(points, here.spec, here.dtype, model.cfg, 4)
    assert text.startswith("batch size 4:") and "FLOP/byte" in text and "of the roof" in text
    _png(fig, tmp_path)
    _png(plots.three_regimes(ops + intensity.model_ops(points.prefill[-1], points.decode[0]), here.spec, here.dtype),
         tmp_path, "regimes")
    assert costs.attention_intensity(CFG8B) == 4
    split = prefill.rag_time_split(model, 32, ratios=(19, 47), steps=2)
    assert [row[0] for row in split.rows] == [19, 47] and "47:1" in split.table()
    assert split.rows[0][2] > split.rows[1][2] and 0 < split.decode_share(19) < 1


def test_analytic_tables():
    table = intensity.intensity_terms_table(CFG8B, (512, 32768), batch=64)
    assert "512" in table and "32768" in table
    tp = batching.tensor_parallel_table(CFG8B, H100, batch=64, context=2048, degrees=(1, 2, 3, 4))
    assert "does not split llama3_8b into whole heads" in tp and tp.count("GB") == 3


def test_prices_fall_with_batch(model):
    price = economics.GPU_PRICES["H100_SXM"]
    ratios = serving.price_ratios(CFG8B, H100, batches=(1, 8, 64), prompt_len=2048, context=2048)
    assert ratios[1] > ratios[8] > ratios[64] > 1
    assert "output/input" in serving.price_table(CFG8B, H100, price, batches=(1, 8), prompt_len=2048, context=2048)
    measured = serving.measured_price_ratios(model, price, batches=(1, 4), prompt_len=32)
    assert set(measured.ratios) == {1, 4} and "batch" in measured.table()
    fig, text = serving.price_view(CFG8B, H100, price, 8, 0.5, prompt_len=2048, context=2048)
    assert text.startswith("batch size 8, prefill at 50% MFU:")


def test_serving_simulation_views(tmp_path):
    phases = roofline_phases(CFG8B, H100, step_overhead_s=2e-4)
    assert serving.one_way_bandwidth(H100) == H100.interconnect_bandwidth / 2
    with pytest.raises(ValueError, match="interconnect"):
        serving.one_way_bandwidth(dataclasses.replace(H100, interconnect_bandwidth=None))
    runs = serving.serving_at(phases, 1024, spec=H100)
    assert set(runs) == {"colocated", "chunked", "disaggregated"}
    assert "disaggregated" in serving.sim_summary(runs)
    _png(plots.latency_distributions(runs), tmp_path, "lat")
    load = serving.prompt_load_sweep(phases, (512, 4096), spec=H100)
    d, c = load.disaggregated, load.colocated
    assert d[-1].ttft_p50 > d[0].ttft_p50 and d[-1].tpot_p50 < 1.3 * d[0].tpot_p50
    assert c[-1].tpot_p50 / c[0].tpot_p50 > d[-1].tpot_p50 / d[0].tpot_p50
    _png(plots.serving_plot(load.rows, x="prompt_len"), tmp_path, "serving")


def test_probe_writes_json_the_classroom_reads(here, tmp_path, capsys):
    report = classroom.run_probe(here, tmp_path, new_tokens=2, repeats=1)
    path = tmp_path / classroom.probe_filename(here)
    saved = json.loads(path.read_text())
    assert saved["schema_version"] == 2 and saved["complete"] and report["ratio"] > 0
    assert saved["machine"]["id"] in path.name
    (tmp_path / "broken.json").write_text("{")
    machines = classroom.load_measured(tmp_path, tmp_path / "missing")
    (label, records), = machines.items()
    assert saved["machine"]["id"] in label and f"({tmp_path.name})" in label
    assert [p.name for p, _ in machines.skipped] == ["broken.json", "missing"]   # a mistyped folder is said
    (tmp_path / "again.json").write_text(path.read_text())        # the same machine, a second run
    twice = classroom.load_measured(tmp_path)
    assert len(twice) == 2 and sum(f"({tmp_path.name}/" in k for k in twice) == 1   # the second names its file
    (tmp_path / "again.json").unlink()
    summary = classroom.classroom_summary(machines)
    assert "1 run(s) from 1 machine(s)" in summary and "skipped broken.json: is not valid JSON" in summary
    assert "skipped missing: the folder does not exist" in summary
    # the file's own ceilings: under two test workers with an empty cache, the probe may have read
    # ceilings the other worker measured and cached after `here` measured its own
    peak, bw = classroom.ceilings_of(records)
    assert peak == pytest.approx(saved["ceilings"]["matmul_flops_per_s"], rel=1e-6)
    assert bw == pytest.approx(saved["ceilings"]["bandwidth_bytes_per_s"], rel=1e-6)
    top, gain = classroom.predicted_batch_gain(records)
    assert top == 4 and 1 < gain <= 4                                # the roofline on the file's own ceilings
    points = classroom.ratio_points(machines)
    assert points[0]["measured"] == pytest.approx(report["ratio"]) and points[-1]["quoted"]
    assert points[0]["ideal"] == pytest.approx(peak / bw * 4 / 2)          # the ridge, in FLOPs per byte
    assert "measured/allowed" in classroom.ratio_table(points)
    # a run without a decode at batch 1, or without ceilings, is left out and said, not fatal
    no_decode = [r for r in records if r.phase == "prefill"]
    no_ceilings = [dataclasses.replace(r, mfu=None) if r.phase == "prefill" else r for r in records]
    mixed = classroom.ratio_points({"good": records, "bad": no_decode, "bare": no_ceilings}, reference=False)
    assert [p["label"] for p in mixed] == ["good"] and [label for label, _ in mixed.left_out] == ["bad", "bare"]
    assert "left out bad: " in classroom.ratio_table(mixed) and "no MFU/MBU" in classroom.ratio_table(mixed)
    fig, text = classroom.classroom_view(machines, 4)
    assert text.startswith("batch size 4: 1 run(s)") and "2 file(s) skipped: broken.json, missing" in text
    _png(fig, tmp_path)
    _png(plots.ratio_vs_ridge(points), tmp_path, "ratio")
    assert classroom.probe_filename(here).startswith("probe-") and " " not in classroom.probe_filename(here)


def test_your_own_model_is_probed_beside_the_lesson_model(here, tmp_path, monkeypatch, capsys):
    """Notebook 06, section 4: a Hugging Face folder through probe --model at the lesson's sizes,
    its ratio predicted from config.json first, then set beside the lesson model's."""
    import hf_checkpoints as hf
    from inference_lab.base import disk_cache
    from inference_lab.measure.records import load_records

    c = hf.config("qwen2", max_position_embeddings=64)
    folder = hf.write(tmp_path / "tiny-qwen2", c, hf.tensors(c))
    classroom.run_probe(here, tmp_path / "lesson", new_tokens=2, repeats=1)
    lesson_records = load_records(tmp_path / "lesson" / classroom.probe_filename(here))
    assert classroom.own_model_sizes(here, folder) == (min(SIZES.prompt_len, 64 - 8), SIZES.probe_batches)
    predicted = classroom.predicted_own_ratio(folder, lesson_records, 16)
    assert 1 < predicted < 1e4
    own = load_records(classroom.run_own_probe(here, folder, tmp_path / "own", new_tokens=2, repeats=1))
    assert own[0].preset == "tiny-qwen2" and own[0].mfu is not None        # sized from the file's own shape
    table = classroom.own_model_table(lesson_records, own).splitlines()
    assert table[0].split()[:2] == ["model", "step"] and [r.split()[0] for r in table[1:]] == ["tiny", "tiny-qwen2"]
    assert "MFU / MBU" in classroom.own_model_readout(lesson_records, own)
    with pytest.raises(ValueError, match=r"config\.json: missing"):
        classroom.own_model_folder(tmp_path)                                # a folder that is not a model's
    # no folder of the learner's: the trained shakespeare_large written as one, once
    monkeypatch.setattr(disk_cache, "cache_dir", lambda *parts: tmp_path.joinpath("cache", *parts))
    written = classroom.own_model_folder()
    assert (written / "config.json").is_file() and classroom.own_model_folder() == written


def test_the_projects_measurements_load():
    machines = classroom.load_measured(classroom.MEASUREMENTS)
    assert machines, "docs/measurements/ holds at least this project's own CPU probe"
    for records in machines.values():
        pre, dec = classroom.split(records)
        assert pre.prefill_tokens_per_s > 0 and 1 in dec


def test_lesson_figures(tmp_path):
    _png(plots.ridge_comparison([H100, hardware.PRESETS["H200"]], ["bf16", "bf16"]), tmp_path, "ridge")
    _png(plots.kitchen(CFG8B, H100), tmp_path, "kitchen")
    _png(plots.intensity_vs_context(CFG8B), tmp_path, "intensity")
    _png(plots.time_split_bars(1e-3, 5e-3), tmp_path, "split")
    _png(plots.request_timeline(0.1, 0.9, 256, 16), tmp_path, "timeline")
    with pytest.raises(ValueError):
        plots.ridge_comparison([H100], [])
    with pytest.raises(ValueError):
        plots.time_split_bars(0, 1)
