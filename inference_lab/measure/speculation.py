"""Timing speculative decoding: the verify step against a decode step, and whole generations with
and without guesses. Both go through the measuring core (:func:`timing.measure_points`: warm-up,
``block_until_ready``, medians, points side by side), so a burst of load bends every point alike.

- :class:`VerifyPoint`: one verify step of ``tokens`` tokens per row after ``context`` cached ones
  (``tokens=1`` is a decode step) as speculative decoding runs it (:func:`generation.check_guesses`),
  from a cache of random keys and values rewound between runs. Its record says how many decode steps' time the check of ``tokens - 1``
  guesses costs.
- :class:`GenerationPoint`: ``max_new_tokens`` greedy tokens for a batch of prompts, by plain
  :func:`generation.generate` (``draft=None``) or by :func:`speculative.speculative_generate` with a
  draft and ``k``. Its record keeps the run's acceptance rate and tokens per target step, and
  whether its text was the plain run's.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from inference_lab.analytic import roofline
from inference_lab.analytic.costs import verify_cost
from inference_lab.base import checks
from inference_lab.measure.timing import measure_points, random_tokens
from inference_lab.model.kv_cache import KVCache
from inference_lab.runtime import generation, speculative
from pallas_kernels.timing import timed_call


@dataclasses.dataclass(frozen=True)
class VerifyRecord:
    """One verify step, timed: ``tokens`` per row (1 = a decode step) at ``context``."""

    preset: str
    batch: int
    context: int
    tokens: int
    seconds: float
    spread: float
    flops: float
    bytes: float


@dataclasses.dataclass(frozen=True)
class GenerationRecord:
    """One generation, timed. ``draft`` is None for plain decode (then ``k`` is 0)."""

    preset: str
    draft: str | None
    k: int
    batch: int
    new_tokens: int            # per row
    seconds: float             # the whole call: prefill, every round, the text to the host
    spread: float
    tokens_per_step: float     # new tokens per target step (1.0 for plain decode)
    acceptance: float | None   # guesses kept / guesses checked
    tokens: tuple              # the first row's new ids (to compare runs)

    @property
    def tokens_per_s(self) -> float:
        return self.batch * self.new_tokens / self.seconds


class VerifyPoint:
    """A verify step (``generation.check_guesses``) of ``tokens`` random tokens per row of ``batch``,
    ``context`` cached."""

    phase = "verify"
    dtype = None   # no MFU/MBU on the record: it is compared with a decode step's time

    def __init__(self, model, batch: int = 1, context: int = 128, tokens: int = 1, *, max_len: int | None = None,
                 seed: int = 0):
        self.model, self.seed = model, seed
        self.batch, self.size = checks.count("batch", batch), checks.count("context", context)
        self.tokens = checks.count("tokens", tokens)
        # One cache shape for every point (by default the model's whole context, as the
        # generations use): one compiled program per ``tokens``.
        self.max_len = model.cfg.max_seq_len if max_len is None else checks.count("max_len", max_len)
        if self.size + self.tokens > min(self.max_len, model.cfg.max_seq_len):
            raise ValueError(f"context={self.size} + tokens={self.tokens} is past max_len={self.max_len} or the "
                             f"model's max_seq_len={model.cfg.max_seq_len}")
        self.cache = self.feed = None

    @property
    def label(self) -> str:
        return f"verify {self.tokens} tokens, batch {self.batch}, context {self.size}"

    def memory_needed(self) -> int:
        return roofline.memory_needed(self.model.cfg, self.batch, self.max_len)

    def prepare(self) -> None:
        self.cache = KVCache.random(self.model.cfg, self.batch, self.max_len, self.size, self.seed)
        self.feed = random_tokens(self.model.cfg, (self.batch, self.tokens), self.seed + 1)

    def run(self) -> float:
        jax.block_until_ready(self.cache.k)
        seconds, (_, cache) = timed_call(self._verify, self.cache)
        self.cache = cache.rewound(self.size)
        return seconds

    def _verify(self, cache):
        # What a round of speculative decoding pays for its target step: generation.check_guesses (the
        # forward of ``tokens`` tokens, the argmax, the rollback and the copy of the checked tokens
        # to the host), the program the generations run, so the two share their compiled code.
        chosen, _, cache = generation.check_guesses(self.model, self.feed, cache)
        return chosen, cache

    def release(self) -> None:
        self.cache = self.feed = None

    def record(self, samples, spec) -> VerifyRecord:
        cost = verify_cost(self.model.cfg, self.batch, self.size, self.tokens)
        return VerifyRecord(preset=self.model.cfg.name, batch=self.batch, context=self.size, tokens=self.tokens,
                            seconds=samples.median, spread=samples.spread, flops=cost.flops, bytes=cost.bytes)


class GenerationPoint:
    """``max_new_tokens`` greedy tokens for ``prompts`` (token-id rows), plain or speculative."""

    phase = "generate"
    dtype = None

    def __init__(self, target, prompts, max_new_tokens: int, *, draft=None, k: int = 0):
        self.target, self.draft, self.k = target, draft, int(k)
        self.prompts = [list(p) for p in prompts]
        self.batch, self.size = len(self.prompts), max(len(p) for p in self.prompts)
        self.max_new = checks.count("max_new_tokens", max_new_tokens)
        self.result = None

    @property
    def label(self) -> str:
        how = "plain decode" if self.draft is None else f"{self.draft.name}, k={self.k}"
        return f"generate {self.max_new} tokens x {self.batch}: {how}"

    def memory_needed(self) -> int:
        return roofline.memory_needed(self.target.cfg, self.batch, self.target.cfg.max_seq_len)

    def prepare(self) -> None:
        pass

    def run(self) -> float:
        seconds, self.result = timed_call(self._generate)
        return seconds

    def _generate(self):
        if self.draft is None:
            return generation.generate(self.target, self.prompts, self.max_new)
        return speculative.speculative_generate(self.target, self.draft, self.prompts, self.max_new, k=self.k)

    def release(self) -> None:
        pass

    def record(self, samples, spec) -> GenerationRecord:
        plain = self.draft is None
        first = self.result[0] if plain else self.result.tokens[0]
        return GenerationRecord(
            preset=self.target.cfg.name, draft=None if plain else self.draft.name, k=self.k, batch=self.batch,
            new_tokens=self.max_new, seconds=samples.median, spread=samples.spread,
            tokens_per_step=1.0 if plain else self.result.tokens_per_step,
            acceptance=None if plain else self.result.acceptance_rate, tokens=tuple(int(t) for t in first))


def verify_sweep(model, tokens=(1, 2, 3, 5, 7), *, batches=(1,), context: int = 128, max_len: int | None = None,
                 beside=(), repeats: int | None = None, progress: bool = True) -> list:
    """:class:`VerifyPoint` at every (batch, tokens), side by side. Records in that order, then the
    records of ``beside``, points timed in the same rounds (the model's matmuls alone, say)."""
    points = [VerifyPoint(model, b, context, t, max_len=max_len, seed=i) for i, (b, t) in
              enumerate((b, t) for b in batches for t in tokens)]
    return list(measure_points(points + list(beside), repeats=repeats, ceilings=None, progress=progress,
                               desc="verify steps"))


def generation_sweep(target, prompts, max_new_tokens: int, configs, *, beside=(), repeats: int | None = 3,
                     progress: bool = True) -> list:
    """Plain decode and each ``(draft, k)`` of ``configs`` on the same prompts, side by side.
    The first record is plain decode; the rest follow ``configs``; then the records of
    ``beside``, points timed in the same rounds (a decode step a prediction rests on, say)."""
    points = [GenerationPoint(target, prompts, max_new_tokens)]
    points += [GenerationPoint(target, prompts, max_new_tokens, draft=d, k=k) for d, k in configs]
    return list(measure_points(points + list(beside), repeats=repeats, ceilings=None, progress=progress,
                               desc="generations"))


def same_text(records) -> bool:
    """Every record wrote the first record's tokens (speculation changes speed, never text)."""
    return all(np.array_equal(r.tokens, records[0].tokens) for r in records)
