"""``--target-itl-ms``: a token budget chosen every iteration to hold an inter-token latency target.

A fixed budget (``--max-num-batched-tokens``) is one trade for all moments: large, and the steps
that carry prompt chunks beside decode rows stretch every running stream's gap; small, and
prompts are prefilled in many expensive little steps even when nobody is waiting for a token.
The gap a decoding request sees is the time of the step that produced its token, and the engine
knows what its steps cost: it timed every compiled shape at warm-up
(:meth:`~inference_lab.serving.slots.DecodeSlots.time_shapes`). So each iteration:

* with decode rows, the budget is the rows plus the **largest** compiled chunk-token count whose
  step is predicted to fit the target (at least the smallest, so prompts always move);
* with no decode rows, nobody is between two tokens: the budget is the largest the engine compiled
  (prefill as fast as the machine allows).

The prediction is corrected by what the steps really take while serving: :meth:`ItlBudget.observe`
keeps the ratios of measured to predicted time of the recent steps (a busy machine, host time
between steps, a client sharing the cores), and the choice divides the target by a high quantile
of them, :data:`QUANTILE`: the target is for the slow steps, since a p99 latency is made of them.
What it cannot see coming (a stall longer than any recent one) is the tail this mode still shows.
"""

from __future__ import annotations

import collections
import math

from inference_lab.serving.scheduler import token_counts

SLO_BUDGET = 256     # the largest budget a target may choose, unless max_num_batched_tokens says
RECENT = 200         # steps whose measured/predicted ratios the correction reads
QUANTILE = 0.95      # ... and the one it divides the target by: slow steps make the tail
SETTLE = 20          # steps seen before the correction is trusted (until then: the prediction alone)


def check_target(target_itl_ms) -> float:
    """``target_itl_ms`` as a float, or a one-line error naming it."""
    if isinstance(target_itl_ms, bool) or not isinstance(target_itl_ms, (int, float)) \
            or not math.isfinite(target_itl_ms) or target_itl_ms <= 0:
        raise ValueError(f"target_itl_ms={target_itl_ms!r} must be a positive number of milliseconds")
    return float(target_itl_ms)


class ItlBudget:
    """Per-iteration budgets for ``target_s`` seconds between tokens, from ``costs`` ({(decode width,
    chunk tokens): seconds}, every shape of a chunked engine with ``n_slots`` slots and budget
    ``most``)."""

    def __init__(self, target_s: float, costs: dict, *, n_slots: int, most: int):
        self.target_s, self.n_slots, self.most = check_target(target_s * 1e3) / 1e3, n_slots, most
        self.mixed = {t: costs[(n_slots, t)] for t in token_counts(most)}
        self.ratios: collections.deque[float] = collections.deque(maxlen=RECENT)

    @property
    def ratio(self) -> float:
        """What the slow recent steps took over their prediction (1 until :data:`SETTLE` were seen)."""
        if len(self.ratios) < SETTLE:
            return 1.0
        ordered = sorted(self.ratios)
        return ordered[min(int(QUANTILE * len(ordered)), len(ordered) - 1)]

    def budget(self, decode_rows: int) -> int:
        """The token budget of an iteration with ``decode_rows`` decoding requests."""
        if decode_rows == 0:
            return self.most
        limit = self.target_s / self.ratio
        fits = [t for t, s in self.mixed.items() if s <= limit]
        return decode_rows + (max(fits) if fits else min(self.mixed))

    def observe(self, predicted_s: float | None, measured_s: float) -> None:
        """One step's predicted and measured seconds."""
        if predicted_s and measured_s > 0:
            self.ratios.append(min(max(measured_s / predicted_s, 0.25), 4.0))   # a stall is one sample, bounded
