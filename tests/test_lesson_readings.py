"""The sentences the lessons print from their numbers: each must say what the numbers say, on
realistic data and on counter-data (a reading that could only ever print one thing is a defect).
Notebook prose quotes no number that can move; these functions write those sentences instead."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from inference_lab.analytic import costs, speculation
from inference_lab.base import hardware
from inference_lab.base.config import ModelConfig
from inference_lab.lessons import arithmetic_intensity, batching, speculative_decoding
from inference_lab.lessons.arithmetic_intensity import Op
from inference_lab.lessons.machine import DECODE_COLUMNS

H100, H200 = hardware.PRESETS["H100_SXM"], hardware.PRESETS["H200"]
CFG8B = ModelConfig.preset("llama3_8b")


def _sweep(steps_ms: dict) -> batching.BatchSweep:
    recs = [SimpleNamespace(batch=b, context=256, step_seconds=ms / 1e3, device="cpu", preset="small")
            for b, ms in steps_ms.items()]
    return batching.BatchSweep(recs, DECODE_COLUMNS)


@pytest.mark.parametrize("steps, flip, says", [
    # this CPU's stored run: batch 2 at x1.49, just under the line; knee 8 beside a flip at 9
    ({1: 10.86, 2: 16.24, 4: 16.09, 8: 21.76, 16: 32.53}, 9, ["the knee (batch 8) comes near", "batch 2, 4 came within 10%"]),
    # a GPU-like run: flat for tens of rows, the knee well after a tiny flip
    ({1: 1.0, 2: 1.01, 8: 1.05, 64: 1.6}, 9, ["the knee (batch 64) comes later than"]),
    # the knee far before the flip, and nothing near the line below it
    ({1: 10.0, 2: 11.0, 4: 16.0, 8: 20.0}, 64, ["the knee (batch 4) comes well before"]),
    # no knee in the sweep
    ({1: 10.0, 2: 10.5, 4: 11.0}, 9, ["no batch in the sweep reaches x1.5: the knee lies past batch 4"]),
    # no flip at this context
    ({1: 10.0, 2: 16.0}, None, ["the knee is batch 2; the roofline never flips"]),
])
def test_knee_reading_says_what_the_sweep_shows(steps, flip, says):
    text = batching.knee_reading(_sweep(steps), flip)
    for phrase in says:
        assert phrase in text, text
    if len(says) == 1:
        assert "came within" not in text, text     # nothing near the line: no warning that could not apply


def test_stream_against_ceiling_names_the_cause():
    big = 2**28
    quiet = [Op("stream", "256 B", 64, 256, 2e-5), Op("stream", "256 MiB", big / 4, big, big / 23e9, big / 40e9)]
    busy = [Op("stream", "256 MiB", big / 4, big, big / 20e9, big / 24e9)]
    spec = SimpleNamespace(bandwidth=42e9)
    said = arithmetic_intensity.stream_against_ceiling(quiet, spec)
    assert "23.0 GB/s (median" in said and "40.0 GB/s at its best repeat" in said and "the gap is the statistic" in said
    said = arithmetic_intensity.stream_against_ceiling(busy, spec)
    assert "43% below it, so the gap is the moment" in said


def test_where_speculation_stops_paying_depends_on_the_ridge():
    """The hand formula B = R x E / (k + 1) and the roofline agree at a short context, and a
    machine with a lower ridge stops paying at a smaller batch (the stored run once printed the
    same batch for an H100 and an H200: a grid of powers of two hid the difference)."""
    for spec in (H100, H200):
        exact = speculation.batch_where_it_stops_paying(0.7, 4, CFG8B, spec, context=128, cache_once=True)
        by_hand = speculation.stops_paying_estimate(0.7, 4, CFG8B, spec)
        assert 0.7 < exact / by_hand < 1.4, (spec.name, exact, by_hand)
    h100 = speculation.batch_where_it_stops_paying(0.4, 4, CFG8B, H100, context=128)
    h200 = speculation.batch_where_it_stops_paying(0.4, 4, CFG8B, H200, context=128)
    assert h200 < h100
    # a verify that re-reads the cache per token stops paying from the bytes, sooner, at a long context
    assert (speculation.batch_where_it_stops_paying(0.4, 4, CFG8B, H100, context=1024)
            < speculation.batch_where_it_stops_paying(0.4, 4, CFG8B, H100, context=1024, cache_once=True))
    text = speculative_decoding.where_it_stops_paying(0.4, 4, H100)
    assert "reading the cache once" in text and "by hand batch" in text and "predicted knee" in text


def test_verify_reading_the_cache_once_reads_it_once():
    once = costs.verify_cost(CFG8B, 8, 1024, 5, cache_once=True)
    per_token = costs.verify_cost(CFG8B, 8, 1024, 5)
    assert per_token.parts["kv_read"] == 5 * once.parts["kv_read"] == 5 * costs.decode_cost(CFG8B, 8, 1024).parts["kv_read"]


def test_the_most_decisive_k_is_the_prediction_furthest_from_one():
    predicted = {("n-gram", 1): 0.68, ("n-gram", 4): 0.85, ("n-gram", 6): 1.3, ("shakespeare", 2): 1.6}
    assert speculative_decoding.most_decisive(predicted, "n-gram") == 1      # |log 0.68| > |log 1.3|
    predicted[("n-gram", 6)] = 1.6
    assert speculative_decoding.most_decisive(predicted, "n-gram") == 6
    assert speculative_decoding.best_predicted(predicted, "n-gram") == 6
