"""Speculative decoding: guess a few tokens cheaply, check them all in one step of the model,
keep the longest correct prefix. Greedy; a batch of rows that each accept a different number.

    from inference_lab.runtime.speculative import ModelDraft, NgramDraft, speculative_generate
    out = speculative_generate(target, NgramDraft(), "ROMEO:", 200, k=4)
    out.text, out.acceptance_rate, out.tokens_per_step

Why it pays: a batch-1 decode step is bound by reading the weights (notebook 03), so a step
that processes a few tokens per row costs about what a step of one does. One round, per row:

1. the draft proposes ``k`` guesses ``g1..gk`` to follow the last token emitted, ``x``;
2. the target runs ``x, g1..gk`` in one step (:func:`generation.check_guesses`, built on
   :func:`generation.verify`: ``k + 1`` tokens at the cache's position); its argmax at position ``j``
   is what a decode step fed ``x, g1..gj`` would have chosen;
3. the row keeps its guesses while they equal those argmaxes (``n`` of them) and then one
   token more, the target's own choice after the last kept guess (a correction, or a bonus when
   all ``k`` were right): ``n + 1`` tokens for one target step;
4. the target's cache is left holding ``x, g1..gn`` (its lengths are set in the same step) and the
   draft's is rewound to match (:meth:`KVCache.rewound`): what the rejected guesses wrote is
   overwritten by later rounds, never recomputed.

Every token emitted is the target's argmax given the tokens before it, so the text is the
target's own greedy text, whatever the draft guessed: a bad draft costs speed, never words. (A
``k + 1``-token matmul may round a logit differently in the last bit from a 1-token one; only a
tie within rounding could then go the other way.)

Two drafts. :class:`NgramDraft` is prompt lookup (vLLM's ``ngram`` method): it needs no model
and no device work, and guesses well wherever the text repeats itself (a quoted passage, code,
a greedy model's loops). :class:`ModelDraft` runs a smaller model's greedy decode: better on new
text, at the price of its own steps. Each round the draft model also reads its last guess, so
that its cache keeps pace with the target's (``k + 1`` draft steps in one jitted loop; engines
such as vLLM run ``k`` and catch the cache up in the next round).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from inference_lab.base import tokenizer
from inference_lab.model.kv_cache import KVCache
from inference_lab.runtime import generation


# ----------------------------------------------------------------------------- drafts
class NgramDraft:
    """Prompt lookup: find the latest earlier place where a row's last ``n`` tokens occurred (in
    its prompt or its text so far; ``n`` from ``max_n`` down to ``min_n``) and guess the tokens
    that followed there. A row with no match guesses nothing that round."""

    name = "n-gram"

    def __init__(self, max_n: int = 4, min_n: int = 2):
        for arg, value in (("max_n", max_n), ("min_n", min_n)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{arg}={value!r} must be a positive integer")
        if min_n > max_n:
            raise ValueError(f"min_n={min_n} is larger than max_n={max_n}; use min_n <= max_n")
        self.max_n, self.min_n = int(max_n), int(min_n)

    def start(self, tokens, lengths, max_len: int) -> None:
        """Nothing to prepare: the guesses come from the text alone."""

    def guess_row(self, history: list, k: int) -> list:
        """Up to ``k`` tokens that followed the latest earlier match of the row's last n-gram."""
        seq = np.asarray(history)
        for n in range(min(self.max_n, len(seq) - 1), self.min_n - 1, -1):
            tail = seq[-n:]
            # every start i < len - n where seq[i:i+n] == tail, latest first
            windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
            hits = np.flatnonzero((windows == tail).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return seq[start:start + k].tolist()
        return []

    def propose(self, histories: list, last: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Guesses [B, k] and how many of them each row really has (the rest repeat the row's last
        token: a filler that is checked like any guess, and so cannot change the text)."""
        guesses = np.repeat(np.asarray(last, np.int32)[:, None], k, axis=1)
        real = np.zeros(len(histories), np.int32)
        for r, history in enumerate(histories):
            found = self.guess_row(history, k)
            guesses[r, : len(found)] = found
            real[r] = len(found)
        return guesses, real

    def keep(self, lengths) -> None:
        """Nothing to rewind."""


class ModelDraft:
    """A smaller model's greedy guesses (it must share the target's tokenizer: here every model
    reads bytes). Its KV cache holds exactly the target's tokens at every round's start."""

    def __init__(self, model):
        self.model = model
        self.name = f"draft model ({model.cfg.name})"
        self.cache = None

    def start(self, tokens, lengths, max_len: int) -> None:
        """Prefill the prompts into the draft's own cache."""
        cache = KVCache.create(self.model.cfg, tokens.shape[0], max_len)
        _, self.cache = generation.prefill(self.model, tokens, cache, lengths)

    def propose(self, histories: list, last: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``k`` greedy guesses per row (read from ``k + 1`` steps: the last only fills the cache)."""
        out, self.cache = generation.decode_loop(self.model, jnp.asarray(last, jnp.int32), self.cache, k + 1)
        return np.asarray(out)[:, :k], np.full(len(histories), k, np.int32)

    def keep(self, lengths) -> None:
        """Rewind to the tokens the target kept."""
        self.cache = self.cache.rewound(lengths)


class ConstantDraft:
    """Guesses the same token every time. With ``PAD`` (the default), which a model trained on
    text never writes, it is never right: the floor of the cost model (acceptance 0), one token
    per verify step. For lessons and tests."""

    def __init__(self, token: int = tokenizer.PAD):
        if not isinstance(token, (int, np.integer)) or isinstance(token, bool) or token < 0:
            raise ValueError(f"token={token!r} must be a token id (an integer >= 0)")
        self.token = int(token)
        self.name = "never right" if self.token == tokenizer.PAD else f"always {self.token}"

    def start(self, tokens, lengths, max_len: int) -> None:
        """Nothing to prepare."""

    def propose(self, histories: list, last: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``k`` copies of the token per row."""
        return np.full((len(histories), k), self.token, np.int32), np.full(len(histories), k, np.int32)

    def keep(self, lengths) -> None:
        """Nothing to rewind."""


DRAFTS = (NgramDraft, ModelDraft, ConstantDraft)


# ----------------------------------------------------------------------------- the loop
@dataclasses.dataclass(frozen=True)
class SpeculativeResult:
    """What :func:`speculative_generate` wrote and how its guesses fared.

    ``tokens``: ``max_new_tokens`` new ids per row (``text``: decoded, for text prompts).
    ``target_steps``: rounds each row took part in (one target forward each, after the prefill).
    ``round_tokens``: per row, how many tokens each round wrote (the prefill's one first).
    ``checked``: guesses per row compared up to and including the first wrong one (a guess the
    draft could not make, such as prompt lookup finding no match, counts as wrong); ``accepted``:
    guesses kept. Their ratio is the acceptance rate ``a`` of the cost model (the chance that a
    guess is right given the ones before it were). ``unguessed``: per row, the rounds in which the
    draft had nothing to guess (prompt lookup finding no match); when no row has a guess, the
    round's target step is a plain one-token step, far cheaper than a verify of ``k + 1``.
    """

    tokens: list
    text: list | None
    k: int
    draft: str
    target_steps: np.ndarray
    checked: np.ndarray
    accepted: np.ndarray
    round_tokens: list         # per row: tokens each round wrote (the prefill's one first)
    unguessed: np.ndarray      # per row: rounds in which the draft guessed nothing

    @property
    def acceptance_rate(self) -> float:
        return float(self.accepted.sum() / self.checked.sum()) if self.checked.sum() else 0.0

    @property
    def tokens_per_step(self) -> float:
        """New tokens per target step, the first token (from the prefill) not counted."""
        made = sum(len(t) - 1 for t in self.tokens)
        return made / float(self.target_steps.sum()) if self.target_steps.sum() else 1.0

    @property
    def unguessed_per_token(self) -> float:
        """Rounds with nothing guessed per new token (the prefill's first not counted): where in
        a text prompt lookup finds no match, whatever ``k``, so a rate the cost model can carry
        from one ``k`` to another (:func:`inference_lab.analytic.speculation.speedup`)."""
        made = sum(len(t) - 1 for t in self.tokens)
        return float(self.unguessed.sum()) / made if made else 0.0


def room_needed(longest_prompt: int, max_new_tokens: int, k: int) -> int:
    """Cache positions a run needs: an unfinished row holds at most ``prompt + max_new - 2``
    tokens and a round writes ``k + 1`` more past them (finished rows stop advancing)."""
    return longest_prompt + max_new_tokens + k - 1


def speculative_generate(target, draft, prompts, max_new_tokens: int = 16, *, k: int = 4) -> SpeculativeResult:
    """Greedy decoding of ``target`` with ``k`` guesses per round from ``draft`` (an
    :class:`NgramDraft`, a :class:`ModelDraft` or a :class:`ConstantDraft`); ``prompts`` as
    :func:`generation.generate` takes them. The tokens equal ``generation.generate(target, prompts,
    max_new_tokens)``'s; the result says how many target steps they took."""
    if not isinstance(draft, DRAFTS):
        raise ValueError(f"draft={draft!r} must be an NgramDraft(), a ModelDraft(model) or a ConstantDraft()")
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= 16:
        raise ValueError(f"k={k!r} must be an integer in 1..16 (guesses per round)")
    if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be a positive integer")
    if isinstance(draft, ConstantDraft) and draft.token >= target.cfg.vocab_size:
        raise ValueError(f"ConstantDraft(token={draft.token}) is outside the vocabulary 0..{target.cfg.vocab_size - 1}")
    rows, as_text, _ = generation.prompt_rows(prompts, target.cfg.vocab_size)
    models = [target] + ([draft.model] if isinstance(draft, ModelDraft) else [])
    if isinstance(draft, ModelDraft) and draft.model.cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError(f"the draft's vocabulary ({draft.model.cfg.vocab_size}) is not the target's "
                         f"({target.cfg.vocab_size}); a draft must share the target's tokenizer")
    need = room_needed(max(len(r) for r in rows), int(max_new_tokens), int(k))
    # The caches span the models' whole context whatever the run needs: one cache shape, so runs
    # with another k or prompt reuse the compiled prefill and steps.
    max_len = min(m.cfg.max_seq_len for m in models)
    if need > max_len:
        raise ValueError(f"the longest prompt + max_new_tokens={max_new_tokens} + k={k} - 1 = {need} positions "
                         f"is past max_seq_len={max_len}; shorten the prompt, generate fewer tokens or lower k")

    tokens, lengths = generation.padded(rows)
    b = len(rows)
    logits, cache = generation.prefill(target, tokens, KVCache.create(target.cfg, b, max_len), lengths)
    draft.start(tokens, lengths, max_len)
    last = np.array(generation.sample(logits, jax.random.key(0)))   # greedy [B]: emitted, not yet in a cache
    new = [[int(t)] for t in last]
    pieces = [[1] for _ in rows]
    histories = [r + [int(t)] for r, t in zip(rows, last)]
    steps, checked, accepted, unguessed = (np.zeros(b, np.int64) for _ in range(4))
    active = np.array([max_new_tokens > 1] * b)

    while active.any():
        guesses, real = draft.propose(histories, last, int(k))
        if not real.any():                                       # nothing guessed: a plain step
            guesses = guesses[:, :0]
        fed = np.concatenate([last[:, None], guesses], axis=1)   # [B, 1 + guesses]
        # One target step: the argmax after every fed token, the leading guesses it agrees
        # with, and the cache rolled back to keep only those (generation.check_guesses).
        before = cache.host_lengths
        chosen, right, cache = generation.check_guesses(target, fed, cache, active)
        for r in np.flatnonzero(active):
            n = int(right[r])
            emitted = fed[r, 1:n + 1].tolist() + [int(chosen[r, n])]
            new[r] += emitted
            pieces[r].append(len(emitted))
            histories[r] += emitted
            last[r] = chosen[r, n]
            steps[r] += 1
            unguessed[r] += int(real[r] == 0)
            accepted[r] += min(n, int(real[r]))
            checked[r] += min(n + 1, int(k))    # a guess the draft could not make counts as wrong
        done = active & np.array([len(row) >= max_new_tokens for row in new])
        if done.any():   # a finished row stays where it was, so later rounds cannot run it past the cache
            cache = cache.rewound(np.where(done, before, cache.host_lengths))
        active &= ~done
        draft.keep(cache.host_lengths)

    out = [row[:max_new_tokens] for row in new]
    text = [tokenizer.decode(r) for r in out] if as_text else None
    return SpeculativeResult(tokens=out, text=text, k=int(k), draft=draft.name, target_steps=steps,
                             checked=checked, accepted=accepted, round_tokens=pieces,
                             unguessed=unguessed)
