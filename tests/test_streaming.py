"""Streaming gives generate()'s tokens one at a time with their times; no cache, same text."""

import numpy as np
import pytest
from flax import nnx

from inference_lab.runtime import streaming
from inference_lab.base import tokenizer
from inference_lab.base.config import ModelConfig
from inference_lab.runtime.generation import generate
from inference_lab.model.transformer import Transformer

TINY = ModelConfig.preset("tiny")


@pytest.fixture(scope="module")
def model():
    return Transformer(TINY, rngs=nnx.Rngs(0), kernels="reference")


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_stream_yields_generates_tokens_in_order_with_times(model, temperature):
    toks = list(streaming.stream(model, "Hello there", 12, temperature=temperature, seed=3))
    want = generate(model, [tokenizer.encode("Hello there")], 12, temperature=temperature, seed=3)[0]
    assert [t.token for t in toks] == want
    times = [t.seconds for t in toks]
    assert all(b >= a for a, b in zip(times, times[1:])) and times[0] > 0
    text = "".join(t.text for t in toks)
    assert text == generate(model, "Hello there", 12, temperature=temperature, seed=3)


def test_uncached_greedy_equals_cached_greedy(model):
    un = streaming.generate_without_cache(model, "Hello there", 20, bucket=8)
    assert un.text == generate(model, "Hello there", 20)
    assert un.lengths == list(range(12, 32))  # BOS + 11 bytes, then one more token per step
    assert len(un.step_seconds) == 20 and all(s > 0 for s in un.step_seconds)


def test_errors_name_the_argument(model):
    with pytest.raises(ValueError, match="prompt"):
        list(streaming.stream(model, "", 4))
    with pytest.raises(ValueError, match="max_new_tokens"):
        list(streaming.stream(model, "hi", 0))
    with pytest.raises(ValueError, match="max_seq_len"):
        list(streaming.stream(model, "hi", TINY.max_seq_len))
    with pytest.raises(ValueError, match="bucket"):
        streaming.generate_without_cache(model, "hi", 2, bucket=0)
    assert np.isfinite(next(streaming.stream(model, "hi", 1)).seconds)
