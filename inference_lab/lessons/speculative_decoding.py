"""Notebook 08, speculative decoding: the trained pair (a 12.8M-parameter target, the 1.7M
``shakespeare`` model as its draft), the cost model's predictions on this machine's ceilings,
what a verify step costs against a decode step (over ``k`` and over the batch), acceptance on
held-out prompts, and the speed-up over ``k`` for four drafts, predicted and then measured."""

from __future__ import annotations

import dataclasses
import functools
import math

from inference_lab import plots
from inference_lab.analytic import costs, roofline, speculation as cost_model
from inference_lab.base import hardware, tokenizer
from inference_lab.base.progress import bar as progress_bar
from inference_lab.base.config import ModelConfig
from inference_lab.lessons import claims
from inference_lab.measure import speculation as measure, timing
from inference_lab.measure.matmuls import ModelMatmulsPoint
from inference_lab.model import pretrained
from inference_lab.runtime import generation
from inference_lab.runtime.speculative import ConstantDraft, ModelDraft, NgramDraft, speculative_generate

TARGET, DRAFT = "shakespeare_large", "shakespeare"
NEW_TOKENS = 48      # new tokens per prompt in the timed generations
CONTEXT = 128        # cached tokens of the verify measurements: a prompt and half an answer
LESSON_K = 4         # the k the batch experiment and the acceptance runs use
PLAIN_STEPS = 16     # decode steps in the loop that times plain decode's step


@functools.lru_cache(maxsize=None)
def trained_pair(kernels: str = "auto"):
    """(target, draft): the two shipped models, loaded once per process."""
    return pretrained.load(kernels, preset=TARGET), pretrained.load(kernels, preset=DRAFT)


def prompts() -> list:
    """The held-out prompts as token rows (BOS first)."""
    return [tokenizer.encode(p) for p in pretrained.heldout_prompts()]


def drafts(target, draft_model) -> dict:
    """The four drafts of the lesson, from no help to perfect help: name -> draft."""
    return {"never right": ConstantDraft(), "n-gram": NgramDraft(), "shakespeare": ModelDraft(draft_model),
            "the target itself": ModelDraft(target)}


def where_the_weights_live(cfg: ModelConfig) -> str:
    """The target's weights against this processor's last-level cache: streamed from memory (the
    bandwidth-bound step of notebook 03) or re-read from the cache (then the numbers below are
    faster than a laptop's and the verify ratios flatter)."""
    nbytes = costs.weight_bytes(cfg)
    llc = hardware.last_level_cache_bytes()
    if not llc:
        return f"{cfg.name}: {nbytes / 1e6:,.1f} MB of weights per step (this processor reports no cache size)"
    times = nbytes / llc
    where = ("so every step streams them from memory, as the lesson model's do" if times >= 1.5 else
             "so a step may re-read part of them from the cache: faster than from memory, and faster than on a laptop")
    return (f"{cfg.name}: {nbytes / 1e6:,.1f} MB of weights per step, {times:,.1f}x this processor's "
            f"{llc / 2**20:,.0f} MiB last-level cache, {where}")


# ----------------------------------------------------------------------------- predictions
def predicted_ratios(cfg, spec, ks, *, batch: int = 1, context: int = CONTEXT) -> dict:
    """k -> the roofline's verify of ``k + 1`` tokens over one decode step."""
    return {k: cost_model.verify_over_step(cfg, spec, k, batch=batch, context=context) for k in ks}


def prediction_table(ks, acceptance: dict, predicted: dict, roofline: dict) -> str:
    """Before timing any generation: per k and draft, the speed-up predicted from the measured
    steps and (in brackets) from the roofline alone."""
    lines = ["acceptance on prompt 1, the one timed below (section 3's last column): "
             + ", ".join(f"{n} {a:.0%}" for n, a in acceptance.items()),
             "predicted speed-up, from the measured steps (from the roofline):",
             f"{'k':>3}" + "".join(f"{name:>22}" for name in acceptance)]
    for k in ks:
        lines.append(f"{k:>3}" + "".join(f"{f'x{predicted[(n, k)]:.2f} (x{roofline[(n, k)]:.2f})':>22}"
                                         for n in acceptance))
    return "\n".join(lines)


def predicted_speedups(target_cfg, draft_cfg, spec, ks, acceptance: dict, unguessed: dict | None = None) -> dict:
    """(draft name, k) -> the cost model's speed-up on this machine's ceilings (``unguessed`` as
    :func:`predicted_from_steps` takes it)."""
    draft_cfgs = {"shakespeare": draft_cfg, "the target itself": target_cfg}
    unguessed = unguessed or {}
    return {(name, k): cost_model.predicted_speedup(a, k, target_cfg, spec, draft_cfg=draft_cfgs.get(name),
                                                    unguessed=unguessed.get(name, 0.0))
            for name, a in acceptance.items() for k in ks}


def predicted_from_steps(verifies, plain_step_s: float, draft_step_s: float, ks, acceptance: dict,
                         draft_loop_s: float | None = None, unguessed: dict | None = None) -> dict:
    """(draft name, k) -> the cost model's speed-up with times measured here in place of the
    roofline's: plain decode's step inside its compiled loop (``plain_step_s``, what plain decode
    pays per token), the verify steps (``verifies``, batch 1, each a call of its own, as a round's
    is) and the draft model's steps. A draft model writes its ``k + 1`` steps in one compiled call
    (``ModelDraft.propose``), so a round's draft work is one step as a call of its own
    (``draft_step_s``) plus ``k`` steps inside its loop (``draft_loop_s``; the call's rate if not
    given). The target drafting for itself pays its own two rates. ``unguessed``: name -> rounds
    with nothing guessed per token (:func:`row_unguessed`; absent: the draft always guesses), each
    a one-token verify. Still a prediction: no generation has been timed."""
    by = {r.tokens: r.seconds for r in verifies if r.batch == 1}
    rates = {"shakespeare": (draft_step_s, draft_step_s if draft_loop_s is None else draft_loop_s),
             "the target itself": (by[1], plain_step_s)}

    def draft_round(name, k):
        call, loop = rates.get(name, (0.0, 0.0))
        return call + k * loop

    unguessed = unguessed or {}
    return {(name, k): cost_model.speedup(a, k, step_s=plain_step_s, verify_s=by[k + 1],
                                          draft_step_s=draft_round(name, k), draft_steps=1,
                                          unguessed=unguessed.get(name, 0.0), plain_verify_s=by[1])
            for name, a in acceptance.items() for k in ks}


def plain_step(target, steps: int = PLAIN_STEPS):
    """Plain decode's batch-1 step inside its compiled loop, at :data:`CONTEXT`: a DecodeRecord
    (``step_seconds``, ``mbu`` against this machine's read ceiling), as notebook 01 measures."""
    return timing.decode_points(target, [(1, CONTEXT)], steps)[0]


def streaming_line(rec) -> str:
    """How fast the target's batch-1 step streams its bytes, against the read ceiling."""
    return (f"its batch-1 decode step: {rec.step_seconds * 1e3:.2f} ms for {rec.bytes_per_step / 1e6:.1f} MB, "
            f"{rec.bytes_per_step / rec.step_seconds / 1e9:.1f} GB/s, MBU {rec.mbu:.0%} of the read ceiling")


def draft_step_seconds(draft_model, context: int = CONTEXT) -> float:
    """The draft model's one-token step, timed as the target's were."""
    return measure.verify_sweep(draft_model, tokens=(1,), context=context,
                                max_len=_cache_len(draft_model))[0].seconds


def best_predicted(predicted: dict, name: str) -> int:
    """The k the cost model picks for one draft."""
    return max((k for n, k in predicted if n == name), key=lambda k: predicted[(name, k)])


def most_decisive(predicted: dict, name: str) -> int:
    """The k whose predicted speed-up is furthest from plain decode's (on a log scale): where a
    test of the cost model has the largest effect to find, so the noise of a busy 2-core CPU can
    hide it least."""
    return max((k for n, k in predicted if n == name), key=lambda k: abs(math.log(predicted[(name, k)])))


def nearer_plain(before: dict, beside: dict) -> dict:
    """(draft name, k) -> whichever of two predictions lies nearer plain decode's x1 (log scale):
    the one made before the generations (``before``) or again from the steps timed beside them
    (``beside``, :meth:`Grid.predicted_beside`). A machine whose load moved between the two timings
    makes either one uncertain by that much; the verdicts test the weaker claim of the two, so a
    busy spell during one timing cannot make the cost model promise an effect it never made."""
    return {key: min(before[key], beside[key], key=lambda p: abs(math.log(p))) for key in beside}


# ----------------------------------------------------------------------------- measurements
CACHE_LEN = 256      # positions of every cache the lesson times: the trained models' whole context


def _cache_len(model) -> int:
    return min(CACHE_LEN, model.cfg.max_seq_len)


def _verify_rows(ks) -> tuple:
    """The tokens per row of the verify steps timed for ``ks``: a one-token step and each ``k + 1``."""
    return (1,) + tuple(k + 1 for k in ks)


def verify_steps(model, ks, *, batches=(1,), beside=()) -> list:
    """A one-token step and a verify of ``k + 1`` tokens for each ``k``, at each batch, after
    :data:`CONTEXT` cached tokens, side by side (:func:`measure.verify_sweep`; ``beside``: points
    timed in the same rounds, their records last). The caches hold :data:`CACHE_LEN` positions, as
    the generations' do, so both run the same compiled programs."""
    return measure.verify_sweep(model, tokens=_verify_rows(ks), batches=batches, context=CONTEXT,
                                max_len=_cache_len(model), beside=beside)


def verify_steps_and_matmuls(model, ks) -> tuple[list, list]:
    """Batch-1 :func:`verify_steps`, and in the same rounds the model's weight matrices alone at the
    same row counts (1 and each ``k + 1``: :class:`ModelMatmulsPoint`): (verify records, matmul
    records). What the extra rows cost the matmul kernels, measured beside the steps, so that a
    core that gets busy slows both alike."""
    rows = _verify_rows(ks)
    recs = verify_steps(model, ks, beside=[ModelMatmulsPoint(model, m) for m in rows])
    return recs[:len(rows)], recs[len(rows):]


def batch_verifies_and_matmuls(model, k: int, batches) -> tuple[list, tuple]:
    """:func:`verify_steps` at each batch and, in the same rounds, the model's weight matrices
    alone at the rows a step and a verify feed them at the smallest and the largest batch:
    (verify records, (verify / step the matmuls alone predict at the smallest batch, at the
    largest)). What a verify adds is rows through the same matrices, so their growth alone is a
    prediction measured on this machine's kernels."""
    ends = (batches[0], batches[-1])
    rows = sorted({m for b in ends for m in (b, b * (k + 1))})
    recs = verify_steps(model, (k,), batches=batches, beside=[ModelMatmulsPoint(model, m) for m in rows])
    n = len(recs) - len(rows)
    alone = {r.m: r.seconds for r in recs[n:]}
    return recs[:n], tuple(alone[b * (k + 1)] / alone[b] for b in ends)


def answer_text(tokens) -> str:
    """Token ids as text (the byte tokenizer's decode)."""
    return tokenizer.decode(tokens)


def acceptance_runs(target, drafts_by_name: dict, k: int = LESSON_K) -> dict:
    """Every draft on all the held-out prompts at once (a ragged batch), untimed: name -> result.
    Each result's text is also checked against plain greedy decode."""
    rows = prompts()
    out = {}
    with progress_bar(total=1 + len(drafts_by_name), desc="answers", unit="draft", transient=True) as bar:
        plain = generation.generate(target, rows, NEW_TOKENS)
        bar.update()
        for name, draft in drafts_by_name.items():
            bar.set_postfix_str(name, refresh=False)
            res = speculative_generate(target, draft, rows, NEW_TOKENS, k=k)
            if res.tokens != plain:
                raise AssertionError(f"the {name} draft changed the text: speculation must never do that")
            out[name] = res
            bar.update()
    return out


def row_acceptance(results: dict, row: int = 0) -> dict:
    """name -> the acceptance rate on one prompt alone (greedy text is deterministic, so a timed
    run of that prompt at the same ``k`` accepts exactly these guesses)."""
    return {name: float(r.accepted[row] / r.checked[row]) if r.checked[row] else 0.0 for name, r in results.items()}


def row_unguessed(results: dict, row: int = 0) -> dict:
    """name -> rounds in which the draft guessed nothing, per token written, on one prompt alone
    (as :func:`row_acceptance`): prompt lookup finds no match at the same places of a greedy text
    whatever ``k``, and there a round is a plain one-token step."""
    return {name: float(r.unguessed[row] / (len(r.tokens[row]) - 1)) if len(r.tokens[row]) > 1 else 0.0
            for name, r in results.items()}


def acceptance_table(results: dict, row: int = 0) -> str:
    """Acceptance over all the held-out prompts and on prompt ``row`` alone (the one section 4 times)."""
    alone, idle = row_acceptance(results, row), row_unguessed(results, row)
    k = next(iter(results.values())).k
    lines = [f"k = {k}, {len(prompts())} held-out prompts, {NEW_TOKENS} new tokens each; the last column is prompt "
             f"{row + 1} alone, the one section 4 times",
             f"{'draft':<20}{'acceptance':>12}{'tokens/step':>13}{'target steps':>14}{f'prompt {row + 1}':>11}"]
    for name, r in results.items():
        lines.append(f"{name:<20}{r.acceptance_rate:>12.0%}{r.tokens_per_step:>13.2f}{int(r.target_steps.sum()):>14}"
                     f"{alone[name]:>11.0%}")
    lines += [f"{name} had nothing to guess in {int(r.unguessed[row])} of prompt {row + 1}'s {int(r.target_steps[row])} "
              f"rounds (no earlier match): {idle[name]:.2f} such rounds per token, each a plain one-token step"
              for name, r in results.items() if r.unguessed[row]]
    return "\n".join(lines)


def show_rounds(result, row: int = 0, width: int = 96) -> str:
    """One row's answer with a ``|`` after each round: the pieces one target step wrote."""
    text, pos = [], 0
    for n in result.round_tokens[row]:
        text.append(tokenizer.decode(result.tokens[row][pos:pos + n]))
        pos += n
    joined = "|".join(text)
    return "\n".join(joined[i:i + width] for i in range(0, len(joined), width))


@dataclasses.dataclass
class Grid:
    """The timed generations at batch 1: plain decode and each (draft, k); and, in the same
    rounds, the steps the predictions rest on, timed again: plain decode's step in its loop
    (``plain_step``), the target's verify steps of 1 and each ``k + 1`` tokens (``verify_steps``)
    and the draft model's step (``draft_step``). From those, :meth:`predicted_beside` makes the
    predictions again: how far they move is how far the machine moved since they were made."""

    plain: measure.GenerationRecord
    runs: dict          # (draft name, k) -> GenerationRecord
    ks: tuple
    plain_step: object = None   # a DecodeRecord
    verify_steps: list = dataclasses.field(default_factory=list)   # VerifyRecords, batch 1
    draft_step: object = None   # a VerifyRecord of one token
    draft_loop_step: object = None   # a DecodeRecord: the draft model's step inside its compiled loop

    def speedup(self, name: str, k: int) -> float:
        return self.plain.seconds / self.runs[(name, k)].seconds

    def predicted_beside(self, acceptance: dict, unguessed: dict | None = None) -> dict:
        """:func:`predicted_from_steps` from the steps timed beside the generations."""
        if self.draft_step is None and "shakespeare" in acceptance:
            raise ValueError("the draft model's step was not timed beside the generations: "
                             "pass speedup_grid(..., draft_model=) to predict its speed-up again")
        return predicted_from_steps(self.verify_steps, self.plain_step.step_seconds,
                                    self.draft_step.seconds if self.draft_step else 0.0, self.ks, acceptance,
                                    draft_loop_s=self.draft_loop_step.step_seconds if self.draft_loop_step else None,
                                    unguessed=unguessed)

    def table(self, predicted: dict, roofline: dict) -> str:
        """Measured speed-up, then the predictions from the measured steps and from the roofline."""
        names = list(dict.fromkeys(n for n, _ in self.runs))
        lines = [f"plain decode: {self.plain.tokens_per_s:,.1f} tok/s ({self.plain.new_tokens} tokens, batch 1)",
                 "speed-up measured (predicted from the measured steps / from the roofline):",
                 f"{'k':>3}" + "".join(f"{n:>26}" for n in names)]
        for k in self.ks:
            cells = [f"x{self.speedup(n, k):.2f} ({predicted[(n, k)]:.2f} / {roofline[(n, k)]:.2f})" for n in names]
            lines.append(f"{k:>3}" + "".join(f"{c:>26}" for c in cells))
        return "\n".join(lines)


def speedup_grid(target, drafts_by_name: dict, ks, *, draft_model=None, prompt: int = 0, repeats: int = 4,
                 new_tokens: int = NEW_TOKENS) -> Grid:
    """Plain decode and every (draft, k) on one held-out prompt at batch 1, side by side, with the
    steps the predictions rest on in the same rounds: plain decode's step (:func:`plain_step`'s
    point), the target's verify steps (:func:`verify_steps`' points) and ``draft_model``'s step."""
    configs = [(d, k) for d in drafts_by_name.values() for k in ks]
    rows = _verify_rows(ks)
    beside = [timing.DecodePoint(target, 1, CONTEXT, PLAIN_STEPS)]
    beside += [measure.VerifyPoint(target, 1, CONTEXT, t, max_len=_cache_len(target)) for t in rows]
    if draft_model is not None:
        beside += [measure.VerifyPoint(draft_model, 1, CONTEXT, 1, max_len=_cache_len(draft_model)),
                   timing.DecodePoint(draft_model, 1, CONTEXT, PLAIN_STEPS)]
    recs = measure.generation_sweep(target, [prompts()[prompt]], new_tokens, configs, beside=beside, repeats=repeats)
    recs, step_rec, verify_recs = recs[:1 + len(configs)], recs[1 + len(configs)], recs[2 + len(configs):]
    if not measure.same_text(recs):
        raise AssertionError("a speculative run wrote other tokens than plain decode")
    names = [n for n in drafts_by_name for _ in ks]
    drafted = draft_model is not None
    return Grid(plain=recs[0], runs={(n, k): r for n, (_, k), r in zip(names, configs, recs[1:])}, ks=tuple(ks),
                plain_step=step_rec, verify_steps=verify_recs[:len(rows)],
                draft_step=verify_recs[len(rows)] if drafted else None,
                draft_loop_step=verify_recs[len(rows) + 1] if drafted else None)


def drift_lines(grid: Grid, step, predicted: dict, again: dict, checks) -> str:
    """The steps and the predictions of ``checks`` ((draft, k) pairs) as made before the
    generations and again from the steps timed beside them (:meth:`Grid.predicted_beside`)."""
    lines = [f"plain decode's step: {step.step_seconds * 1e3:.2f} ms when the predictions were made, "
             f"{grid.plain_step.step_seconds * 1e3:.2f} ms beside the generations"]
    lines += [f"{n}, k = {k}: predicted x{predicted[(n, k)]:.2f}, made again from the steps timed beside the "
              f"generations x{again[(n, k)]:.2f} (moved x{claims.drift(predicted[(n, k)], again[(n, k)]):.2f})"
              for n, k in checks]
    return "\n".join(lines)


def speedup_view(grid: Grid, predicted: dict, draft: str, k: int):
    """Dashboard: the speed-up over k for one draft, measured and predicted, k highlighted."""
    fig = plots.speedup_over_k(grid.ks, [grid.speedup(draft, j) for j in grid.ks],
                               [predicted[(draft, j)] for j in grid.ks], draft=draft, highlight=k,
                               predicted_label="predicted from the measured steps")
    r = grid.runs[(draft, k)]
    text = (f"{draft}, k = {k}: x{grid.speedup(draft, k):.2f} the tokens/s of plain decode (predicted "
            f"x{predicted[(draft, k)]:.2f}); {r.tokens_per_step:.2f} tokens per target step, acceptance "
            f"{r.acceptance:.0%}; the same {r.new_tokens} tokens as plain decode")
    return fig, text


def independence_line(grid: Grid, acceptance: dict, name: str) -> str:
    """The cost model assumes each guess is right independently (probability ``a``); measured
    tokens per target step at each k beside what that assumption gives."""
    a = acceptance[name]
    pairs = ", ".join(f"k={k}: {grid.runs[(name, k)].tokens_per_step:.2f} vs {cost_model.expected_tokens(a, k):.2f}"
                      for k in grid.ks)
    k = max(grid.ks)
    ratio = grid.runs[(name, k)].tokens_per_step / cost_model.expected_tokens(a, k)
    if ratio > 1.1:
        why = ("more than the formula at the largest k: the guesses are right or wrong together (prompt lookup copies "
               "a repeated line whole), which the independent-guess formula does not know")
    elif ratio < 1 / 1.1:
        why = ("fewer than the formula at the largest k: later guesses are wrong more often than early ones (the draft "
               "drifts from the target the further it guesses)")
    else:
        why = "within 10% of the formula at the largest k: the guesses behave as independent ones"
    return (f"{name}: tokens per target step measured vs (1 - a^(k+1)) / (1 - a) at a = {a:.0%} (prompt 1, measured at "
            f"k = {LESSON_K}): {pairs}; {why}.")


def verify_batches(verifies, k: int) -> tuple:
    """(batches, measured verify/step at each) for ``k + 1`` tokens."""
    batches = sorted({r.batch for r in verifies})
    by = {(r.batch, r.tokens): r.seconds for r in verifies}
    return batches, [by[(b, k + 1)] / by[(b, 1)] for b in batches]


def batch_view(verifies, cfg, spec, k: int, batch: int, *, where: str = "here"):
    """Dashboard: verify / step over the batch, measured and on the roofline, one batch
    highlighted; the readout adds the cost model's speed-up there for an acceptance of 60%."""
    batches, measured = verify_batches(verifies, k)
    predicted = [cost_model.verify_over_step(cfg, spec, k, batch=b, context=CONTEXT) for b in batches]
    fig = plots.verify_cost_over_batch(batches, measured, predicted, k=k, highlight=batch, where=where)
    i = batches.index(batch)
    a = 0.6
    gain = cost_model.expected_tokens(a, k) / measured[i]
    text = (f"batch {batch}: a verify of {k + 1} tokens costs x{measured[i]:.2f} a decode step (roofline "
            f"x{predicted[i]:.2f}); at an acceptance of {a:.0%} a round makes {cost_model.expected_tokens(a, k):.2f} "
            f"tokens, so a draft that costs nothing would give x{gain:.2f}"
            + (" : speculation no longer pays" if gain < 1 else ""))
    return fig, text


def batch_speedups(target, draft, k: int, batches, *, repeats: int = 3, measured: dict | None = None) -> dict:
    """batch -> (plain record, speculative record): the held-out prompts tiled to each batch, plain
    decode beside speculation with ``draft`` and ``k``, side by side per batch. ``measured``: batches
    already timed (batch -> the two records), not timed again."""
    rows = prompts()
    out = dict(measured or {})
    for b in batches:
        if b in out:
            continue
        tiled = [rows[i % len(rows)] for i in range(b)]
        plain, spec = measure.generation_sweep(target, tiled, NEW_TOKENS, [(draft, k)], repeats=repeats)
        if not measure.same_text([plain, spec]):
            raise AssertionError(f"speculation changed the text at batch {b}")
        out[b] = (plain, spec)
    return dict(sorted(out.items()))


def batch_speedup_lines(runs: dict, verifies, k: int) -> str:
    """Measured speed-up at each batch beside what that batch's measured verify / step predicts:
    tokens per target step over the verify's cost in steps, which leaves out a round's fixed cost
    (a call of its own, the host's accept-and-roll-back), so it is an upper bound; section 4's cost
    model counts it."""
    ratios = dict(zip(*verify_batches(verifies, k)))
    lines = []
    for b, (plain, spec) in runs.items():
        pred = spec.tokens_per_step / ratios[b] if b in ratios else float("nan")
        lines.append(f"batch {b:>3}: plain {plain.tokens_per_s:,.0f} tok/s, {spec.draft} k={k} {spec.tokens_per_s:,.0f} "
                     f"tok/s: x{plain.seconds / spec.seconds:.2f} ({spec.tokens_per_step:.2f} tokens per target step "
                     f"over a verify of x{ratios.get(b, float('nan')):.2f} a step predicts at most x{pred:.2f}, "
                     "a round's fixed cost left out)")
    return "\n".join(lines)


def where_it_stops_paying(acceptance: float, k: int, spec) -> str:
    """The batch at which the roofline's speed-up falls below 1: this machine with the target,
    and an H100 and an H200 with the Llama-3-8B shape at a 1k context (a draft with no device
    work), beside the estimate by hand (:func:`~cost_model.stops_paying_estimate`), the predicted
    knee (05's 1.5x rule on the roofline's steps) and, on the GPUs, how many sequences fit in
    memory at that context (a batch past that is no server's). On the GPUs, two verify steps:
    this lab's, which reads the KV cache once per checked token, and a production one that reads
    it once for all of them. The roofline leaves out a round's fixed cost, so on a machine where
    speculation already loses at batch 1 (section 4) its "stops paying" is an upper bound."""
    e = cost_model.expected_tokens(acceptance, k)
    lines = [f"acceptance {acceptance:.0%}, k = {k}, a draft with no device work (prompt lookup): E = {e:.2f} tokens "
             f"per round; by hand (short context): B = R x E / (k + 1), R = the ridge in tokens per step"]
    cases = [(f"this machine, {TARGET}", ModelConfig.preset(TARGET), spec, CONTEXT, (False,))]
    cases += [(f"{name}, llama3_8b", ModelConfig.preset("llama3_8b"), hardware.PRESETS[name], 1024, (True, False))
              for name in ("H100_SXM", "H200")]
    for label, cfg, s, context, reads in cases:
        found = []
        for once in reads:
            at = cost_model.batch_where_it_stops_paying(acceptance, k, cfg, s, context=context, cache_once=once)
            how = "" if len(reads) == 1 else (" (a verify reading the cache once)" if once else
                                              " (this lab's verify, reading it once per token)")
            fits = roofline.max_batch(cfg, s, context) if s.memory_bytes else None
            past = (f", past the {fits:,} sequences that fit in its memory: on one {s.name} it never stops paying"
                    if fits is not None and (at is None or at > fits) else "")
            found.append(f"batch {at if at else f'> {cost_model.LARGEST_BATCH}'}{how}{past}")
        lines.append(f"  {label}, context {context:,}: on the roofline, stops paying at " + "; at ".join(found))
        lines.append(f"      R = {cost_model.compute_bound_tokens(cfg, s):,.0f} tokens, so by hand batch "
                     f"{cost_model.stops_paying_estimate(acceptance, k, cfg, s):,.0f}; the predicted knee (the "
                     f"roofline's step x1.5 batch 1's): batch {roofline.predicted_knee(cfg, s, context)}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- readings
def verify_table(verifies, predicted: dict, matmuls=()) -> str:
    """Batch-1 verify steps: time, x a decode step, the roofline's x, the model's matmuls alone at
    as many rows (x their one-row time; where ``matmuls`` are given) and the extra tokens' rate."""
    one = next(r for r in verifies if r.batch == 1 and r.tokens == 1)
    alone = {r.m: r.seconds for r in matmuls}
    header = f"{'tokens':>7}{'ms':>9}{'x step':>9}{'roofline x':>12}"
    lines = [header + (f"{'matmuls alone x':>17}" if alone else "") + f"{'extra GFLOP/s':>15}"]
    for r in sorted((r for r in verifies if r.batch == 1), key=lambda r: r.tokens):
        extra = ((r.flops - one.flops) / (r.seconds - one.seconds) / 1e9
                 if r.tokens > 1 and r.seconds > one.seconds else float("nan"))
        roof = predicted.get(r.tokens - 1, 1.0) if r.tokens > 1 else 1.0
        line = f"{r.tokens:>7}{r.seconds * 1e3:>9.3f}{r.seconds / one.seconds:>9.2f}{roof:>12.2f}"
        if alone:
            line += f"{alone[r.tokens] / alone[1]:>17.2f}" if r.tokens in alone and 1 in alone else f"{'-':>17}"
        lines.append(line + (f"{extra:>15.1f}" if r.tokens > 1 else f"{'-':>15}"))
    return "\n".join(lines)


def verify_reading(verifies, predicted: dict, k: int, spec, dtype, matmuls=()) -> str:
    """Why the measured verify ratio sits where it does against the roofline's, from the numbers:
    the extra tokens' FLOP rate and, where ``matmuls`` are given, the model's matmuls alone."""
    ratio, one, many = claims.verify_ratio(verifies, 1, k + 1)
    roof = predicted[k]
    if ratio <= 1.25 * roof:
        return (f"A verify of {k + 1} tokens costs x{ratio:.2f} a decode step here, close to the roofline's "
                f"x{roof:.2f}: the extra tokens ride on the weight bytes the step reads anyway.")
    extra = (many.flops - one.flops) / max(many.seconds - one.seconds, 1e-12)
    peak = spec.peak_flops(dtype)
    text = (f"A verify of {k + 1} tokens costs x{ratio:.2f} a decode step here, more than the roofline's x{roof:.2f}. "
            f"The roofline charges the extra {k} tokens' FLOPs at this machine's matmul peak, {peak / 1e9:,.0f} "
            f"GFLOP/s, measured on one large square matmul; the verify did the extra work at {extra / 1e9:,.1f} "
            f"GFLOP/s ({extra / peak:.0%} of that peak), so those FLOPs cost time the bytes do not hide.")
    alone = {r.m: r.seconds for r in matmuls}
    if 1 in alone and k + 1 in alone:
        share = (alone[k + 1] - alone[1]) / max(many.seconds - one.seconds, 1e-12)
        text += (f" The model's weight matrices alone, timed beside the steps, take x{alone[k + 1] / alone[1]:.2f} as "
                 f"long at {k + 1} rows as at one: {max(share, 0):.0%} of the verify's extra time. It is notebook 05's "
                 f"knee again: the matmul kernel here is built for one row (a matrix-vector product) or for many, and "
                 f"a verify step is {k + 1}; and another program busy on the machine can slow the many-row kernel more "
                 f"than the one-row one. The verdict below expects what those matmuls cost here, timed in the same "
                 f"rounds, and asks that checking {k} guesses cost far less than {k} more steps.")
    return text


def speedup_reading(grid: Grid, verifies, plain_step_s: float, predicted: dict, roofline: dict, name: str, k: int,
                    unguessed: dict | None = None) -> str:
    """Measured speed-up against the two predictions, and where a round's time goes: the target's
    step (a call of its own, as plain decode's steps are not: a verify of ``k + 1`` tokens, or a
    one-token step in a round with nothing guessed, ``unguessed`` as :func:`predicted_from_steps`
    takes it) and the rest (the draft, the host)."""
    run = grid.runs[(name, k)]
    by = {r.tokens: r.seconds for r in verifies if r.batch == 1}
    if k + 1 not in by:
        return ""
    rounds = (run.new_tokens - 1) / run.tokens_per_step
    prefill = max(grid.plain.seconds - (run.new_tokens - 1) * plain_step_s, 0.0)
    per_round = (run.seconds - prefill) / rounds
    idle = min(1.0, (unguessed or {}).get(name, 0.0) * run.tokens_per_step)   # the share of rounds with no guess
    step = (1 - idle) * by[k + 1] + idle * by[1]
    where = (f"about {idle:.0%} of the rounds had nothing to guess, a one-token step of {by[1] * 1e3:.2f} ms, the "
             f"others a verify of {k + 1} tokens, {by[k + 1] * 1e3:.2f} ms" if idle else
             f"a verify of {k + 1} tokens")
    return (f"{name}, k = {k}: measured x{grid.speedup(name, k):.2f}; predicted x{predicted[(name, k)]:.2f} from the "
            f"steps measured here, x{roofline[(name, k)]:.2f} from the roofline alone. A round wrote "
            f"{run.tokens_per_step:.2f} tokens in {per_round * 1e3:.2f} ms, {step * 1e3:.2f} ms of it the target's "
            f"step ({where}), the rest the draft's and the host's work; plain decode writes one per "
            f"{plain_step_s * 1e3:.2f} ms.")


def roofline_leaves_out(verifies, plain_step_s: float) -> str:
    """The two costs a round pays that the roofline's prediction does not count (the prediction
    from the measured steps does): a step run as a call of its own, and the verify's few-row matmuls."""
    by = {r.tokens: r.seconds for r in verifies if r.batch == 1}
    return (f"two costs the roofline leaves out: a step as a call of its own costs {by[1] * 1e3:.2f} ms, "
            f"{(by[1] - plain_step_s) * 1e3:.2f} ms more than a step inside plain decode's compiled loop (the fixed "
            "cost of one program run, paid once per round, once per answer by plain decode), and the verify's "
            "few-row matmuls (section 2)")


def verify_model(here, target):
    """The model whose verify steps are timed: the trained target on a CPU (its step streams its
    weights, as the lesson model's does), the lesson model on a GPU (there the 51 MB target is
    too small: its steps are launch overhead, and the lesson is about bytes)."""
    from inference_lab.lessons import machine

    return machine.lesson_model(here) if here.on_gpu else target
