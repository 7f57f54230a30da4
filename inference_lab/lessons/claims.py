"""The lessons' claims as functions over measurements: each returns a :class:`Verdict`.

A notebook measures, calls the claim on what it measured, prints the verdict (the claim, and
the numbers that decide it) and ``assert``s it. Every claim here could come out false: each
compares measurements that two explanations predict *differently* (time that follows the
FLOPs against time that follows the bytes, say), and ``tests/test_claims.py`` feeds each one
synthetic records where the claim is false and checks that it says so.

Each claim compares a measurement with a prediction made *before* it (the roofline on this
machine's ceilings, or the model's own kernels timed alone) at a margin that the effect taught
clears and its absence would not: by default halfway, on a log scale, between the two (the
geometric mean of "no effect" and "the predicted effect").

A busy machine cannot always decide. Records carry the spread of their repeats (upper over lower
quartile); a ratio of medians is trusted to within the noise factor they allow (:func:`noise`). A
claim clearing its margin by more than the noise holds; one missing it by more fails; one inside
the noise says CANNOT DECIDE HERE (``holds is None``), which the notebook's ``assert`` passes.

Records are read by attribute (prefill, decode and kernel records, or anything with the same
fields), so a claim can be checked on a classroom's files too. Notebook 01 works one by hand.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from inference_lab.analytic import costs, roofline


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A claim, whether the measurements support it, and the numbers that decided it.

    ``holds`` is True or False when the measurements decide, and None when they cannot: the
    machine was too noisy, or its own properties leave the prediction open. An undecided verdict
    says so with its numbers and is not a failure (``bool(verdict)`` is False only for a claim
    the measurements refute), so a notebook's ``assert verdict`` asserts only what was decided."""

    claim: str
    holds: bool | None
    evidence: str

    @property
    def decided(self) -> bool:
        return self.holds is not None

    def __bool__(self) -> bool:
        return self.holds is not False

    def __str__(self) -> str:
        word = {True: "HOLDS", False: "FAILS", None: "CANNOT DECIDE HERE"}[self.holds]
        return f"{word}: {self.claim}\n  evidence: {self.evidence}"


def _by(records, key):
    out = {}
    for r in records:
        out.setdefault(getattr(r, key), r)
    return dict(sorted(out.items()))


def _need(cond, what):
    if not cond:
        raise ValueError(what)


def noise(*records) -> float:
    """How far a ratio of these records' medians may move from noise alone, as a factor >= 1: the
    product of the square roots of their spreads (a median is trusted to about half its repeats'
    interquartile range either way, in log terms). Records without a spread count as quiet."""
    u = 1.0
    for r in records:
        spread = getattr(r, "spread", None)
        if spread is not None and spread > 1:
            u *= math.sqrt(spread)
    return u


def drift(before, after) -> float:
    """How far one measurement moved between two timings of it, as a factor >= 1: a program timed
    when a prediction's inputs were and again beside the run it is checked against (or the
    prediction, made again from the second timings). A repeat's spread shows load that comes and
    goes *within* a measurement; load that changed *between* two shows only here. Numbers, or
    records read by ``step_seconds`` (decode) or ``seconds``."""
    a, b = (r if isinstance(r, (int, float)) else getattr(r, "step_seconds", None) or r.seconds for r in (before, after))
    return max(a / b, b / a)


def decide(value: float, need: float, u: float = 1.0, *, at_least: bool = True):
    """True when ``value`` clears ``need`` (``>=``, or ``<=`` with ``at_least=False``) even if the
    noise ``u`` moved it; False when it misses even so; None in between (too noisy to decide)."""
    if not at_least:
        value, need = 1 / value, 1 / need
    if value / u >= need:
        return True
    if value * u < need:
        return False
    return None


def all_hold(*results):
    """Every part holds: False if any fails, None if none fails but one cannot decide."""
    if any(r is False for r in results):
        return False
    return None if any(r is None for r in results) else True


def _noise_note(u: float, moved: float = 1.0) -> str:
    note = f" (noise: x{u:.2f}, from the repeats' spread" if u > 1.005 else ""
    if moved > 1.005:
        note += ("; " if note else " (") + f"x{moved:.2f} more: the prediction moved that much when made again " \
                "from the steps timed beside this run"
    return note + ")" if note else ""


def log_midpoint(effect: float, absent: float = 1.0) -> float:
    """Halfway, on a log scale, between the effect predicted and its absence: the default margin."""
    return math.sqrt(effect * absent)


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What the roofline says before anything is timed. Printed, never asserted: a prediction is
    what a later measurement is checked against."""

    claim: str
    evidence: str

    def __str__(self) -> str:
        return f"PREDICTED (from this machine's ceilings, before any timing): {self.claim}\n  because: {self.evidence}"


# ----------------------------------------------------------------------------- 01 and 06
def writing_slower_than_reading(prefill, decode, *, ideal: float) -> Verdict:
    """Per token, decode at batch 1 is slower than prefill by at least the log-midpoint between
    no gap and ``ideal``, the gap the roofline allows on this machine's ceilings (prefill at its
    compute ceiling over decode at its bandwidth ceiling). With both phases near their ceilings the
    measured gap is about ``ideal``; with a decode as fast per token as prefill, about 1."""
    _need(getattr(decode, "batch", 1) == 1, "pass the batch-1 decode record: the claim is about one stream")
    _need(ideal > 1, "pass ideal: the prefill/decode gap the roofline allows here (> 1)")
    ratio = prefill.prefill_tokens_per_s / decode.decode_tokens_per_s
    need, u = max(2.0, log_midpoint(ideal)), noise(prefill, decode)
    return Verdict(f"writing (decode, batch 1) is at least {need:.1f}x slower per token than reading (prefill): "
                   f"half of the ceilings' {ideal:.1f}x gap on a log scale", decide(ratio, need, u),
                   f"prefill {prefill.prefill_tokens_per_s:,.0f} tok/s (prompt {prefill.prompt_len}), decode "
                   f"{decode.decode_tokens_per_s:,.1f} tok/s: {ratio:,.1f}x (the roofline allows {ideal:.1f}x)"
                   + _noise_note(u))


def _spread_of(seconds) -> float:
    """Upper over lower quartile of a list of step times (1 for fewer than four)."""
    if len(seconds) < 4:
        return 1.0
    q = statistics.quantiles(seconds, n=4)
    return q[2] / q[0] if q[0] > 0 else 1.0


def cache_saving_as_predicted(lengths, uncached_s, cached_s, predicted_uncached_s, *, visible: float = 2.0) -> Verdict:
    """Without the KV cache every step runs the model over the whole text so far; with it, over
    one new token. How much that shows on the clock is predicted first: a step without the cache
    costs what a cached step costs (its calls, measured) plus the roofline's time of a forward
    over the whole text, so by the end the uncached step should take ``1 + forward / cached step``
    times as long.

    Where that prediction is at least ``visible`` (the saving should show), the claim holds if the
    last quarter's uncached steps take at least the log-midpoint of it; where it is below (a GPU,
    say, where this small model's steps are all launch overhead), it holds if they stay within
    ``visible`` times the cached ones. The step lists' own spread is the noise."""
    _need(len(lengths) == len(uncached_s) == len(cached_s) == len(predicted_uncached_s) >= 8,
          "pass one length, uncached time, cached time and predicted time per step, at least 8 steps")
    q = max(2, len(lengths) // 4)
    cached_step = statistics.median(cached_s[1:])          # the first cached step is the prefill
    predicted = 1 + predicted_uncached_s[-1] / cached_step
    ratio = statistics.median(uncached_s[-q:]) / statistics.median(cached_s[-q:])
    growth = statistics.median(uncached_s[-q:]) / statistics.median(uncached_s[1:q + 1])
    u = math.sqrt(_spread_of(cached_s[1:]) * _spread_of(uncached_s[-q:]))
    evidence = (f"predicted: a cached step's {cached_step * 1e3:,.3g} ms plus a forward over {lengths[-1]} tokens "
                f"({predicted_uncached_s[-1] * 1e3:,.3g} ms at the roofline), x{predicted:.2f} a cached step; last {q} "
                f"steps: without the cache x{ratio:,.2f} the cached time (it grew x{growth:,.2f} from the first steps)"
                + _noise_note(u))
    if predicted >= visible:
        need = log_midpoint(predicted)
        return Verdict(f"without the KV cache a step costs at least x{need:.2f} a cached one by the end (half the "
                       f"predicted x{predicted:.2f}, on a log scale)", decide(ratio, need, u), evidence)
    return Verdict(f"this model is too small for the cache's saving to show here: both steps within {visible:g}x",
                   decide(ratio, visible, u, at_least=False), evidence)


def small_model_mostly_fixed_costs(small, small_hollow, large, large_hollow, *, factor: float = 3.0) -> Verdict:
    """A small model's decode step is not the bandwidth-bound step a large model's is: a larger
    share of it is fixed costs, what the step costs whatever its bytes.

    Each model has a hollow twin (the same layers and kernel calls at width 16: almost no bytes).
    The twin's step over the model's step is the share of the step that does not depend on the
    bytes. If both steps were set by their bytes, both shares would be small; the claim holds if
    the small model's share is at least ``factor`` times the large one's. It does not rest on the
    machine's cache sizes (whether a few MB re-read faster from the caches differs from host to
    host; the notebook says which case this machine is), only on the step being more than its
    bytes."""
    _need(all(r.batch == 1 for r in (small, small_hollow, large, large_hollow)), "pass batch-1 decode records")
    _need(small.bytes_per_step < large.bytes_per_step, "pass the smaller model first")
    s, b = small_hollow.step_seconds / small.step_seconds, large_hollow.step_seconds / large.step_seconds
    u = noise(small, small_hollow, large, large_hollow)
    return Verdict(f"fixed costs are at least {factor:g}x more of the {small.bytes_per_step / 1e6:,.1f} MB model's "
                   f"decode step than of the {large.bytes_per_step / 1e6:,.0f} MB model's", decide(s / b, factor, u),
                   f"hollow twin / model: {s:.0%} of the small model's step ({small_hollow.step_seconds * 1e3:,.3f} of "
                   f"{small.step_seconds * 1e3:,.3f} ms), {b:.1%} of the large one's "
                   f"({large_hollow.step_seconds * 1e3:,.3f} of {large.step_seconds * 1e3:,.2f} ms): {s / b:,.1f}x"
                   + _noise_note(u))


# ----------------------------------------------------------------------------- 02
def prefill_compute_bound(records, *, min_mfu: float = 0.25) -> Verdict:
    """Short prompts ride on one weight read; long prompts pay for every token's math.

    Two predictions that differ: if the weight bytes set the time, a longer prompt costs
    (almost) no more time; if the FLOPs do, time grows in proportion to the tokens. The claim:
    from the shortest prompt to the first one at least 16x longer, time grows at most half
    as fast as the tokens (bytes or overhead bound); between the two longest, at least 0.6x
    as fast (compute-bound); and the longest reaches ``min_mfu`` of the measured matmul peak.
    """
    by = _by([r for r in records if getattr(r, "batch", 1) == 1], "prompt_len")
    _need(len(by) >= 3, "pass a prefill sweep of at least three prompt lengths at batch 1")
    T, recs = list(by), list(by.values())
    j = next((i for i, t in enumerate(T) if t >= 16 * T[0]), None)
    _need(j is not None and j < len(T) - 1, "the sweep needs a prompt >= 16x its shortest, and a longer one after it")

    def growth(a, b):  # time growth over token growth
        return (recs[b].seconds / recs[a].seconds) / (T[b] / T[a])

    short, long_ = growth(0, j), growth(-2, -1)
    mfu = recs[-1].mfu
    u_short, u_long = noise(recs[0], recs[j]), noise(recs[-2], recs[-1])
    holds = all_hold(decide(short, 0.5, u_short, at_least=False), decide(long_, 0.6, u_long),
                 None if mfu is None else decide(mfu, min_mfu, math.sqrt(getattr(recs[-1], "spread", None) or 1)))
    return Verdict("prefill is bound by its weight bytes (or overhead) for short prompts and by compute for long ones",
                   holds,
                   f"T {T[0]}->{T[j]}: time x{recs[j].seconds / recs[0].seconds:.2f} for tokens x{T[j] / T[0]:g} "
                   f"(growth {short:.2f}, need <= 0.5); T {T[-2]}->{T[-1]}: time "
                   f"x{recs[-1].seconds / recs[-2].seconds:.2f} for tokens x{T[-1] / T[-2]:g} (growth {long_:.2f}, "
                   f"need >= 0.6); MFU at T={T[-1]}: " + ("-" if mfu is None else f"{mfu:.0%} (need >= {min_mfu:.0%})")
                   + _noise_note(max(u_short, u_long)))


def model_follows_kernel(records, kernels, cfg, spec, dtype=None, *, spread: float = 1.5) -> Verdict:
    """The model's time follows the lone matmul's curve, up to one constant factor.

    At each measured size, the kernel's time at m = tokens in flight is scaled by the model's
    matmul weights over the kernel's weight (prefill records: m = batch x prompt length;
    decode records: m = batch), and the roofline's time is computed too. The model may run
    at a fixed multiple of either (its matrices are smaller, its other work adds a share):
    what matters is whether that multiple stays put as the size changes. The claim: the
    ratio measured / kernel-scaled varies by at most ``spread`` x across the sizes, or by no
    more than measured / roofline does (where the roofline's curve has the wrong shape, short
    prompts on a CPU, the kernel's must not); within the noise of the two sizes that set the
    spread (their records' and kernel points'), it cannot decide."""
    by_m = _by(kernels, "m")
    dtype = cfg.dtype if dtype is None else dtype
    rows = []
    for r in records:
        if getattr(r, "step_seconds", None) is not None:
            m, t, cost = r.batch, r.step_seconds, costs.decode_cost(cfg, r.batch, r.context)
        else:
            m, t, cost = r.batch * r.prompt_len, r.seconds, costs.prefill_cost(cfg, r.batch, r.prompt_len)
        k = by_m.get(m)
        if k is not None:
            rows.append((m, t / (k.seconds * cfg.matmul_params / (k.k * k.n)),
                         t / roofline.predict_time(cost, spec, dtype, overhead=True), (r, k)))
    _need(len(rows) >= 2, "pass records and a kernel sweep that share at least two sizes m")
    k_ratios, r_ratios = [x[1] for x in rows], [x[2] for x in rows]
    k_spread, r_spread = max(k_ratios) / min(k_ratios), max(r_ratios) / min(r_ratios)
    u = noise(*max(rows, key=lambda x: x[1])[3], *min(rows, key=lambda x: x[1])[3])
    return Verdict(f"the model's time follows the lone matmul's curve (measured / kernel-scaled varies by "
                   f"<= {spread:g}x, or less than measured / roofline)",
                   decide(k_spread, max(spread, r_spread), u, at_least=False),
                   "measured / kernel-scaled: " + ", ".join(f"m={m}: {k:.2f}" for m, k, _, _ in rows)
                   + f" (spread {k_spread:.2f}x); measured / roofline: " + ", ".join(f"{x:.2f}" for x in r_ratios)
                   + f" (spread {r_spread:.2f}x){_noise_note(u)}")


# ----------------------------------------------------------------------------- 03
def decode_step_mostly_not_math(records, *, max_share: float = 0.5) -> Verdict:
    """At most ``max_share`` of a batch-1 decode step can be spent on its FLOPs.

    Batch B multiplies a step's FLOPs by ~B (``F_B / F_1``) and its bytes by little. Whatever
    else a step spends its time on, it cannot take less than its math: if math took a share ``c``
    of the batch-1 step, the batch-B step takes at least ``c * t_1 * F_B / F_1``. So ``c <= (t_B /
    t_1) / (F_B / F_1)``, whether the step's costs add up or overlap (the roofline's max). Measured
    with the largest batch of the sweep (one context); a compute-bound batch-1 step would give 1.
    """
    by = _by(records, "batch")
    _need(1 in by and len(by) >= 2, "pass decode records at batch 1 and at least one larger batch (one context)")
    _need(len({r.context for r in by.values()}) == 1, "pass one context: the claim compares batch sizes")
    one, big = by[1], by[max(by)]
    t, f, b = (big.step_seconds / one.step_seconds, big.flops_per_step / one.flops_per_step,
               big.bytes_per_step / one.bytes_per_step)
    share, u = t / f, noise(one, big)
    return Verdict(f"at most {max_share:.0%} of a batch-1 decode step is spent on math",
                   decide(share, max_share, u, at_least=False),
                   f"batch 1 -> {big.batch}: FLOPs x{f:.1f}, bytes x{b:.2f}, time x{t:.2f}; compute-bound would be "
                   f"x{f:.1f}, bandwidth-bound x{b:.2f}; so math is at most {share:.0%} of the batch-1 step"
                   + _noise_note(u))


def step_streams_like_the_kernel(decode, kernels, *, fixed=None, min_fraction: float = 0.5) -> Verdict:
    """The batch-1 step moves its bytes at least ``min_fraction`` as fast as the matrix-vector
    kernel streams one large weight, timed in the same run: the step is bandwidth-bound at the
    rate its building block streams. The default is the log-midpoint between a step that is all
    its kernel's streaming (1) and one that is three quarters something else (0.25).

    ``fixed``: the step's hollow twin (the same layers and calls with almost no bytes, timed
    beside it), whose time is what the step costs whatever its bytes. Given, the step's bytes are
    rated over the step's time *minus* that: on a GPU a small model's step is mostly kernel
    launches, and the claim is then about the part the bytes set. The evidence gives the share."""
    _need(decode.batch == 1, "pass the batch-1 decode record")
    k1 = _by(kernels, "m").get(1)
    _need(k1 is not None, "pass a kernel sweep with m = 1 (measure.matmuls.matmul_sweep)")
    fixed_s = 0.0 if fixed is None else fixed.step_seconds
    _need(fixed_s < decode.step_seconds, "the hollow twin's step must be shorter than the model's")
    step_bw = decode.bytes_per_step / (decode.step_seconds - fixed_s)
    frac, u = step_bw / k1.weight_bytes_per_s, noise(decode, k1, *(() if fixed is None else (fixed,)))
    fixed_note = ("" if fixed is None else
                  f" (the step's {decode.step_seconds * 1e3:,.2f} ms minus its hollow twin's {fixed_s * 1e3:,.3f} ms: "
                  f"{fixed_s / decode.step_seconds:.0%} of the step is fixed costs)")
    return Verdict(f"a batch-1 decode step streams its bytes at >= {min_fraction:.0%} of the rate of the "
                   "matrix-vector kernel" + ("" if fixed is None else ", fixed costs aside"), decide(frac, min_fraction, u),
                   f"step: {decode.bytes_per_step / 1e6:,.0f} MB in {(decode.step_seconds - fixed_s) * 1e3:,.2f} ms"
                   f"{fixed_note} = {step_bw / 1e9:,.1f} GB/s; kernel {k1.describe()} at m = 1: "
                   f"{k1.weight_bytes_per_s / 1e9:,.1f} GB/s; {frac:.0%}" + _noise_note(u))


def context_costs_time(records, *, min_share: float = 0.5) -> Verdict:
    """At batch 1, a longer context makes each step slower by at least ``min_share`` of what
    its extra bytes would cost at the rate the step streams its weights: every cached token is
    read again at every step (the weights and the matmul FLOPs do not change; the attention's
    FLOPs grow with the context too, and the evidence gives both growths). If the KV cache cost
    nothing, the time would not move."""
    by = _by([r for r in records if r.batch == 1], "context")
    _need(len(by) >= 2, "pass batch-1 decode records at two or more contexts")
    lo, hi = by[min(by)], by[max(by)]
    t, b, f = (hi.step_seconds / lo.step_seconds, hi.bytes_per_step / lo.bytes_per_step,
               hi.flops_per_step / lo.flops_per_step)
    share, u = (t - 1) / (b - 1), noise(lo, hi)
    low, high = (t / u - 1) / (b - 1), (t * u - 1) / (b - 1)   # the share if the noise moved t either way
    holds = True if low >= min_share else (False if high < min_share else None)
    kv_rate = (hi.bytes_per_step - lo.bytes_per_step) / max(hi.step_seconds - lo.step_seconds, 1e-12)
    return Verdict("a longer context makes every decode step slower: the KV bytes cost time", holds,
                   f"context {lo.context} -> {hi.context}: bytes x{b:.2f}, FLOPs x{f:.2f}, time x{t:.2f} ({share:.1f}x "
                   f"what the extra bytes cost at the weights' rate, need >= {min_share:g}); the extra KV bytes cost "
                   f"{(hi.step_seconds - lo.step_seconds) * 1e3:,.2f} ms ({kv_rate / 1e9:,.1f} GB/s), the weights "
                   f"stream at {lo.bytes_per_step / lo.step_seconds / 1e9:,.1f} GB/s" + _noise_note(u))


# ----------------------------------------------------------------------------- 04
def three_regimes(ops) -> Verdict:
    """Small calls are overhead-bound, large streams bandwidth-bound, large matmuls compute-bound.

    ``ops``: rows with ``kind`` ("stream" or "matmul"), ``bytes``, ``flops``, ``seconds``
    (``lessons.arithmetic_intensity.regime_sweep``). Each regime predicts how time grows with
    the work: not at all (overhead), with the bytes (bandwidth), with the FLOPs (compute).
    """
    streams = sorted((o for o in ops if o.kind == "stream"), key=lambda o: o.bytes)
    mms = sorted((o for o in ops if o.kind == "matmul"), key=lambda o: o.flops)
    _need(len(streams) >= 4 and len(mms) >= 2, "pass a regime sweep: >= 4 stream sizes and >= 2 matmul sizes")
    a, b = streams[0], streams[1]
    small = (b.seconds / a.seconds) / (b.bytes / a.bytes)
    c, d = streams[-2], streams[-1]
    large = (d.seconds / c.seconds) / (d.bytes / c.bytes)
    e, f = mms[-2], mms[-1]
    comp = (f.seconds / e.seconds) / (f.flops / e.flops)
    # thresholds halfway (on a log scale) between the regimes' predictions: overhead ~0,
    # bandwidth 1 for streams; for matmuls compute 1 against bandwidth 0.25 (x4 the bytes for x64 FLOPs)
    holds = small <= 0.1 and large >= 0.5 and comp >= 0.4
    return Verdict("small calls cost a fixed time (overhead), large streams time in proportion to their bytes, "
                   "large matmuls in proportion to their FLOPs", holds,
                   f"stream {_b(a.bytes)} -> {_b(b.bytes)}: time x{b.seconds / a.seconds:.2f} for x{b.bytes / a.bytes:g} "
                   f"the bytes (growth {small:.3f}, need <= 0.1); stream {_b(c.bytes)} -> {_b(d.bytes)}: growth "
                   f"{large:.2f} (need >= 0.5); matmul x{f.flops / e.flops:g} the FLOPs: growth {comp:.2f} (need >= 0.4)")


def _b(n):
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.3g} {unit}"
    return f"{n:,.0f} B"


def phases_sit_under_their_roofs(prefill, decode, spec, dtype, *, prefill_reach: float = 0.25,
                                 decode_reach: float = 0.15, below_peak: float = 0.2) -> Verdict:
    """Each phase runs toward the roof over it, not the other's: the long prefill at
    ``prefill_reach`` or more of the compute peak (02's compute-bound MFU); the batch-1 decode step at
    ``decode_reach`` or more of its memory roof (intensity x read bandwidth; lower, as a batch-1 step
    also pays every kernel's launch) and below ``below_peak`` of the peak. Same model, same math
    units: only the intensity differs. A decode near the peak, or far below its memory roof
    (overhead-bound), fails; a phase above its roof (a wrong ceiling) cannot decide."""
    peak, bw = spec.peak_flops(dtype), spec.bandwidth
    p_rate = prefill.flops / prefill.seconds
    d_rate = decode.flops_per_step / decode.step_seconds
    d_roof = min(peak, decode.flops_per_step / decode.bytes_per_step * bw)
    u = noise(prefill, decode)
    holds = all_hold(decide(p_rate / peak, prefill_reach, u), decide(d_rate / d_roof, decode_reach, u),
                 decide(d_rate / peak, below_peak, u, at_least=False))
    # a phase above its roof proves the roof wrong (measured in a busy spell): no share of it can decide
    impossible = roofline.beats_ceiling(p_rate / u, peak) or roofline.beats_ceiling(d_rate / u, d_roof)
    return Verdict(f"prefill runs at >= {prefill_reach:.0%} of the compute peak; decode at >= {decode_reach:.0%} of "
                   f"its memory roof and below {below_peak:.0%} of the peak", None if impossible else holds,
                   f"prefill (T={prefill.prompt_len}) {p_rate / 1e9:,.1f} GFLOP/s = {p_rate / peak:.0%} of the "
                   f"{peak / 1e9:,.1f} GFLOP/s peak; decode (batch {decode.batch}) {d_rate / 1e9:,.1f} GFLOP/s = "
                   f"{d_rate / d_roof:.0%} of its memory roof ({d_roof / 1e9:,.1f} GFLOP/s at "
                   f"{decode.flops_per_step / decode.bytes_per_step:.2f} FLOP/byte) and {d_rate / peak:.0%} of the peak"
                   + _noise_note(u) + ("; a phase above its roof: a ceiling was measured in a busy spell, measure "
                                       "the ceilings again (notebook 00)" if impossible else ""))


# ----------------------------------------------------------------------------- 05 and 06
def predicted_batch_gain(batch: int, t1: float, tb: float) -> float:
    """The throughput gain a prediction of step times (batch 1 and ``batch``) implies: ``batch * t1 / tb``."""
    return batch * t1 / tb


def batching_raises_throughput(records, *, predicted_gain: float, predicted_by: str) -> Verdict:
    """The largest batch writes tokens faster than batch 1 by at least the log-midpoint between no
    gain and ``predicted_gain``, a gain predicted before the sweep (by the model's matmuls timed
    alone, or by the roofline on this machine's ceilings: ``predicted_by`` says which). One weight
    read serves every sequence of the batch; without that, there would be no gain."""
    by = _by(records, "batch")
    _need(1 in by and len(by) >= 2, "pass decode records at batch 1 and a larger batch")
    _need(predicted_gain > 1, "pass predicted_gain > 1: the gain the prediction allows at the largest batch")
    one, big = by[1], by[max(by)]
    gain, need, u = big.decode_tokens_per_s / one.decode_tokens_per_s, log_midpoint(predicted_gain), noise(one, big)
    return Verdict(f"batch {big.batch} writes >= {need:.1f}x the tokens/s of batch 1 (half the predicted "
                   f"x{predicted_gain:.1f}, on a log scale)", decide(gain, need, u),
                   f"{one.decode_tokens_per_s:,.0f} -> {big.decode_tokens_per_s:,.0f} tok/s (x{gain:.1f}) for a step "
                   f"x{big.step_seconds / one.step_seconds:.2f} longer; {predicted_by} predicted x{predicted_gain:.1f}"
                   + _noise_note(u))


def kernel_sets_the_knee(records, kernels, cfg, spec, dtype=None, *, apart: float = 1.25) -> Verdict:
    """Below the roofline's flip, the model's own matrices timed alone (``kernels``,
    ``measure.matmuls.model_matmuls_sweep``) predict its step growth from batch 1 better than the
    roofline (a few percent more bytes). On a 2-core CPU XLA switches from a matrix-vector to a
    matrix-matrix kernel, so the matmuls grow. Checked at the batch below the flip where the two
    predictions differ most (2 where the switch jumps, later where the cost creeps up): decided
    when they differ by more than ``apart`` x, holding if the model is nearer the kernels. Where
    they agree at every batch (a GPU: both flat), nothing tells them apart and the verdict says so."""
    by, kb = _by(records, "batch"), _by(kernels, "m")
    _need(1 in by and 2 in by and 1 in kb and 2 in kb, "pass model records and a kernel sweep with batch/m 1 and 2")
    context = by[1].context
    flip = roofline.predicted_flip(cfg, spec, dtype, context=context, include_kv=True)
    candidates = [b for b in sorted(by) if b >= 2 and b in kb and (flip is None or b < flip)] or [2]

    def err(x, y):
        return max(x / y, y / x)

    def growth(b):
        roof = (roofline.predicted_decode_step_seconds(cfg, spec, b, context, dtype) /
                roofline.predicted_decode_step_seconds(cfg, spec, 1, context, dtype))
        return by[b].step_seconds / by[1].step_seconds, kb[b].seconds / kb[1].seconds, roof

    b = max(candidates, key=lambda b: err(*growth(b)[1:]))
    model, kernel, roof = growth(b)
    u = noise(by[1], by[b], kb[1], kb[b])
    evidence = (f"step time x{model:.2f} (model), x{kernel:.2f} ({kb[1].describe()}, m 1 -> {b}), x{roof:.3f} "
                f"(roofline): the kernels are off by {err(model, kernel):.2f}x, the roofline by {err(model, roof):.2f}x"
                + _noise_note(u))
    claim = f"batch 1 -> {b}: the matmuls alone predict the model's step growth better than the roofline"
    if err(kernel, roof) < apart:
        return Verdict(claim, None, evidence + f"; the two predictions agree within {apart:g}x at every batch below "
                                               "the flip, so nothing tells them apart")
    return Verdict(claim, decide(err(model, roof) / err(model, kernel), 1.0, u), evidence)


# ----------------------------------------------------------------------------- 00
def decode_memory_bound_predicted(cfg, spec, dtype=None, *, batch: int = 1, context: int = 256) -> Prediction:
    """With this machine's measured ceilings (overhead included), which of the three terms of a
    decode step at ``batch`` is the largest, and by how much: a prediction notebooks 03 and 05 then
    measure (it holds by construction on any chip whose ridge is above a decode step's intensity,
    so it is printed, never asserted)."""
    dtype = cfg.dtype if dtype is None else dtype
    cost = costs.decode_cost(cfg, batch, context)
    compute, memory = roofline.predict_terms(cost, spec, dtype)
    fixed = roofline.overhead_seconds(spec)
    terms = {"memory": memory, "compute": compute, "overhead": fixed}
    first = max(terms, key=terms.get)
    second = max((k for k in terms if k != first), key=terms.get)
    return Prediction(f"a decode step at batch {batch} is {first}-bound here, {terms[first] / terms[second]:,.1f}x "
                      f"over its {second} term",
                      f"memory {memory * 1e3:,.3g} ms, compute {compute * 1e3:,.3g} ms, overhead {fixed * 1e3:,.3g} ms "
                      f"at context {context} (intensity {cost.intensity:.2f} FLOP/byte against a ridge of "
                      f"{spec.ridge_point(dtype):.1f})")


# ----------------------------------------------------------------------------- 08
def verify_ratio(verifies, batch: int, tokens: int):
    """(a verify of ``tokens`` tokens over a one-token step at ``batch``, measured; the one-token
    record; the ``tokens`` record), from verify records (``batch``, ``tokens``, ``seconds``)."""
    by = {(r.batch, r.tokens): r for r in verifies}
    one, many = by.get((batch, 1)), by.get((batch, tokens))
    _need(one and many, f"pass verify records at batch {batch} for 1 and {tokens} tokens")
    return many.seconds / one.seconds, one, many


def verify_costs_about_one_step(verifies, k: int, *, predicted: float, matmuls=()) -> Verdict:
    """Checking ``k`` guesses (a verify of ``k + 1`` tokens per row, batch 1) costs about one decode
    step, not ``k + 1``: the tokens share the weight read. Holds if the measured ratio is at most
    the log-midpoint between the expected one and ``k + 1``. Expected: ``predicted``, the roofline's,
    or where ``matmuls`` (the weight matrices alone at 1 and ``k + 1`` rows, same rounds) say more,
    the step plus their extra rows' cost (a CPU's one-row kernel is not its several-row one).
    Matmuls alone past halfway to ``k + 1`` steps (log scale) leave no room to see it: undecided."""
    _need(k >= 1 and 1.0 <= predicted < k + 1, "k must be at least 1, predicted the roofline's ratio in 1..k+1")
    ratio, one, many = verify_ratio(verifies, 1, k + 1)
    expected, u, kernels = predicted, noise(one, many), ""
    if matmuls:
        lone, rows = (_by(matmuls, "m").get(m) for m in (1, k + 1))
        _need(lone and rows, f"pass the model's matmuls timed at 1 and {k + 1} rows")
        alone = 1 + (rows.seconds - lone.seconds) / one.seconds
        expected, u = max(predicted, alone), noise(one, many, lone, rows)
        kernels = (f"; the model's matmuls alone: {lone.seconds * 1e3:,.3f} ms at 1 row, {rows.seconds * 1e3:,.3f} "
                   f"ms at {k + 1} (x{rows.seconds / lone.seconds:.2f}), so a step plus their extra rows is "
                   f"x{alone:.2f} a step")
    evidence = (f"1 token: {one.seconds * 1e3:,.3f} ms, {k + 1} tokens: {many.seconds * 1e3:,.3f} ms: "
                f"x{ratio:.2f} (the roofline: x{predicted:.2f}{kernels})" + _noise_note(u))
    if expected > log_midpoint(k + 1):
        return Verdict(f"a verify of {k + 1} tokens costs about one decode step: its matmuls alone cost x{expected:.2f} "
                       f"a step here, past halfway to {k + 1}: no room to see the shared weight read", None, evidence)
    need = log_midpoint(expected, k + 1)
    return Verdict(f"a verify of {k + 1} tokens costs at most {need:.2f} decode steps (between the expected "
                   f"{expected:.2f} and the {k + 1} of a step per token, on a log scale)",
                   decide(ratio, need, u, at_least=False), evidence)


def speedup_as_predicted(plain, speculative, *, predicted: float, min_effect: float = 1.25,
                         moved: float = 1.0, roofline: float | None = None) -> Verdict:
    """Speculative decoding changes decode's speed as the cost model predicted, made before the run
    from the measured acceptance and step times: a predicted speed-up of at least ``min_effect``
    must reach the log-midpoint between no change and ``predicted``, a predicted slow-down (at most
    ``1 / min_effect``) the log-midpoint the other way. A prediction in between has no effect to
    test; given the ``roofline``'s prediction, ``min_effect`` or more apart from it, the run must
    then fall on the measured steps' side of their log-midpoint (what the roofline leaves out is
    what decides), else undecided. The text is checked apart (speculation never changes it).

    ``moved``: :func:`drift` between the prediction and the same one made again from the steps
    timed beside the generations (a load that changed since): it widens the noise allowance."""
    _need(plain.draft is None and speculative.draft is not None, "pass the plain record, then a speculative one")
    _need(plain.batch == speculative.batch and plain.new_tokens == speculative.new_tokens,
          "pass records of the same prompts and lengths")
    _need(moved >= 1, "moved must be a factor >= 1 (claims.drift)")
    gain = plain.seconds / speculative.seconds
    u = noise(plain, speculative)
    evidence = (f"plain {plain.tokens_per_s:,.1f} tok/s, {speculative.draft} k={speculative.k} "
                f"{speculative.tokens_per_s:,.1f} tok/s: x{gain:.2f} (predicted x{predicted:.2f}; "
                f"{speculative.tokens_per_step:.2f} tokens per target step, acceptance in this run "
                f"{speculative.acceptance:.0%})" + _noise_note(u, moved))
    u *= moved
    need, what = log_midpoint(predicted), f"speculation ({speculative.draft}, k={speculative.k})"
    if predicted >= min_effect:
        return Verdict(f"{what} writes at least x{need:.2f} the tokens/s of plain decode (half the predicted "
                       f"x{predicted:.2f}, on a log scale)", decide(gain, need, u), evidence)
    if predicted <= 1 / min_effect:
        return Verdict(f"{what} is slower than plain decode: at most x{need:.2f} its tokens/s (half the predicted "
                       f"x{predicted:.2f}, on a log scale)", decide(gain, need, u, at_least=False), evidence)
    if roofline is not None and max(roofline / predicted, predicted / roofline) >= min_effect:
        mid = log_midpoint(predicted, roofline)
        return Verdict(f"{what} runs nearer the measured steps' x{predicted:.2f} than the roofline's x{roofline:.2f}: "
                       f"{'at most' if roofline > predicted else 'at least'} x{mid:.2f} (their log-midpoint)",
                       decide(gain, mid, u, at_least=roofline < predicted), evidence)
    return Verdict(f"the cost model predicts x{predicted:.2f}: too close to plain decode to test", None, evidence)


def verification_stops_being_free(verifies, k: int, *, predicted_small: float, predicted_large: float, min_effect:
                                  float = 1.25, nearly_free: float = 1.5, predicted_by="the roofline") -> Verdict:
    """At a large batch a verify of ``k + 1`` tokens per row costs more decode steps than at batch
    1: the batch's tokens already use the compute that made checking guesses free, so speculation
    and batching spend the same idle FLOPs. ``predicted_small`` / ``predicted_large``: the
    verify / step ``predicted_by`` predicts at the smallest and largest batch. Holds if the
    measured ratio grows by at least the log-midpoint of the predicted growth. Undecided where the
    roofline predicts less than ``min_effect`` of growth at these batches (the knee is further out),
    or where the verify is not nearly free even at the smallest batch (its ratio more than
    ``nearly_free`` times the roofline's): then there is no idle compute to use up."""
    batches = sorted({r.batch for r in verifies})
    _need(len(batches) >= 2, "pass verify records at two batches or more")
    small, large = (verify_ratio(verifies, b, k + 1)[0] for b in (batches[0], batches[-1]))
    growth, predicted = large / small, predicted_large / predicted_small
    u = noise(*[r for r in verifies if r.batch in (batches[0], batches[-1]) and r.tokens in (1, k + 1)])
    evidence = (f"verify of {k + 1} tokens / step: x{small:.2f} at batch {batches[0]}, x{large:.2f} at batch "
                f"{batches[-1]} (grew x{growth:.2f}; {predicted_by}: x{predicted_small:.2f} -> x{predicted_large:.2f}, "
                f"growth x{predicted:.2f})" + _noise_note(u))
    if predicted < min_effect:
        return Verdict(f"predicted by {predicted_by}, verification stays nearly free up to batch {batches[-1]}: "
                       "nothing to test", None, evidence)
    if small > nearly_free * predicted_small:
        return Verdict(f"checking {k} guesses is not nearly free even at batch {batches[0]} here (x{small:.2f} a step, "
                       f"more than {nearly_free:g}x the predicted x{predicted_small:.2f}): the batch has no idle "
                       "compute left to use up, so the growth cannot show", None, evidence)
    need = log_midpoint(predicted)
    return Verdict(f"from batch {batches[0]} to {batches[-1]} a verify of {k + 1} tokens grows at least x{need:.2f} "
                   f"more costly against a decode step (half the growth predicted by {predicted_by}, on a log scale)",
                   decide(growth, need, u), evidence)
