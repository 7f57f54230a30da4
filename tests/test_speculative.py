"""Speculative decoding: the text is plain greedy decode's token for token (every draft, every k,
batch 1 and ragged batches, a draft always wrong and one always right), the verify step equals
decode steps, the cost model against hand-computed values, and its claims fail on counter-data."""

import dataclasses
import types

import numpy as np
import pytest
from flax import nnx

from inference_lab.analytic import costs, speculation as cost_model
from inference_lab.base import hardware, tokenizer
from inference_lab.base.config import ModelConfig
from inference_lab.lessons import claims
from inference_lab.measure.matmuls import KernelPoint
from inference_lab.measure.speculation import GenerationRecord, VerifyRecord
from inference_lab.model import pretrained
from inference_lab.model.kv_cache import KVCache
from inference_lab.model.transformer import Transformer
from inference_lab.runtime import generation
from inference_lab.runtime.speculative import (ConstantDraft, ModelDraft, NgramDraft, room_needed,
                                               speculative_generate)

NEW = 40
PROMPTS = ["ROMEO:", "JULIET:\nO Romeo, Romeo! wherefore art thou", "First Citizen:\nBefore we proceed"]


@pytest.fixture(scope="module")
def target():
    return pretrained.load(kernels="reference")


@pytest.fixture(scope="module")
def weak_draft():
    """A random one-layer model with the same bytes: a draft that is mostly wrong, and cheap."""
    cfg = dataclasses.replace(ModelConfig.preset("shakespeare"), name="weak", n_layers=1, d_model=64, n_heads=2,
                              n_kv_heads=1, d_ff=128)
    return Transformer(cfg, rngs=nnx.Rngs(3), kernels="reference")


@pytest.fixture(scope="module")
def plain(target):
    return {"one": generation.generate(target, PROMPTS[0], NEW), "ragged": generation.generate(target, PROMPTS, NEW)}


# k = 1 (one guess), 2, an odd middle one and 8, past the lessons' largest (6): each k compiles
# its own verify width, so the sweep keeps to the cases that differ (its cost is the suite's budget).
@pytest.mark.parametrize("k", [1, 2, 5, 8])
def test_ngram_and_never_right_drafts_write_plain_greedy_text(target, plain, k):
    for draft in (NgramDraft(), ConstantDraft()):
        one = speculative_generate(target, draft, PROMPTS[0], NEW, k=k)
        assert one.text == [plain["one"]], (draft.name, k)
        ragged = speculative_generate(target, draft, PROMPTS, NEW, k=k)
        assert ragged.text == plain["ragged"], (draft.name, k)
        assert all(len(t) == NEW for t in ragged.tokens)
    assert ragged.accepted.sum() == 0 and one.accepted.sum() == 0          # never right: nothing kept
    ngram = speculative_generate(target, NgramDraft(), PROMPTS, NEW, k=k)
    assert ngram.accepted.sum() > 0            # the greedy text repeats itself: some guesses are kept


@pytest.mark.parametrize("k", [1, 4])
def test_draft_models_write_plain_greedy_text(target, weak_draft, plain, k):
    for draft in (ModelDraft(weak_draft), ModelDraft(target)):
        for prompts, want in ((PROMPTS[0], [plain["one"]]), (PROMPTS, plain["ragged"])):
            assert speculative_generate(target, draft, prompts, NEW, k=k).text == want, (draft.name, k)


def test_always_right_and_always_wrong_drafts_bound_the_rounds(target):
    right = speculative_generate(target, ModelDraft(target), PROMPTS, NEW, k=4)
    assert right.acceptance_rate == 1.0
    assert right.tokens_per_step > 4.5          # k + 1 per round, the last round cut at NEW
    wrong = speculative_generate(target, ConstantDraft(), PROMPTS, NEW, k=4)
    assert wrong.acceptance_rate == 0.0 and wrong.tokens_per_step == 1.0
    assert list(wrong.target_steps) == [NEW - 1] * len(PROMPTS)
    assert all(sum(p) >= NEW and p[0] == 1 for p in right.round_tokens)
    assert right.unguessed.sum() == 0 and wrong.unguessed.sum() == 0        # both guess every round


def test_rounds_with_nothing_to_guess_are_counted(target):
    """Prompt lookup on a prompt with no repeated bigram has nothing to guess in its first round;
    a round is counted once per row it had no guess for, and per token written."""
    class Counting(NgramDraft):
        def __init__(self):
            super().__init__()
            self.none = 0

        def propose(self, histories, last, k):
            guesses, real = super().propose(histories, last, k)
            self.none += int((real == 0).sum())
            return guesses, real

    draft = Counting()
    res = speculative_generate(target, draft, PROMPTS[1], NEW, k=3)
    assert res.unguessed.sum() == draft.none > 0
    assert res.unguessed_per_token == pytest.approx(draft.none / (NEW - 1))
    assert res.unguessed[0] <= res.target_steps[0]


def test_verify_equals_decode_steps_ragged(target):
    """verify(T tokens) gives the logits T decode steps give, on a ragged cache."""
    rows = [tokenizer.encode(p) for p in PROMPTS]
    tokens, lengths = generation.padded(rows)
    feed = np.random.default_rng(0).integers(0, 256, (len(rows), 5)).astype(np.int32)

    _, cache = generation.prefill(target, tokens, KVCache.create(target.cfg, len(rows), 64), lengths)
    verified, cache = generation.verify(target, feed, cache)
    assert cache.host_lengths.tolist() == (lengths + 5).tolist()

    _, cache = generation.prefill(target, tokens, KVCache.create(target.cfg, len(rows), 64), lengths)
    stepped = []
    for j in range(5):
        logits, cache = generation.decode_step(target, feed[:, j], cache)
        stepped.append(np.asarray(logits))
    np.testing.assert_allclose(np.asarray(verified), np.stack(stepped, axis=1), rtol=2e-5, atol=2e-5)


def test_ngram_guesses_follow_the_latest_match():
    d = NgramDraft(max_n=3, min_n=1)
    assert d.guess_row([5, 1, 2, 9, 9, 1, 2, 7, 7, 1, 2], 3) == [7, 7, 1]   # latest "1 2" is followed by 7 7 1
    assert d.guess_row([1, 2, 3, 4], 2) == []                             # "4" never seen before
    assert NgramDraft(min_n=2).guess_row([3, 4, 5, 3, 4], 4) == [5, 3, 4]  # fewer than k left after the match


def test_bad_arguments_fail_before_anything_runs(target):
    with pytest.raises(ValueError, match="k=0 must be"):
        speculative_generate(target, NgramDraft(), "ROMEO:", 8, k=0)
    with pytest.raises(ValueError, match="draft="):
        speculative_generate(target, "ngram", "ROMEO:", 8)
    with pytest.raises(ValueError, match="max_seq_len"):
        speculative_generate(target, NgramDraft(), "x" * 200, 60, k=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_generate(target, NgramDraft(), "ROMEO:", 0)
    with pytest.raises(ValueError, match="min_n=3 is larger"):
        NgramDraft(max_n=2, min_n=3)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        speculative_generate(target, ConstantDraft(4000), "ROMEO:", 8)
    small_vocab = Transformer(ModelConfig.preset("tiny"), rngs=nnx.Rngs(0), kernels="reference")
    with pytest.raises(ValueError, match="tokenizer"):
        speculative_generate(target, ModelDraft(small_vocab), "ROMEO:", 8)
    assert room_needed(10, 20, 4) == 33


# ----------------------------------------------------------------------------- the cost model
def test_expected_tokens_by_hand():
    assert cost_model.expected_tokens(0.5, 2) == pytest.approx(1.75)       # 1 + 0.5 + 0.25
    assert cost_model.expected_tokens(0.0, 5) == 1.0
    assert cost_model.expected_tokens(1.0, 5) == 6.0
    assert cost_model.expected_tokens(0.8, 4) == pytest.approx(1 + 0.8 + 0.64 + 0.512 + 0.4096)
    assert cost_model.acceptance_from_tokens(3.3616, 4) == pytest.approx(0.8, abs=1e-6)
    with pytest.raises(ValueError, match="acceptance"):
        cost_model.expected_tokens(1.5, 2)


def test_speedup_by_hand():
    # a = 0.5, k = 2: 1.75 tokens; verify 1.2 steps + 3 draft steps of 0.1: round 1.5 steps
    assert cost_model.speedup(0.5, 2, step_s=1.0, verify_s=1.2, draft_step_s=0.1) == pytest.approx(1.75 / 1.5)
    assert cost_model.speedup(0.5, 2, step_s=1.0, verify_s=1.0, draft_steps=0) == pytest.approx(1.75)
    assert cost_model.speedup(0.0, 4, step_s=1.0, verify_s=1.1) < 1        # a draft never right costs time


def test_rounds_without_a_guess_cost_a_plain_step():
    # a = 0.5, k = 2: 1.75 tokens a round; 0.2 unguessed rounds per token: 35% of rounds are plain steps
    full = cost_model.speedup(0.5, 2, step_s=1.0, verify_s=2.0, draft_steps=0)
    part = cost_model.speedup(0.5, 2, step_s=1.0, verify_s=2.0, draft_steps=0, unguessed=0.2, plain_verify_s=1.2)
    assert full == pytest.approx(1.75 / 2.0)
    assert part == pytest.approx(1.75 / (0.65 * 2.0 + 0.35 * 1.2))
    # every round unguessed (the share is capped at 1): a call-priced plain step per token
    assert cost_model.speedup(0.0, 4, step_s=1.0, verify_s=3.0, unguessed=1.0, plain_verify_s=1.25) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="plain_verify_s"):
        cost_model.speedup(0.5, 2, step_s=1.0, verify_s=2.0, unguessed=0.2)
    with pytest.raises(ValueError, match="unguessed"):
        cost_model.speedup(0.5, 2, step_s=1.0, verify_s=2.0, unguessed=1.5, plain_verify_s=1.0)


def test_prompt_lookups_rounds_without_a_match_keep_its_prediction_honest():
    """CI, 2026-12-05: n-gram at k = 6 predicted x0.62 (a verify of 7 tokens every round) and
    measured x1.01: FAILS. On that prompt 20 of 27 rounds had no match, and each was a one-token
    step, not a verify of 7. Fed the stored run's steps (plain 2.54 ms in its loop, a one-token call
    4.42 ms, a verify of 7 6.60 ms), acceptance 48% and 20 unguessed rounds in 47 tokens, the cost
    model predicts about plain decode's speed, as measured (x0.92 stored, x1.01 in CI); without
    the unguessed rounds it predicted a slow-down the run refutes."""
    from inference_lab.lessons import speculative_decoding as lesson

    verifies = [_verify(1, 1, 4.42e-3), _verify(1, 7, 6.60e-3)]
    blind = lesson.predicted_from_steps(verifies, 2.54e-3, 0.0, (6,), {"n-gram": 0.48})[("n-gram", 6)]
    seen = lesson.predicted_from_steps(verifies, 2.54e-3, 0.0, (6,), {"n-gram": 0.48},
                                       unguessed={"n-gram": 20 / 47})[("n-gram", 6)]
    assert blind == pytest.approx(0.73, abs=0.01) and seen == pytest.approx(1.0, abs=0.03)
    plain, run = _gen(None, 1.0), _gen("n-gram", 1.0 / 0.92, k=6, tps=1.74, acc=0.47)
    assert claims.speedup_as_predicted(plain, run, predicted=blind).holds is False
    assert claims.speedup_as_predicted(plain, run, predicted=seen).holds is None    # x1.00: nothing to test
    # a draft with no unguessed rounds is predicted as before
    assert lesson.predicted_from_steps(verifies, 2.54e-3, 0.0, (6,), {"n-gram": 0.48}, unguessed={}) == \
        lesson.predicted_from_steps(verifies, 2.54e-3, 0.0, (6,), {"n-gram": 0.48})


def test_the_verdicts_test_the_weaker_of_two_predictions():
    """Under one spinner and one stream (2026-12-05) prompt lookup at k = 6 was predicted x0.82
    from the steps timed first and x1.46 from those timed beside the generations (a one-token call
    7.72 ms, a verify of 7 tokens 7.43 ms), and ran at x0.98: tested against x1.46, the cost model
    FAILED for a busy spell; the weaker claim, x0.82, is too close to plain decode and is told
    from the roofline's x1.85 instead, which the run satisfies. A slow-down predicted by both
    timings still fails when the run is as fast as plain decode."""
    from inference_lab.lessons import speculative_decoding as lesson

    before = {("n-gram", 6): 0.82, ("x", 1): 0.5, ("y", 1): 2.0}
    tested = lesson.nearer_plain(before, {("n-gram", 6): 1.46, ("x", 1): 0.4, ("y", 1): 0.9})
    assert tested == {("n-gram", 6): 0.82, ("x", 1): 0.5, ("y", 1): 0.9}
    plain, run = _gen(None, 1.0), _gen("n-gram", 1 / 0.98, k=6, tps=1.74, acc=0.47)
    assert claims.speedup_as_predicted(plain, run, predicted=1.46).holds is False
    assert claims.speedup_as_predicted(plain, run, predicted=tested[("n-gram", 6)], roofline=1.85).holds
    never = _gen("never right", 1.0, tps=1.0, acc=0.0)
    assert claims.speedup_as_predicted(plain, never, predicted=tested[("x", 1)]).holds is False


def test_a_prediction_near_plain_decode_is_told_from_the_rooflines():
    """Prompt lookup predicted x0.86 from the measured steps, x1.47 from the roofline (08's stored
    run): too close to 1 for a speed-up or a slow-down, but the two predictions are far apart, so the
    run must fall on the measured steps' side of their log-midpoint (x1.12). A CPU without the
    fixed costs the roofline leaves out would run near x1.47, and fail."""
    plain = _gen(None, 1.0)
    near_steps, near_roof = _gen("n-gram", 1 / 0.76, k=1, tps=1.34, acc=0.34), _gen("n-gram", 1 / 1.40, k=1, tps=1.34, acc=0.34)
    v = claims.speedup_as_predicted(plain, near_steps, predicted=0.86, roofline=1.47)
    assert v.holds and "at most x1.12" in v.claim
    assert claims.speedup_as_predicted(plain, near_roof, predicted=0.86, roofline=1.47).holds is False
    # the roofline below the steps' prediction: the run must come out at least the midpoint
    assert claims.speedup_as_predicted(plain, near_roof, predicted=1.1, roofline=0.7).holds
    # the two predictions agree: nothing to tell apart
    assert claims.speedup_as_predicted(plain, near_steps, predicted=0.86, roofline=0.95).holds is None


def test_verify_cost_by_hand():
    cfg = ModelConfig.preset("shakespeare_large")
    assert costs.verify_cost(cfg, 2, 100, 1) == costs.decode_cost(cfg, 2, 100)
    v = costs.verify_cost(cfg, 2, 100, 5)
    d = costs.decode_cost(cfg, 2, 100)
    assert v.parts["weights"] == d.parts["weights"]                       # read once
    assert v.parts["matmul"] == pytest.approx(5 * d.parts["matmul"])
    keys = 5 * 100 + 5 * 6 / 2                                            # 101 + 102 + ... + 105
    assert v.parts["attention"] == pytest.approx(4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * keys * 2)


def test_speculation_pays_at_small_batch_and_stops_at_large():
    h100, cfg = hardware.PRESETS["H100_SXM"], ModelConfig.preset("llama3_8b")
    assert cost_model.verify_over_step(cfg, h100, 4) < 1.05               # bandwidth-bound: nearly free
    assert cost_model.predicted_speedup(0.7, 4, cfg, h100) > 2.5
    stop = cost_model.batch_where_it_stops_paying(0.7, 4, cfg, h100, context=1024)
    assert stop is not None and 32 <= stop <= 1024
    assert cost_model.verify_over_step(cfg, h100, 4, batch=stop, context=1024) > 2
    assert cost_model.best_k(0.9, cfg, h100) > cost_model.best_k(0.3, cfg, h100)
    assert cost_model.compute_bound_tokens(cfg, h100) == pytest.approx(h100.ridge_point("bf16"), rel=0.05)


# ----------------------------------------------------------------------------- claims on counter-data
def _verify(batch, tokens, seconds, spread=1.0):
    return VerifyRecord(preset="x", batch=batch, context=128, tokens=tokens, seconds=seconds, spread=spread,
                        flops=1.0, bytes=1.0)


def _gen(draft, seconds, *, k=4, tps=1.0, acc=None):
    return GenerationRecord(preset="x", draft=draft, k=k if draft else 0, batch=1, new_tokens=96, seconds=seconds,
                            spread=1.02, tokens_per_step=tps, acceptance=acc, tokens=(1, 2))


def test_verify_claim_fails_when_each_token_costs_a_step():
    assert claims.verify_costs_about_one_step([_verify(1, 1, 1.0), _verify(1, 5, 1.3)], 4, predicted=1.08).holds
    assert claims.verify_costs_about_one_step([_verify(1, 1, 1.0), _verify(1, 5, 4.8)], 4, predicted=1.08).holds is False
    noisy = [_verify(1, 1, 1.0, 3.0), _verify(1, 5, 2.4, 3.0)]
    assert claims.verify_costs_about_one_step(noisy, 4, predicted=1.08).holds is None


def _alone(m, seconds, spread=1.05):
    return KernelPoint(m=m, k=1000, n=1, dtype="float32", seconds=seconds, spread=spread)


def test_verify_claim_expects_what_the_matmuls_cost_here_and_still_fails_on_a_step_per_token():
    """CI's failing run (2026-12-02): a verify of 7 tokens x4.03 a one-token step, the roofline x1.12,
    the other test worker busy on the second core. Against the roofline alone it FAILS. The model's
    matmuls timed in the same rounds show what the extra rows cost this machine's kernels; expecting
    that, it is within the noise. A verify that costs a step per token still FAILS with the matmuls
    measured, and kernels that alone cost more than halfway to k + 1 steps leave it undecided."""
    ci = [_verify(1, 1, 8.469e-3, 1.43), _verify(1, 7, 34.139e-3, 1.43)]
    assert claims.verify_costs_about_one_step(ci, 6, predicted=1.12).holds is False
    busy_kernels = [_alone(1, 4.0e-3), _alone(7, 12.0e-3)]     # x3.0 at 7 rows: a step plus 8 ms
    verdict = claims.verify_costs_about_one_step(ci, 6, predicted=1.12, matmuls=busy_kernels)
    assert verdict.holds is None and "x3.00" in verdict.evidence and "x1.94 a step" in verdict.evidence
    quiet = [_verify(1, 1, 6.4e-3), _verify(1, 7, 14.1e-3)]
    assert claims.verify_costs_about_one_step(quiet, 6, predicted=1.12, matmuls=[_alone(1, 3.4e-3), _alone(7, 6.1e-3)]).holds
    per_token = [_verify(1, 1, 6.4e-3), _verify(1, 7, 6.5 * 6.4e-3)]
    assert claims.verify_costs_about_one_step(per_token, 6, predicted=1.12,
                                              matmuls=[_alone(1, 3.4e-3), _alone(7, 6.1e-3)]).holds is False
    no_room = claims.verify_costs_about_one_step(per_token, 6, predicted=1.12, matmuls=[_alone(1, 3e-3), _alone(7, 15e-3)])
    assert no_room.holds is None and "no room" in no_room.claim
    with pytest.raises(ValueError, match="7 rows"):
        claims.verify_costs_about_one_step(quiet, 6, predicted=1.12, matmuls=[_alone(1, 3.4e-3), _alone(5, 5e-3)])


def test_speedup_claim_fails_for_a_draft_never_right():
    plain = _gen(None, 1.0)
    assert claims.speedup_as_predicted(plain, _gen("n-gram", 0.5, tps=2.6, acc=0.7), predicted=2.4).holds
    never = _gen("n-gram", 1.15, tps=1.0, acc=0.0)
    assert claims.speedup_as_predicted(plain, never, predicted=2.4).holds is False
    assert claims.speedup_as_predicted(plain, never, predicted=1.1).holds is None
    # a predicted slow-down: holds when slower, fails when the "slow" draft was as fast as plain
    assert claims.speedup_as_predicted(plain, _gen("never right", 2.2, tps=1.0, acc=0.0), predicted=0.45).holds
    assert claims.speedup_as_predicted(plain, _gen("never right", 1.0, tps=1.0, acc=0.0), predicted=0.45).holds is False


def test_speedup_claim_allows_for_a_machine_that_moved_between_prediction_and_run():
    """The under-load run of issue 26's note: a predicted x0.50 slow-down measured x0.97, the
    repeats quiet. With the plain step as it was when the prediction was timed, the cost model is
    refuted; with the step 1.8x slower beside the run than when the prediction was made, the
    prediction is not for this run: CANNOT DECIDE, and the evidence says why."""
    plain, fast = _gen(None, 1.0), _gen("n-gram", 1.03, tps=1.6, acc=0.4)
    assert claims.speedup_as_predicted(plain, fast, predicted=0.50).holds is False
    assert claims.speedup_as_predicted(plain, fast, predicted=0.50, moved=1.1).holds is False
    moved = claims.drift(_gen(None, 0.0045), _gen(None, 0.0081))
    assert moved == pytest.approx(1.8) and moved == claims.drift(_gen(None, 0.0081), _gen(None, 0.0045))
    verdict = claims.speedup_as_predicted(plain, fast, predicted=0.50, moved=moved)
    assert verdict.holds is None and "x1.80 more: the prediction moved" in verdict.evidence
    # a real slow-down still holds on a machine that moved a little
    assert claims.speedup_as_predicted(plain, _gen("never right", 2.2, tps=1.0, acc=0.0), predicted=0.45,
                                       moved=1.1).holds
    with pytest.raises(ValueError, match="moved"):
        claims.speedup_as_predicted(plain, fast, predicted=0.50, moved=0.9)


def test_the_prediction_made_again_beside_the_run_sees_a_verify_that_slowed_alone():
    """This stop's first fresh-clone run (2026-12-02): n-gram k = 3 predicted x1.39 from the steps timed
    earlier, measured x0.81, the plain step only x1.13 off its first timing: FAILS. On a busy CPU a
    several-row verify slows more than the one-row step (section 2 of notebook 08); made again from
    the steps timed beside the generations, the prediction shows it, and the verdict cannot decide.
    A draft that really is slower than predicted still fails when the steps held still."""
    from inference_lab.lessons import speculative_decoding as lesson

    steps = types.SimpleNamespace(step_seconds=4.9e-3)
    before = [_verify(1, t, s) for t, s in ((1, 6.4e-3), (2, 5.6e-3), (4, 6.1e-3))]   # timed while quiet
    busy = [_verify(1, t, s) for t, s in ((1, 6.6e-3), (2, 9.5e-3), (4, 10.4e-3))]    # beside the run
    acceptance = {"n-gram": 0.44, "the target itself": 1.0}
    predicted = lesson.predicted_from_steps(before, steps.step_seconds, 0.0, (1, 3), acceptance)
    plain, run = _gen(None, 1.0), _gen("n-gram", 1.0 / 0.81, k=3, tps=1.57, acc=0.44)
    assert predicted[("n-gram", 3)] > 1.3
    assert claims.speedup_as_predicted(plain, run, predicted=predicted[("n-gram", 3)], moved=1.13).holds is False
    grid = lesson.Grid(plain=plain, runs={("n-gram", 3): run}, ks=(1, 3),
                       plain_step=types.SimpleNamespace(step_seconds=5.5e-3), verify_steps=busy)
    again = grid.predicted_beside(acceptance)
    moved = claims.drift(predicted[("n-gram", 3)], again[("n-gram", 3)])
    assert moved > 1.4
    verdict = claims.speedup_as_predicted(plain, run, predicted=predicted[("n-gram", 3)], moved=moved)
    assert verdict.holds is None and "the prediction moved" in verdict.evidence
    still = lesson.Grid(plain=plain, runs={("n-gram", 3): run}, ks=(1, 3), plain_step=steps, verify_steps=before)
    moved = claims.drift(predicted[("n-gram", 3)], still.predicted_beside(acceptance)[("n-gram", 3)])
    assert moved == pytest.approx(1.0)
    assert claims.speedup_as_predicted(plain, run, predicted=predicted[("n-gram", 3)], moved=moved).holds is False
    with pytest.raises(ValueError, match="draft_model="):
        grid.predicted_beside(dict(acceptance, shakespeare=0.6))     # its step was not timed beside
    text = lesson.drift_lines(grid, steps, predicted, again, [("n-gram", 3)])
    assert "4.90 ms when the predictions were made, 5.50 ms beside" in text and "x0.91 (moved x1.52)" in text


def test_batch_claim_fails_when_the_verify_cost_does_not_grow():
    grows = [_verify(1, 1, 1.0), _verify(1, 5, 1.2), _verify(16, 1, 2.0), _verify(16, 5, 7.0)]
    flat = [_verify(1, 1, 1.0), _verify(1, 5, 1.2), _verify(16, 1, 2.0), _verify(16, 5, 2.4)]
    kw = dict(predicted_small=1.08, predicted_large=4.0)
    assert claims.verification_stops_being_free(grows, 4, **kw).holds
    assert claims.verification_stops_being_free(flat, 4, **kw).holds is False
    assert claims.verification_stops_being_free(flat, 4, predicted_small=1.0, predicted_large=1.1).holds is None
    busy = [_verify(1, 1, 1.0), _verify(1, 5, 2.8), _verify(16, 1, 2.0), _verify(16, 5, 5.4)]
    assert claims.verification_stops_being_free(busy, 4, **kw).holds is None    # not free even at batch 1



def test_lesson_tables_readings_and_views():
    from inference_lab.lessons import speculative_decoding as lesson
    from inference_lab.plots import alt_text

    spec = hardware.PRESETS["H100_SXM"]
    cfg = ModelConfig.preset("shakespeare_large")
    ks = (1, 2, 4)
    verifies = [_verify(b, t, (1.0 + 0.1 * (t - 1)) * (1 if b == 1 else 1.5 + 0.3 * (t - 1)))
                for b in (1, 16) for t in (1, 2, 3, 5)]
    predicted_ratio = lesson.predicted_ratios(cfg, spec, ks)
    assert "extra GFLOP/s" in lesson.verify_table(verifies, predicted_ratio)
    assert "x1.40 a decode step" in lesson.verify_reading(verifies, predicted_ratio, 4, spec, "float32")
    alone = [_alone(m, 0.5 * (1 + 0.05 * (m - 1))) for m in (1, 2, 3, 5)]   # the steps: 1.0 s and 1.4 s
    table = lesson.verify_table(verifies, predicted_ratio, alone)
    assert "matmuls alone x" in table and table.splitlines()[-1].split()[4] == "1.20"   # 5 rows: x1.20
    reading = lesson.verify_reading(verifies, predicted_ratio, 4, spec, "float32", alone)
    assert "x1.20 as long at 5 rows" in reading and "25% of the verify's extra time" in reading
    fig, text = lesson.batch_view(verifies, cfg, spec, 4, 16)
    assert "batch 16" in text and "batch 16" in alt_text(fig)

    acceptance = {"n-gram": 0.8, "shakespeare": 0.5}
    predicted = lesson.predicted_from_steps(verifies, 0.8, 0.2, ks, acceptance)   # the loop's step 0.8 s
    assert predicted[("n-gram", 4)] == pytest.approx(cost_model.expected_tokens(0.8, 4) * 0.8 / 1.4)
    assert predicted[("shakespeare", 1)] == pytest.approx(cost_model.expected_tokens(0.5, 1) * 0.8 / (1.1 + 2 * 0.2))
    # a draft model writes its k + 1 steps in one compiled call: one step at the call's rate, k at its loop's
    looped = lesson.predicted_from_steps(verifies, 0.8, 0.2, ks, acceptance, draft_loop_s=0.05)
    assert looped[("shakespeare", 4)] == pytest.approx(cost_model.expected_tokens(0.5, 4) * 0.8 / (1.4 + 0.2 + 4 * 0.05))
    assert looped[("n-gram", 4)] == predicted[("n-gram", 4)]    # prompt lookup has no device work either way
    assert lesson.best_predicted(predicted, "n-gram") == 4
    roof = lesson.predicted_speedups(cfg, ModelConfig.preset("shakespeare"), spec, ks, acceptance)
    assert "x" in lesson.prediction_table(ks, acceptance, predicted, roof)

    plain = _gen(None, 1.0)
    runs = {(n, k): _gen(n, 1.0 / (1 + 0.2 * k), k=k, tps=1 + 0.5 * k, acc=0.6) for n in acceptance for k in ks}
    grid = lesson.Grid(plain=plain, runs=runs, ks=ks)
    assert grid.speedup("n-gram", 4) == pytest.approx(1.8)
    fig, text = lesson.speedup_view(grid, predicted, "n-gram", 2)
    assert "k = 2" in text and "n-gram" in alt_text(fig)
    reading = lesson.speedup_reading(grid, verifies, 0.8, predicted, roof, "n-gram", 4)
    assert "measured x1.80" in reading and "leaves out" not in reading       # said once, not per draft
    assert "1400.00 ms of it the target's step (a verify of 5 tokens)" in reading
    # 0.1 rounds with no guess per token, 3 tokens a round: 30% of the rounds a one-token step of 1 s
    idle = lesson.speedup_reading(grid, verifies, 0.8, predicted, roof, "n-gram", 4, unguessed={"n-gram": 0.1})
    assert "1280.00 ms of it the target's step (about 30% of the rounds had nothing to guess" in idle
    assert "as a call of its own costs 1000.00 ms" in lesson.roofline_leaves_out(verifies, 0.8)
    assert "stops paying at batch" in lesson.where_it_stops_paying(0.8, 4, spec)
    step = types.SimpleNamespace(step_seconds=2e-3, bytes_per_step=50e6, mbu=0.81)
    assert lesson.streaming_line(step) == ("its batch-1 decode step: 2.00 ms for 50.0 MB, 25.0 GB/s, "
                                           "MBU 81% of the read ceiling")


def test_verify_and_check_guesses_refuse_bad_input(target):
    cache = KVCache.create(target.cfg, 2, 16)
    with pytest.raises(ValueError, match="batch 1 but the cache holds 2"):
        generation.verify(target, np.zeros((1, 3), np.int32), cache)
    with pytest.raises(ValueError, match="past max_len"):
        generation.verify(target, np.zeros((2, 17), np.int32), cache)
    with pytest.raises(ValueError, match="active must be"):
        generation.check_guesses(target, np.zeros((2, 3), np.int32), cache, active=[1, 0])
    assert not cache.consumed                                            # refused before anything ran


def test_verify_through_the_interpreted_pallas_kernels_equals_the_reference():
    """verify_attention's one decode-attention call over B x T rows, in the Pallas kernels' mode.
    A small random model (the same seed, so the same weights, both ways): the interpreter's cost
    grows with the model, and which weights the kernels multiply does not matter here."""
    cfg = dataclasses.replace(ModelConfig.preset("shakespeare"), name="small-random", n_layers=2, d_model=64,
                              n_heads=4, n_kv_heads=2, d_ff=128)
    interp = Transformer(cfg, rngs=nnx.Rngs(5), kernels="interpret")
    ref = Transformer(cfg, rngs=nnx.Rngs(5), kernels="reference")
    rows = [tokenizer.encode("ROMEO:"), tokenizer.encode("JULIET:\nO")]
    tokens, lengths = generation.padded(rows)
    feed = np.array([[10, 32, 116], [97, 110, 100]], np.int32)
    out = []
    for m in (interp, ref):
        _, cache = generation.prefill(m, tokens, KVCache.create(m.cfg, 2, 32), lengths)
        logits, _ = generation.verify(m, feed, cache)
        out.append(np.asarray(logits))
    np.testing.assert_allclose(out[0], out[1], rtol=1e-4, atol=1e-4)
