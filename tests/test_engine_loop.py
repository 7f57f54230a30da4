"""The serving engine in this process (no HTTP): text equal to generate() under every policy with
the overlap on and off and requests arriving at odd moments, no compile after warm-up whatever
the clients ask, seeded sampling among strangers, cancels mid-prefill, speculative decoding, and
every request ending (tokens or an error) when the loop fails or the engine stops.

Every engine here has two slots and the same budgets, so the compiled programs are shared by
every test of the file (the trained 1.7M-parameter `shakespeare` model: quick to compile).
"""

from __future__ import annotations

import random
import time

import jax
import numpy as np
import pytest

from inference_lab.base import tokenizer
from inference_lab.serving.engine import Engine
from inference_lab.serving.requests import QueueFull, Request
from pallas_kernels.mode import pallas_supported
from serving_helpers import LENGTHS, PRESET, PROMPTS, Listener, generated, load

BUDGET = {"chunked": 32, "prefill-first": None}
LONG = "First Citizen:\n" + "Before we proceed any further, hear me speak. " * 4   # 199 tokens: many pieces
PAGED = dict(num_kv_blocks=17, enable_prefix_caching=True)   # 16 usable blocks: one full-context request


@pytest.fixture(scope="module")
def model():
    return load()


@pytest.fixture(scope="module")
def expected(model):
    return generated(model)


def engine_for(model, policy="chunked", **kw):
    engine = Engine(model, policy=policy, n_slots=2, max_num_batched_tokens=BUDGET[policy], **kw)
    engine.warmup()
    return engine.start()


@pytest.mark.parametrize("policy", ["chunked", "prefill-first"])
@pytest.mark.parametrize("overlap", [True, False], ids=["async", "sync"])
def test_text_equals_generate_whatever_the_arrivals(model, expected, policy, overlap):
    """Three requests on two slots, in a new order and at new moments in each round (one waits
    for a slot, pieces of different prompts share steps, a slot is used again): greedy text as
    generate() writes it alone, every time."""
    engine = engine_for(model, policy, async_scheduling=overlap)
    try:
        for trial in range(3):
            listen, rng = Listener(), random.Random(trial)
            order = rng.sample(range(3), 3)
            for i in order:
                engine.submit(Request(f"{trial}-{i}", tokenizer.encode(PROMPTS[i]), LENGTHS[i], stop_at_eos=False),
                              listen)
                time.sleep(rng.random() * 0.03)
            listen.wait(3)
            assert [listen.text(f"{trial}-{i}") for i in range(3)] == expected, (trial, order)
            assert all(e.index == j for i in range(3) for j, e in enumerate(listen.events[f"{trial}-{i}"]))
    finally:
        engine.stop()
    assert engine.stats()["held"] == 0 and not engine.scheduler.running


def test_no_compile_after_warmup_whatever_the_clients_ask(model):
    """50 requests with random temperatures, top-k, top-p, min-p, 64-bit seeds, lengths, EOS and stop
    tokens, min_tokens and log-probabilities after warm-up: XLA compiles nothing (all of them are
    arrays of the one step program, not static arguments). The counter is shown to count: a new
    program compiled here is seen."""
    compiles = []

    def listener(name, seconds, **kw):
        if name == "/jax/core/compile/backend_compile_duration":
            compiles.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    engine = engine_for(model)
    rng = np.random.default_rng(0)
    try:
        jax.jit(lambda x: x * 3 + 1)(np.arange(7.0)).block_until_ready()
        assert compiles, "the compile counter saw nothing: it would pass whatever happens"
        before = len(compiles)
        listen = Listener()
        for i in range(50):
            n, most = int(rng.integers(1, 120)), int(rng.integers(1, 60))
            engine.submit(Request(str(i), [tokenizer.BOS] + rng.integers(32, 127, n).tolist(), most,
                                  temperature=float(rng.choice([0.0, 0.5, 1.0, 1.7])),
                                  top_k=None if rng.random() < 0.3 else int(rng.integers(1, 259)),
                                  top_p=float(rng.choice([1.0, 0.9, 0.3])), min_p=float(rng.choice([0.0, 0.05, 0.5])),
                                  seed=int(rng.integers(0, 2**63)) * 2 + 1, stop_at_eos=bool(rng.random() < 0.5),
                                  stop_token_ids=tuple(int(t) for t in rng.integers(32, 127, rng.integers(0, 4))),
                                  min_tokens=int(rng.integers(0, most + 1)),
                                  logprobs=None if rng.random() < 0.5 else int(rng.integers(0, 21))), listen)
        listen.wait(50, timeout=120)
        assert len(compiles) == before, f"{len(compiles) - before} compiles after warm-up"
        assert set(listen.finishes().values()) <= {"length", "stop"}
        with_logprobs = [e for ev in listen.events.values() for e in ev if e.logprob is not None]
        assert with_logprobs and all(e.logprob <= 0 for e in with_logprobs)
    finally:
        engine.stop()
        jax.monitoring.unregister_event_duration_listener(listener)


def test_seeded_sampling_among_strangers_equals_generate(model):
    """Sampled requests with their own seeds, temperatures and top-k, served together (and beside a
    greedy one): each gets what generate(..., seed=) gives it alone."""
    from inference_lab.runtime import generation

    asks = [dict(temperature=0.9, seed=7), dict(temperature=1.3, top_k=12, seed=2**40 + 1), dict(temperature=0.0)]
    want = [generation.generate(model, PROMPTS[i], max_new_tokens=20, **a) for i, a in enumerate(asks)]
    engine = engine_for(model)
    listen = Listener()
    try:
        for i, a in enumerate(asks):
            engine.submit(Request(str(i), tokenizer.encode(PROMPTS[i]), 20, stop_at_eos=False, **a), listen)
        listen.wait(3)
    finally:
        engine.stop()
    assert [listen.text(str(i)) for i in range(3)] == want


class StepWatch:
    """Wraps ``engine.slots.run``: calls ``act(step)`` as each step is dispatched (on the engine's thread)."""

    def __init__(self, engine, act):
        self.run, self.act = engine.slots.run, act
        engine.slots.run = self

    def __call__(self, step):
        out = self.run(step)
        self.act(step)
        return out


@pytest.mark.parametrize("policy,cache", [("chunked", {}), ("prefill-first", {}), ("chunked", PAGED)],
                         ids=["chunked", "prefill-first", "chunked-paged"])
def test_cancel_mid_prefill_frees_the_slot(model, expected, policy, cache):
    """A long prompt cancelled while its pieces are on the device: it ends with "abort" and no
    token, its slot (and, paged, every block) is free at once, and the next request in that slot
    writes the right text."""
    engine = engine_for(model, policy, **cache)
    listen = Listener()

    def act(step):
        if any(c.seq.rid == "long" for c in step.chunks):
            engine.cancel("long")

    StepWatch(engine, act)
    try:
        engine.submit(Request("long", tokenizer.encode(LONG), 50, stop_at_eos=False), listen)
        listen.wait(1)
        assert listen.finishes() == {"long": "abort"} and [e.token for e in listen.events["long"]] == [-1]
        assert not engine.scheduler.running and engine.stats()["held"] == 0
        kv = engine.stats()["kv_cache"]
        assert kv["layout"] == ("paged" if cache else "contiguous") and kv.get("blocks_free") == kv.get("blocks_usable")
        engine.submit(Request("next", tokenizer.encode(PROMPTS[2]), LENGTHS[2], stop_at_eos=False), listen)
        listen.wait(1)
        assert listen.text("next") == expected[2]
    finally:
        engine.stop()


def test_a_failing_loop_ends_every_request(model):
    """The step raises while requests are running, prefilling, waiting and still in the inbox: each
    ends with "error" and the reason, and the engine refuses what comes after."""
    engine = Engine(model, policy="chunked", n_slots=2, max_num_batched_tokens=32, max_queue=8)
    engine.warmup()
    listen, calls = Listener(), []
    run = engine.slots.run

    def failing(step):
        calls.append(step)
        if len(calls) == 6:
            for i in range(3):   # these reach the inbox while the step fails
                engine.submit(Request(f"late{i}", [tokenizer.BOS] * 5, 10), listen)
            raise RuntimeError("the device fell over")
        return run(step)

    engine.slots.run = failing
    for i in range(4):
        engine.submit(Request(str(i), tokenizer.encode(LONG if i == 1 else PROMPTS[0]), 40), listen)
    engine.start()
    listen.wait(7)
    ends = listen.finishes()
    assert set(ends) == {"0", "1", "2", "3", "late0", "late1", "late2"} and set(ends.values()) == {"error"}
    assert all("the device fell over" in listen.events[r][-1].error for r in ends)
    with pytest.raises(RuntimeError, match="fell over"):
        engine.submit(Request("after", [tokenizer.BOS], 3), listen)
    assert engine.stats()["error"] and engine.stats()["held"] == 0


@pytest.mark.parametrize("overlap", [True, False], ids=["async", "sync"])
def test_a_request_whose_last_token_a_failing_step_planned_still_ends(model, overlap):
    """The scheduler lets a request go when it plans its last token (a one-token request at its
    prefill; any finishing one without the overlap), before the step runs. When that step raises,
    the request must still end, with the error: before, it was in no list the failure ended."""
    engine = Engine(model, policy="chunked", n_slots=2, max_num_batched_tokens=32, async_scheduling=overlap)
    listen = Listener()

    def failing(step):
        raise RuntimeError("the device fell over")

    engine.slots.run = failing
    engine.submit(Request("one", tokenizer.encode(PROMPTS[0]), 1), listen)
    engine.start()
    listen.wait(1, timeout=20)
    end = listen.events["one"][-1]
    assert (end.finish, end.token) == ("error", -1) and "fell over" in end.error
    assert engine.stats()["held"] == 0


def test_a_submission_racing_the_stop_ends_or_is_refused(model):
    """A submit that passed the engine's check before the loop stopped but reached the inbox after
    the loop's last drain was never ended. Forced here: the submission's put waits until the loop
    has stopped (or a second has passed). Now the check and the put hold the lock the last drain
    takes, so the loop waits for the put and ends the request with the stop's reason."""
    engine = Engine(model, policy="chunked", n_slots=2, max_num_batched_tokens=32).start()
    listen, inbox = Listener(), engine._inbox

    class LateInbox:
        """The engine's inbox, with a submission's put held back until the loop has stopped."""

        def put(self, message):
            if message[0] == "submit":
                engine.stop(timeout=1.0, reason="closing")   # returns once the loop ended (or after 1 s)
            inbox.put(message)

        def get(self, *args, **kwargs):
            return inbox.get(*args, **kwargs)

        def get_nowait(self):
            return inbox.get_nowait()

    engine._inbox = LateInbox()
    engine.submit(Request("racer", tokenizer.encode(PROMPTS[0]), 5), listen)
    listen.wait(1, timeout=20)
    assert listen.finishes() == {"racer": "abort"} and listen.events["racer"][-1].error == "closing"
    assert engine.stats()["held"] == 0


def test_stop_ends_everything_in_flight_with_the_reason(model):
    engine = Engine(model, policy="chunked", n_slots=2, max_num_batched_tokens=32, max_queue=30)
    engine.warmup()
    engine.start()
    listen = Listener()
    for i in range(20):
        engine.submit(Request(str(i), [tokenizer.BOS] * 30, 200, stop_at_eos=False), listen)
    while not listen.events:
        time.sleep(0.01)
    t0 = time.perf_counter()
    engine.stop(reason="the lab is closing")
    listen.wait(20, timeout=10)
    assert time.perf_counter() - t0 < 10
    ends = [ev[-1] for ev in listen.events.values()]
    assert len(ends) == 20 and {e.finish for e in ends} == {"abort"}
    assert all(e.error == "the lab is closing" for e in ends)
    with pytest.raises(RuntimeError, match="closing"):
        engine.submit(Request("after", [tokenizer.BOS], 3), listen)


def test_back_pressure_counts_every_request_held(model):
    """Two slots and max_queue=2: four requests are held (running or waiting), the fifth is
    refused; once they end, the engine takes new ones again."""
    engine = Engine(model, policy="chunked", n_slots=2, max_num_batched_tokens=32, max_queue=2)
    listen = Listener()
    for i in range(4):
        engine.submit(Request(str(i), [tokenizer.BOS] * 4, 5), listen)
    with pytest.raises(QueueFull, match="4 requests"):
        engine.submit(Request("x", [tokenizer.BOS] * 4, 5), listen)
    engine.warmup()
    engine.start()
    try:
        listen.wait(4)
        engine.submit(Request("y", [tokenizer.BOS] * 4, 5), listen)
        listen.wait(1)
    finally:
        engine.stop()
    assert engine.stats()["held"] == 0


@pytest.mark.parametrize("cache", [{}, PAGED], ids=["contiguous", "paged"])
def test_speculative_decoding_keeps_the_text(model, expected, cache):
    """n-gram speculation (k = 3): every greedy text as generate() writes it, a repetitive prompt
    accepts guesses, a sampled request still draws what generate(seed=) draws; over a paged pool
    too, whose guesses get blocks only where the pool has them."""
    from inference_lab.runtime import generation

    engine = engine_for(model, speculative=("ngram", 3), **cache)
    assert not engine.async_scheduling and engine.stats()["speculative"]["num_speculative_tokens"] == 3
    song = "ROMEO:\nO Romeo, Romeo, wherefore art thou Romeo? O Romeo, Romeo, wherefore art thou"
    want_song = generation.generate(model, song, max_new_tokens=40)
    want_sampled = generation.generate(model, PROMPTS[1], max_new_tokens=15, temperature=1.0, seed=3)
    listen = Listener()
    try:
        for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS)):
            engine.submit(Request(str(i), tokenizer.encode(p), n, stop_at_eos=False), listen)
        engine.submit(Request("song", tokenizer.encode(song), 40, stop_at_eos=False), listen)
        engine.submit(Request("sampled", tokenizer.encode(PROMPTS[1]), 15, temperature=1.0, seed=3,
                              stop_at_eos=False), listen)
        listen.wait(5)
    finally:
        engine.stop()
    assert [listen.text(str(i)) for i in range(3)] == expected
    assert listen.text("song") == want_song and listen.text("sampled") == want_sampled
    spec = engine.stats()["speculative"]
    assert spec["proposed"] > 0 and spec["accepted"] > 0 and 0 < spec["acceptance_rate"] <= 1


def test_sampled_rows_speculate_and_still_draw_what_generate_draws(model):
    """A sampled request gets guesses too (vLLM's rejection sampling: for a one-token draft, a
    guess is kept when the row's own draw for that token equals it), and keeps some on a
    repetitive prompt; its seeded text is what generate(seed=) writes without speculation, token
    for token, since each token is drawn with its own key either way."""
    from inference_lab.runtime import generation

    song = "ROMEO:\nO Romeo, Romeo, wherefore art thou Romeo? O Romeo, Romeo, wherefore art thou"
    asks = [dict(temperature=0.6, seed=11), dict(temperature=1.0, top_k=5, seed=2**63 + 5)]
    want = [generation.generate(model, song, max_new_tokens=40, **a) for a in asks]
    for i, a in enumerate(asks):
        engine = engine_for(model, speculative=("ngram", 3))
        listen = Listener()
        try:
            engine.submit(Request("s", tokenizer.encode(song), 40, stop_at_eos=False, **a), listen)
            listen.wait(1)
        finally:
            engine.stop()
        spec = engine.stats()["speculative"]
        assert listen.text("s") == want[i]
        assert spec["drafts"] > 0 and spec["accepted"] > 0, spec       # before: sampled rows got no guesses


def test_engine_refuses_requests_it_cannot_hold(model):
    engine = Engine(model, policy="chunked", n_slots=1)       # not started: refused at submit
    for request, word in ((Request("a", [], 4), "prompt"), (Request("b", [tokenizer.BOS] * 256, 4), "max_len"),
                          (Request("c", [9999], 4), "vocabulary"), (Request("d", [1, 2], 0), "max_tokens"),
                          (Request("e", [1, 2], 4, temperature=-1.0), "temperature")):
        with pytest.raises(ValueError, match=word):
            engine.submit(request, lambda e: None)
    assert engine.stats()["held"] == 0


def test_engine_refuses_bad_settings(model):
    for kwargs, word in (({"policy": "fastest"}, "policy"), ({"n_slots": 0}, "n_slots"),
                         ({"max_num_batched_tokens": 8}, "max_num_batched_tokens"),
                         ({"policy": "prefill-first", "max_num_batched_tokens": 64}, "whole prompt"),
                         ({"policy": "disaggregated"}, "TwoPoolEngine"), ({"speculative": ("eagle", 3)}, "eagle"),
                         ({"speculative": ("ngram", 16)}, "num_speculative_tokens"),
                         ({"async_scheduling": "yes"}, "async_scheduling")):
        with pytest.raises(ValueError, match=word):
            Engine(model, **kwargs)


def test_the_engine_on_the_pallas_kernels_under_the_interpreter(expected):
    """The engine's step on the Pallas kernels themselves (decode attention for the rows, flash
    attention with q_offsets for the pieces), interpreted on this CPU: the greedy text the
    reference kernels' generate() writes. (Two tokens, a prompt step and a decode step: the interpreter is slow; a GPU runs
    the whole check compiled, below.)"""
    from inference_lab.model import pretrained

    engine = Engine(pretrained.load("interpret", preset=PRESET), policy="chunked", n_slots=2,
                    max_num_batched_tokens=32).start()
    listen = Listener()
    try:
        engine.submit(Request("p", tokenizer.encode(PROMPTS[1]), 2, stop_at_eos=False), listen)
        listen.wait(1, timeout=300)
    finally:
        engine.stop()
    assert listen.text("p") == expected[1][:2]


@pytest.mark.gpu
@pytest.mark.skipif(not pallas_supported(), reason="needs an NVIDIA GPU (compute capability >= 8.0)")
def test_the_engine_on_the_pallas_kernels_writes_what_generate_writes():
    """On a GPU the engine's step runs the Pallas kernels (decode attention for the rows, flash
    attention with q_offsets for the pieces): greedy text as generate() writes it, sampled as
    generate(seed=) draws it."""
    from inference_lab.model import pretrained
    from inference_lab.runtime import generation

    gpu_model = pretrained.load("pallas", preset=PRESET)
    want = [generation.generate(gpu_model, p, max_new_tokens=n) for p, n in zip(PROMPTS, LENGTHS)]
    sampled = generation.generate(gpu_model, PROMPTS[1], max_new_tokens=20, temperature=0.8, seed=5)
    # no warm-up: only the shapes these requests reach are compiled (the GPU check has 130 s for its tests)
    engine = Engine(gpu_model, policy="chunked", n_slots=2, max_num_batched_tokens=BUDGET["chunked"]).start()
    listen = Listener()
    try:
        for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS)):
            engine.submit(Request(str(i), tokenizer.encode(p), n, stop_at_eos=False), listen)
        engine.submit(Request("s", tokenizer.encode(PROMPTS[1]), 20, temperature=0.8, seed=5, stop_at_eos=False), listen)
        listen.wait(4)
    finally:
        engine.stop()
    assert [listen.text(str(i)) for i in range(3)] == want and listen.text("s") == sampled


# ----------------------------------------------------------------------------- the paged cache

@pytest.mark.parametrize("overlap", [True, False], ids=["async", "sync"])
def test_paged_text_equals_generate_under_preemption_and_prefix_hits(model, overlap):
    """Each prompt twice, greedy and seeded-sampled, with long answers, on two slots over a pool of
    one full context: the answers outgrow the pool, requests are preempted and start again (their
    prompts partly from the prefix cache), and each text is what generate() writes alone. The pool
    is full again at the end, and the engine says what happened."""
    from inference_lab.runtime import generation

    n = [150, 120, 100]
    sampled = dict(temperature=0.9, top_k=40, seed=5)
    greedy = [generation.generate(model, p, max_new_tokens=k) for p, k in zip(PROMPTS, n)]
    drawn = [generation.generate(model, p, max_new_tokens=k, **sampled) for p, k in zip(PROMPTS, n)]
    engine = engine_for(model, async_scheduling=overlap, **PAGED)
    listen = Listener()
    try:
        for i in range(3):
            engine.submit(Request(f"g{i}", tokenizer.encode(PROMPTS[i]), n[i], stop_at_eos=False), listen)
            engine.submit(Request(f"s{i}", tokenizer.encode(PROMPTS[i]), n[i], stop_at_eos=False, **sampled), listen)
        listen.wait(6, timeout=180)
        stats = engine.stats()
    finally:
        engine.stop()
    assert [listen.text(f"g{i}") for i in range(3)] == greedy
    assert [listen.text(f"s{i}") for i in range(3)] == drawn
    kv = stats["kv_cache"]
    assert stats["preemptions"] > 0 and 0 < kv["prefix_cache_hits"] < kv["prefix_cache_queries"]
    assert kv["blocks_free"] == kv["blocks_usable"] == 16 and kv["layout"] == "paged"


def test_paged_engine_settings_are_checked_before_anything_is_built(model):
    for kw, words in ((dict(block_size=24), "power of two"), (dict(block_size=512), "does not divide"),
                      (dict(num_kv_blocks=16), "cannot hold one request"), (dict(kv_cache_memory="lots"), "memory size"),
                      (dict(kv_cache_memory="256KiB"), "cannot hold one request"),
                      (dict(num_kv_blocks=40, kv_cache_memory="4MiB"), "not both"),
                      (dict(enable_prefix_caching="yes"), "True or False")):
        with pytest.raises(ValueError, match=words):
            Engine(model, n_slots=2, max_num_batched_tokens=32, **kw)
    cfg = model.cfg
    per_block = 16 * 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4
    engine = Engine(model, n_slots=2, max_num_batched_tokens=32, kv_cache_memory=f"{40 * per_block}")
    assert engine.stats()["kv_cache"]["num_kv_blocks"] == 40
    default = Engine(model, n_slots=2, max_num_batched_tokens=32, block_size=32)   # the contiguous slots' memory
    assert default.stats()["kv_cache"]["num_kv_blocks"] == 2 * cfg.max_seq_len // 32 + 1
