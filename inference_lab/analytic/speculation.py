"""The cost model of speculative decoding: how many tokens a round makes, what it costs, the best
number of guesses, and the batch at which guessing stops paying.

A round (:mod:`inference_lab.runtime.speculative`) makes the draft guess ``k`` tokens and the
target check them in one verify step. If each guess is right with probability ``a`` given that
the ones before it were, the round keeps guess ``j`` with probability ``a^j`` and always makes
one token of the target's own, so it makes on average

    E[tokens] = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a)        (k + 1 when a = 1)

tokens for one verify step plus the draft's work. Plain decode makes one token per step, so

    speed-up = E[tokens] x step time / (verify time + draft time).

A draft that sometimes has nothing to guess (prompt lookup finding no earlier match) makes those
rounds plain one-token steps: one token for a step's time, no verify of ``k + 1``. Where the text
has no match does not depend on ``k``, so the model carries it as ``u``, such rounds per token
written: a share ``min(1, u x E[tokens])`` of the rounds costs a one-token step instead.

The verify step of ``k + 1`` tokens reads the weights once, as a decode step does. While a step
is bound by those bytes its time barely grows with ``k``: on the roofline it stays flat until the
``batch x (k + 1)`` tokens' FLOPs take as long as the weights' bytes (:func:`compute_bound_tokens`,
the ridge point in tokens: about ``2 x`` the ridge in FLOP/byte for float32 weights, the ridge
itself for bf16). That is also why it stops paying at a large batch: batching spends the same
idle compute (notebook 05's knee). Once ``batch`` tokens a step fill the compute, ``k + 1`` times
as many cost about ``k + 1`` times the time, and every rejected guess is work thrown away.

Every time here is a roofline time (:mod:`inference_lab.analytic.roofline`) unless a measured
one is passed in: predictions first, measurements after.
"""

from __future__ import annotations

import math

from inference_lab.analytic import roofline
from inference_lab.analytic.costs import decode_cost, verify_cost
from inference_lab.base import checks


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens one round makes on average: ``(1 - a^(k+1)) / (1 - a)`` (``k + 1`` at ``a = 1``)."""
    a = _rate(acceptance)
    k = checks.count("k", k)
    if a == 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def acceptance_from_tokens(tokens_per_step: float, k: int) -> float:
    """The acceptance rate ``a`` at which a round of ``k`` guesses makes ``tokens_per_step`` tokens
    on average (:func:`expected_tokens` inverted, by bisection): read a measured run as a rate."""
    k = checks.count("k", k)
    if not 1.0 <= tokens_per_step <= k + 1:
        raise ValueError(f"tokens_per_step={tokens_per_step!r} must be in 1..k+1={k + 1}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < tokens_per_step else (lo, mid)
    return (lo + hi) / 2


def speedup(acceptance: float, k: int, *, step_s: float, verify_s: float, draft_step_s: float = 0.0,
            draft_steps: int | None = None, unguessed: float = 0.0, plain_verify_s: float | None = None) -> float:
    """Tokens per second with speculation over plain decode's: ``E[tokens] x step / round``. A
    round is one verify plus ``draft_steps`` draft steps (default ``k + 1``: the lab's draft model
    also reads its last guess; 0 for a draft with no device work, pass ``draft_step_s=0``).
    ``unguessed``: rounds with nothing guessed per token written (``u`` in the module docstring;
    0 for a draft that always guesses); each costs ``plain_verify_s``, a one-token target step."""
    for name, value in (("step_s", step_s), ("verify_s", verify_s)):
        checks.positive(name, value)
    if not draft_step_s >= 0:
        raise ValueError(f"draft_step_s={draft_step_s!r} must be seconds >= 0")
    if not 0.0 <= unguessed <= 1.0:
        raise ValueError(f"unguessed={unguessed!r} must be rounds per token in 0..1 (a round writes a token or more)")
    if unguessed and plain_verify_s is None:
        raise ValueError("unguessed > 0 needs plain_verify_s: the seconds of a one-token target step")
    draft_steps = k + 1 if draft_steps is None else draft_steps
    tokens = expected_tokens(acceptance, k)
    idle = min(1.0, unguessed * tokens)     # the share of rounds with nothing to verify
    round_s = (1.0 - idle) * (verify_s + draft_steps * draft_step_s) + (idle * plain_verify_s if idle else 0.0)
    return tokens * step_s / round_s


def predicted_step_seconds(cfg, spec, *, batch: int = 1, context: int = 128, tokens: int = 1,
                           cache_once: bool = False) -> float:
    """Roofline time of a verify step of ``tokens`` tokens per row (1: a decode step), the
    fixed cost of a call included (``spec.overhead_s``, measured on a CPU). ``cache_once``: the
    verify reads the KV cache once, as a production kernel does (:func:`~costs.verify_cost`)."""
    return roofline.predict_time(verify_cost(cfg, batch, context, tokens, cache_once=cache_once), spec,
                                 roofline.flop_dtype(cfg), overhead=True)


def predicted_speedup(acceptance: float, k: int, target_cfg, spec, *, batch: int = 1, context: int = 128,
                      draft_cfg=None, cache_once: bool = False, unguessed: float = 0.0) -> float:
    """:func:`speedup` with every time from the roofline: the target's decode and verify steps at
    ``batch`` and ``context``, and the draft model's decode step (``draft_cfg=None``: a draft with
    no device work, such as prompt lookup; ``unguessed`` as :func:`speedup` takes it)."""
    step = predicted_step_seconds(target_cfg, spec, batch=batch, context=context)
    verify = predicted_step_seconds(target_cfg, spec, batch=batch, context=context, tokens=k + 1,
                                    cache_once=cache_once)
    draft = 0.0 if draft_cfg is None else predicted_step_seconds(draft_cfg, spec, batch=batch, context=context)
    return speedup(acceptance, k, step_s=step, verify_s=verify, draft_step_s=draft, unguessed=unguessed,
                   plain_verify_s=step)


def best_k(acceptance: float, target_cfg, spec, *, ks=range(1, 9), **kwargs) -> int:
    """The ``k`` of ``ks`` with the highest :func:`predicted_speedup` (keyword arguments as there)."""
    return max(ks, key=lambda k: predicted_speedup(acceptance, k, target_cfg, spec, **kwargs))


def verify_over_step(cfg, spec, k: int, *, batch: int = 1, context: int = 128) -> float:
    """How many decode steps' time a verify of ``k + 1`` tokens costs, on the roofline."""
    return (predicted_step_seconds(cfg, spec, batch=batch, context=context, tokens=k + 1)
            / predicted_step_seconds(cfg, spec, batch=batch, context=context))


LARGEST_BATCH = 4096   # how far batch_where_it_stops_paying looks


def batch_where_it_stops_paying(acceptance: float, k: int, target_cfg, spec, *, context: int = 128,
                                draft_cfg=None, cache_once: bool = False, largest: int = LARGEST_BATCH):
    """The smallest batch at which the predicted speed-up falls below 1 (None: it pays at every
    batch up to ``largest``). At a small batch the step is bound by the weights' bytes and
    checking ``k`` guesses is nearly free; once the batch's tokens fill the compute, every verified
    token costs its FLOPs. The speed-up only falls as the batch grows, so a bisection finds it."""
    def loses(b):
        return predicted_speedup(acceptance, k, target_cfg, spec, batch=b, context=context,
                                 draft_cfg=draft_cfg, cache_once=cache_once) < 1.0

    if loses(1):
        return 1
    if not loses(largest):
        return None
    lo, hi = 1, largest                 # pays at lo, loses at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if loses(mid) else (mid, hi)
    return hi


def stops_paying_estimate(acceptance: float, k: int, cfg, spec) -> float:
    """The batch where speculation stops paying, by hand: with a short context and a draft that
    costs nothing, a verify of ``k + 1`` tokens per row costs ``B (k + 1) / R`` decode steps once
    that exceeds 1 (``R``: :func:`compute_bound_tokens`, the ridge in tokens), and the round writes
    ``E = expected_tokens(a, k)``; it stops paying where the two meet, ``B = R x E / (k + 1)``."""
    return compute_bound_tokens(cfg, spec) * expected_tokens(acceptance, k) / (k + 1)


def compute_bound_tokens(cfg, spec) -> float:
    """Tokens per step (batch x (k + 1)) at which a step's matmul FLOPs take as long as reading its
    weights: the ridge point in tokens. Below it extra tokens are nearly free."""
    step = decode_cost(cfg, 1, 1)
    per_token = step.parts["matmul"] / spec.peak_flops(roofline.flop_dtype(cfg))
    return (step.parts["weights"] / spec.bandwidth) / per_token


def _rate(a) -> float:
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 <= a <= 1.0 or math.isnan(a):
        raise ValueError(f"acceptance={a!r} must be a rate in 0..1")
    return float(a)
