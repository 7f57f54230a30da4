"""The lessons' claims as functions over measurements: each returns a :class:`Verdict`.

A notebook measures, calls the claim on what it measured, prints the verdict (the claim, and
the numbers that decide it) and ``assert``s it. Every claim here could come out false: each
compares measurements that two explanations predict *differently* (time that follows the
FLOPs against time that follows the bytes, say), and ``tests/test_claims.py`` feeds each one
synthetic records where the claim is false and checks that it says so.

Records are read by attribute (:class:`~inference_lab.measure.records.PrefillRecord`,
:class:`~inference_lab.measure.records.DecodeRecord`, :class:`~inference_lab.measure.matmuls.KernelPoint`
or anything with the same fields), so a claim can be checked on a classroom's files too.
Thresholds are wide on purpose: a 2-core machine shared with other programs is noisy, and a
claim should survive noise yet fail when the physics is different.
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


# ----------------------------------------------------------------------------- 01 and 06
def writing_slower_than_reading(prefill, decode, *, factor: float = 2.0) -> Verdict:
    """Per token, decode at batch 1 is at least ``factor`` times slower than prefill."""
    _need(getattr(decode, "batch", 1) == 1, "pass the batch-1 decode record: the claim is about one stream")
    ratio = prefill.prefill_tokens_per_s / decode.decode_tokens_per_s
    return Verdict(f"writing (decode, batch 1) is at least {factor:g}x slower per token than reading (prefill)",
                   ratio >= factor,
                   f"prefill {prefill.prefill_tokens_per_s:,.0f} tok/s (prompt {prefill.prompt_len}), decode "
                   f"{decode.decode_tokens_per_s:,.1f} tok/s: {ratio:,.1f}x")


def cache_saving_as_predicted(lengths, uncached_s, cached_s, predicted_uncached_s, *, visible: float = 2.0) -> Verdict:
    """Without the KV cache every step runs the model over the whole text so far; with it, over
    one new token. Whether that difference shows on the clock is predicted first: it shows when
    the roofline's time of a forward over the longest text is more than ``visible`` times the
    measured cached step (which, for a small model, is mostly the fixed cost of the calls).

    Predicted to show: holds if the last quarter's steps without the cache take at least
    ``visible`` times those with it. Predicted not to show (a GPU, say, where this small model's
    forward is all launch overhead): holds if they take less than ``2 * visible`` times."""
    _need(len(lengths) == len(uncached_s) == len(cached_s) == len(predicted_uncached_s) >= 8,
          "pass one length, uncached time, cached time and predicted time per step, at least 8 steps")
    q = max(2, len(lengths) // 4)
    cached_step = statistics.median(cached_s[1:])          # the first cached step is the prefill
    show = predicted_uncached_s[-1] > visible * cached_step
    ratio = statistics.median(uncached_s[-q:]) / statistics.median(cached_s[-q:])
    growth = statistics.median(uncached_s[-q:]) / statistics.median(uncached_s[1:q + 1])
    evidence = (f"predicted forward over {lengths[-1]} tokens {predicted_uncached_s[-1] * 1e3:,.3g} ms vs measured "
                f"cached step {cached_step * 1e3:,.3g} ms, so the saving should {'' if show else 'not '}show; "
                f"last {q} steps: without the cache {ratio:,.2f}x the cached time (it grew {growth:,.2f}x "
                f"from the first steps)")
    if show:
        return Verdict(f"without the KV cache a step costs at least {visible:g}x a cached one by the end",
                       ratio >= visible, evidence)
    return Verdict(f"this model is too small for the cache's saving to show here: both steps within "
                   f"{2 * visible:g}x", ratio < 2 * visible, evidence)


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
    return Verdict(f"fixed costs are at least {factor:g}x more of the {small.bytes_per_step / 1e6:,.1f} MB model's "
                   f"decode step than of the {large.bytes_per_step / 1e6:,.0f} MB model's", s >= factor * b,
                   f"hollow twin / model: {s:.0%} of the small model's step ({small_hollow.step_seconds * 1e3:,.3f} of "
                   f"{small.step_seconds * 1e3:,.3f} ms), {b:.1%} of the large one's "
                   f"({large_hollow.step_seconds * 1e3:,.3f} of {large.step_seconds * 1e3:,.2f} ms): {s / b:,.1f}x")


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
    holds = short <= 0.5 and long_ >= 0.6 and (mfu is None or mfu >= min_mfu)
    return Verdict("prefill is bound by its weight bytes (or overhead) for short prompts and by compute for long ones",
                   holds,
                   f"T {T[0]}->{T[j]}: time x{recs[j].seconds / recs[0].seconds:.2f} for tokens x{T[j] / T[0]:g} "
                   f"(growth {short:.2f}, need <= 0.5); T {T[-2]}->{T[-1]}: time "
                   f"x{recs[-1].seconds / recs[-2].seconds:.2f} for tokens x{T[-1] / T[-2]:g} (growth {long_:.2f}, "
                   f"need >= 0.6); MFU at T={T[-1]}: " + ("-" if mfu is None else f"{mfu:.0%} (need >= {min_mfu:.0%})"))


def model_follows_kernel(records, kernels, cfg, spec, dtype=None, *, spread: float = 1.5) -> Verdict:
    """The model's time follows the lone matmul's curve, up to one constant factor.

    At each measured size, the kernel's time at m = tokens in flight is scaled by the model's
    matmul weights over the kernel's weight (prefill records: m = batch x prompt length;
    decode records: m = batch), and the roofline's time is computed too. The model may run
    at a fixed multiple of either (its matrices are smaller, its other work adds a share):
    what matters is whether that multiple stays put as the size changes. The claim: the
    ratio measured / kernel-scaled varies by at most ``spread`` x across the sizes, or by no
    more than measured / roofline does. Where the roofline's curve has the wrong shape (short
    prompts on a CPU), the kernel's must not.
    """
    by_m = _by(kernels, "m")
    dtype = cfg.dtype if dtype is None else dtype
    rows = []
    for r in records:
        if getattr(r, "step_seconds", None) is not None:
            m, t = r.batch, r.step_seconds
            cost = costs.decode_cost(cfg, r.batch, r.context)
        else:
            m, t = r.batch * r.prompt_len, r.seconds
            cost = costs.prefill_cost(cfg, r.batch, r.prompt_len)
        k = by_m.get(m)
        if k is not None:
            rows.append((m, t / (k.seconds * cfg.matmul_params / (k.k * k.n)),
                         t / roofline.predict_time(cost, spec, dtype, overhead=True)))
    _need(len(rows) >= 2, "pass records and a kernel sweep that share at least two sizes m")
    k_ratios, r_ratios = [x[1] for x in rows], [x[2] for x in rows]
    k_spread, r_spread = max(k_ratios) / min(k_ratios), max(r_ratios) / min(r_ratios)
    return Verdict(f"the model's time follows the lone matmul's curve (measured / kernel-scaled varies by "
                   f"<= {spread:g}x, or less than measured / roofline)", k_spread <= spread or k_spread <= r_spread,
                   "measured / kernel-scaled: " + ", ".join(f"m={m}: {k:.2f}" for m, k, _ in rows)
                   + f" (spread {k_spread:.2f}x); measured / roofline: " + ", ".join(f"{x:.2f}" for x in r_ratios)
                   + f" (spread {r_spread:.2f}x)")


# ----------------------------------------------------------------------------- 03
def decode_step_mostly_not_math(records, *, max_share: float = 0.5) -> Verdict:
    """At most ``max_share`` of a batch-1 decode step can be spent on its FLOPs.

    Batch B multiplies a step's FLOPs by ~B but its bytes by little. If the batch-1 step
    were all math (compute-bound), batch B would take ~B times as long. Whatever the extra
    time ``t_B - t_1`` is, it is at most what the extra FLOPs cost, so the share of the
    batch-1 step that FLOPs can explain is at most ``(t_B / t_1 - 1) / (F_B / F_1 - 1)``.
    Measured with the largest batch of the sweep (one context).
    """
    by = _by(records, "batch")
    _need(1 in by and len(by) >= 2, "pass decode records at batch 1 and at least one larger batch (one context)")
    _need(len({r.context for r in by.values()}) == 1, "pass one context: the claim compares batch sizes")
    one, big = by[1], by[max(by)]
    t, f, b = (big.step_seconds / one.step_seconds, big.flops_per_step / one.flops_per_step,
               big.bytes_per_step / one.bytes_per_step)
    share = (t - 1) / (f - 1)
    return Verdict(f"at most {max_share:.0%} of a batch-1 decode step is spent on math",
                   share <= max_share,
                   f"batch 1 -> {big.batch}: FLOPs x{f:.1f}, bytes x{b:.2f}, time x{t:.2f}; compute-bound would be "
                   f"x{f:.1f}, bandwidth-bound x{b:.2f}; so FLOPs explain at most {share:.0%} of the batch-1 step")


def step_streams_like_the_kernel(decode, kernels, *, min_fraction: float = 0.25) -> Verdict:
    """The batch-1 step moves its bytes at least ``min_fraction`` as fast as the matrix-vector
    kernel streams one large weight, timed in the same run: the step is bandwidth-bound at the
    rate its building block streams (an overhead- or compute-bound step would fall far short)."""
    _need(decode.batch == 1, "pass the batch-1 decode record")
    k1 = _by(kernels, "m").get(1)
    _need(k1 is not None, "pass a kernel sweep with m = 1 (measure.matmuls.matmul_sweep)")
    step_bw = decode.bytes_per_step / decode.step_seconds
    frac = step_bw / k1.weight_bytes_per_s
    return Verdict(f"a batch-1 decode step streams its bytes at >= {min_fraction:.0%} of the rate of the matrix-vector kernel",
                   frac >= min_fraction,
                   f"step: {decode.bytes_per_step / 1e6:,.0f} MB in {decode.step_seconds * 1e3:,.2f} ms = "
                   f"{step_bw / 1e9:,.1f} GB/s; kernel {k1.describe()} at m = 1: "
                   f"{k1.weight_bytes_per_s / 1e9:,.1f} GB/s; {frac:.0%}")


def context_costs_time(records, *, min_share: float = 0.5) -> Verdict:
    """At batch 1, a longer context makes each step slower by at least ``min_share`` of what
    its extra bytes would cost at the rate the step streams its weights: every cached token is
    read again at every step (the weights and the matmul FLOPs do not change). If the KV cache
    cost nothing, the time would not move."""
    by = _by([r for r in records if r.batch == 1], "context")
    _need(len(by) >= 2, "pass batch-1 decode records at two or more contexts")
    lo, hi = by[min(by)], by[max(by)]
    t, b = hi.step_seconds / lo.step_seconds, hi.bytes_per_step / lo.bytes_per_step
    share = (t - 1) / (b - 1)
    kv_rate = (hi.bytes_per_step - lo.bytes_per_step) / max(hi.step_seconds - lo.step_seconds, 1e-12)
    return Verdict("a longer context makes every decode step slower: the KV bytes cost time",
                   share >= min_share,
                   f"context {lo.context} -> {hi.context}: bytes x{b:.2f}, time x{t:.2f} ({share:.1f}x what the extra "
                   f"bytes cost at the weights' rate, need >= {min_share:g}); the extra KV bytes cost "
                   f"{(hi.step_seconds - lo.step_seconds) * 1e3:,.2f} ms ({kv_rate / 1e9:,.1f} GB/s), the weights "
                   f"stream at {lo.bytes_per_step / lo.step_seconds / 1e9:,.1f} GB/s")


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


def prefill_beats_decode_flops(prefill, decode, *, factor: float = 3.0) -> Verdict:
    """A long prefill achieves ``factor`` x the FLOP/s of a batch-1 decode step on the same
    machine: same model, same math units, the intensity differs."""
    p, d = prefill.flops / prefill.seconds, decode.flops_per_step / decode.step_seconds
    return Verdict(f"prefill (T={prefill.prompt_len}) achieves >= {factor:g}x the FLOP/s of decode at batch {decode.batch}",
                   p >= factor * d, f"{p / 1e9:,.1f} vs {d / 1e9:,.1f} GFLOP/s: {p / d:,.1f}x")


# ----------------------------------------------------------------------------- 05 and 06
def batching_raises_throughput(records, *, factor: float = 2.0) -> Verdict:
    """The largest batch writes at least ``factor`` x the tokens/s of batch 1 (one weight read
    serves every sequence of the batch)."""
    by = _by(records, "batch")
    _need(1 in by and len(by) >= 2, "pass decode records at batch 1 and a larger batch")
    one, big = by[1], by[max(by)]
    gain = big.decode_tokens_per_s / one.decode_tokens_per_s
    return Verdict(f"batch {big.batch} writes >= {factor:g}x the tokens/s of batch 1", gain >= factor,
                   f"{one.decode_tokens_per_s:,.0f} -> {big.decode_tokens_per_s:,.0f} tok/s (x{gain:.1f}) for a step "
                   f"x{big.step_seconds / one.step_seconds:.2f} longer")


def kernel_sets_the_knee(records, kernels, cfg, spec, dtype=None, *, agree: float = 1.5) -> Verdict:
    """From batch 1 to 2, matmul kernels timed alone (``kernels``: the model's own matrices from
    ``experiments.model_matmuls_sweep``, or one large matmul) predict how the model's step
    grows, within ``agree`` x and at least as well as the roofline does.

    The roofline says one more sequence adds a few percent of bytes, so the step barely grows
    (until the flip). A real machine's kernels can say otherwise: on a 2-core CPU XLA switches
    from a matrix-vector to a matrix-matrix kernel and the step jumps; on a GPU the kernel,
    the model and the roofline all stay flat. Either way the claim holds if the kernel alone,
    timed at m = 1 and 2, tells the model's ratio t(2)/t(1); it fails when the model jumps and
    the kernel does not (or the reverse): then something else moves the knee.
    """
    by, kb = _by(records, "batch"), _by(kernels, "m")
    _need(1 in by and 2 in by and 1 in kb and 2 in kb, "pass model records and a kernel sweep with batch/m 1 and 2")
    context = by[1].context
    model = by[2].step_seconds / by[1].step_seconds
    kernel = kb[2].seconds / kb[1].seconds
    roof = (roofline.predicted_decode_step_seconds(cfg, spec, 2, context, dtype) /
            roofline.predicted_decode_step_seconds(cfg, spec, 1, context, dtype))

    def err(x, y):
        return max(x / y, y / x)

    # "at least as well": up to 10%, the noise of two medians when nothing jumps at all
    holds = err(model, kernel) <= agree and err(model, kernel) <= max(err(model, roof), 1.1)
    return Verdict(f"batch 1 -> 2: the matmuls alone predict the model's step growth within {agree:g}x, "
                   "at least as well as the roofline", holds,
                   f"step time x{model:.2f} (model), x{kernel:.2f} ({kb[1].describe()}, m 1 -> 2), x{roof:.3f} (roofline): "
                   f"the kernel is off by {err(model, kernel):.2f}x, the roofline by {err(model, roof):.2f}x")


def latency_throughput_tradeoff(records, *, total_gain: float = 2.0, per_user_loss: float = 0.6) -> Verdict:
    """Batching buys total tokens/s with every user's speed: at the largest batch the total
    is >= ``total_gain`` x batch 1 while each sequence gets <= ``per_user_loss`` x the
    tokens/s it had alone."""
    by = _by(records, "batch")
    _need(1 in by and len(by) >= 2, "pass decode records at batch 1 and a larger batch")
    one, big = by[1], by[max(by)]
    total = big.decode_tokens_per_s / one.decode_tokens_per_s
    user = (big.decode_tokens_per_s / big.batch) / one.decode_tokens_per_s
    return Verdict("a bigger batch raises total tokens/s and lowers each user's tokens/s",
                   total >= total_gain and user <= per_user_loss,
                   f"batch 1 -> {big.batch}: total x{total:.1f} (need >= {total_gain:g}), per user x{user:.2f} "
                   f"(need <= {per_user_loss:g}): {one.decode_tokens_per_s:,.0f} -> "
                   f"{big.decode_tokens_per_s / big.batch:,.1f} tok/s each")


# ----------------------------------------------------------------------------- 00
def decode_memory_bound_predicted(cfg, spec, dtype=None, *, batch: int = 1, context: int = 256,
                                  margin: float = 3.0) -> Verdict:
    """With this machine's measured ceilings (overhead included), the memory term of a decode
    step at ``batch`` is the largest, by ``margin`` x over the next one."""
    dtype = cfg.dtype if dtype is None else dtype
    cost = costs.decode_cost(cfg, batch, context)
    compute, memory = roofline.predict_terms(cost, spec, dtype)
    fixed = roofline.overhead_seconds(spec)
    nxt = max(compute, fixed)
    return Verdict(f"predicted here: a decode step at batch {batch} is memory-bound by >= {margin:g}x",
                   memory >= margin * nxt and math.isfinite(memory),
                   f"memory {memory * 1e3:,.3g} ms, compute {compute * 1e3:,.3g} ms, overhead {fixed * 1e3:,.3g} ms "
                   f"({roofline.regime(cost, spec, dtype)}-bound)")
