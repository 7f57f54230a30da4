"""Notebook 01, one model, two speeds: the trained model writing an answer token by token
(TTFT, then one decode step per token), what the KV cache saves, the same request's prefill and
decode timed here, the roofline's ideal gap beside the measured one, and the reference node the
course starts from."""

from __future__ import annotations

import dataclasses
import statistics

from inference_lab import plots
from inference_lab.analytic import costs, roofline
from inference_lab.base import hardware
from inference_lab.base.config import ModelConfig
from inference_lab.measure import records, timing
from inference_lab.runtime import streaming

PROMPT = "ROMEO:\nWhat light through yonder window breaks?\n\nJULIET:\n"


REFERENCE_NODE = {
    "name": "Qwen3.5-27B, 4xH100, TP=4",
    "prefill_tokens_per_s": 3288.0,
    "decode_tokens_per_s": 108.0,
    "source": "a 27B model measured on a 4xH100 node with tensor parallelism (how each figure was taken is "
              "not recorded: see reference_readings)",
}
RAG_MIX = (19, 47)   # prompt tokens per output token in the node's real RAG traffic

# The reference model's exact layout does not enter the reconciliation: this is a Llama-style
# dense shape of the same size (the GQA layout of recent 27-32B dense models). Its weight bytes
# and FLOPs per token, which set the ceilings at batch 1, match the real model's to a few percent;
# its KV cache does not (see QWEN35_27B).
REFERENCE_SHAPE = ModelConfig(name="dense_27b (assumed shape)", vocab_size=151_936, d_model=5120, n_layers=64,
                              n_heads=40, n_kv_heads=8, head_dim=128, d_ff=22_016, max_seq_len=32_768,
                              rope_theta=1_000_000.0, tie_embeddings=False, dtype="bfloat16")
REFERENCE_TP = 4
REFERENCE_CONTEXT = 4096  # prompt length assumed for the ceilings (a RAG request's order of size)

# What Qwen3.5-27B really is, from its published configuration (Hugging Face `Qwen/Qwen3.5-27B`,
# config.json `text_config`, as its model card and derived quantisations report it): a hybrid.
QWEN35_27B = {
    "layers": 64, "full_attention_layers": 16, "linear_attention_layers": 48,   # 3 Gated DeltaNet : 1 full
    "d_model": 5120, "d_ff": 17_408, "vocab": 248_320,
    "q_heads": 24, "kv_heads": 4, "head_dim": 256,      # the full-attention layers (grouped-query attention)
    "mtp_layers": 1,                                    # a multi-token-prediction head, for speculative decoding
    "source": "Qwen/Qwen3.5-27B config.json (text_config: layer_types, full_attention_interval 4, "
              "num_key_value_heads 4, head_dim 256, mtp_num_hidden_layers 1)",
}


def qwen35_kv_bytes_per_token(dtype_bytes: int = 2) -> int:
    """KV-cache bytes per token of the real model: only its full-attention layers keep one (the
    Gated DeltaNet layers keep a fixed-size state per sequence instead, whatever the context)."""
    q = QWEN35_27B
    return 2 * q["full_attention_layers"] * q["kv_heads"] * q["head_dim"] * dtype_bytes


def reference_shape_note() -> str:
    """Where the dense stand-in is right and where it is wrong, in numbers."""
    cfg, q = REFERENCE_SHAPE, QWEN35_27B
    dense_kv, real_kv = costs.kv_bytes_per_token(cfg), qwen35_kv_bytes_per_token()
    return (f"stand-in: {cfg.num_params / 1e9:.1f}B dense parameters, {cfg.n_layers} attention layers with "
            f"{cfg.n_kv_heads} KV heads of {cfg.head_dim}: {dense_kv // 1024} KiB of KV cache per token\n"
            f"Qwen3.5-27B: {q['layers']} layers, of which {q['full_attention_layers']} full attention "
            f"({q['kv_heads']} KV heads of {q['head_dim']}) and {q['linear_attention_layers']} Gated DeltaNet "
            f"(linear attention: a fixed-size state per sequence), plus {q['mtp_layers']} multi-token-prediction "
            f"layer: {real_kv // 1024} KiB of KV cache per token, {dense_kv / real_kv:.0f}x less\n"
            f"so the stand-in is right for what sets batch-1 speeds (weight bytes and FLOPs per token) and "
            f"wrong for KV bytes and per-sequence state: it overstates the KV cache's memory and reads "
            f"{dense_kv / real_kv:.0f}x, and has no DeltaNet state ({q['source']})")


@dataclasses.dataclass(frozen=True)
class Gap:
    """Prefill against decode tokens/s at batch 1, measured and as the ceilings allow.

    ``ideal`` = roofline prefill tok/s over roofline decode tok/s. Whatever the timings, the
    measured gap is ``ideal * mfu / mbu``: prefill's share of its ceiling over decode's
    share of its own (the prefill is compute-bound, the decode memory-bound, on any chip
    whose ridge lies between their intensities)."""

    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    prefill_ceiling: float  # roofline tok/s
    decode_ceiling: float

    @property
    def measured(self) -> float:
        return self.prefill_tokens_per_s / self.decode_tokens_per_s

    @property
    def ideal(self) -> float:
        return self.prefill_ceiling / self.decode_ceiling

    @property
    def mfu(self) -> float:  # of the roofline's prefill figure
        return self.prefill_tokens_per_s / self.prefill_ceiling

    @property
    def mbu(self) -> float:  # of the roofline's decode figure
        return self.decode_tokens_per_s / self.decode_ceiling

    def decode_share(self, prompt_tokens: float, output_tokens: float) -> float:
        """Share of one request's time spent writing, at these measured speeds."""
        pre, dec = prompt_tokens / self.prefill_tokens_per_s, output_tokens / self.decode_tokens_per_s
        return dec / (pre + dec)

    def table(self, name: str) -> str:
        rows = [("", "ceiling (roofline)", "measured", "share of ceiling"),
                ("prefill tok/s", f"{self.prefill_ceiling:,.0f}", f"{self.prefill_tokens_per_s:,.0f}",
                 f"{self.mfu:.1%} (MFU)"),
                ("decode tok/s, batch 1", f"{self.decode_ceiling:,.1f}", f"{self.decode_tokens_per_s:,.1f}",
                 f"{self.mbu:.1%} (MBU)"),
                ("gap (prefill / decode)", f"{self.ideal:,.1f}x", f"{self.measured:,.1f}x",
                 f"= {self.ideal:,.1f} x {self.mfu:.3f} / {self.mbu:.3f}")]
        return f"{name}\n" + "\n".join(f"{a:<24}{b:>20}{c:>12}   {d}" for a, b, c, d in rows)


def gap(prefill_tokens_per_s, decode_tokens_per_s, cfg, spec, *, prompt_len: int, tp: int = 1, dtype=None) -> Gap:
    """The measured speeds beside the roofline's, for one request of ``prompt_len`` tokens."""
    return Gap(prefill_tokens_per_s, decode_tokens_per_s,
               roofline.predicted_prefill_tokens_per_s(cfg, spec, 1, prompt_len, dtype, tp=tp),
               roofline.predicted_decode_tokens_per_s(cfg, spec, 1, prompt_len, dtype, tp=tp))


def reference_gap() -> Gap:
    """The reference node's measured speeds against the ceilings of 4 H100s (datasheet) for
    :data:`REFERENCE_SHAPE` split 4 ways, at :data:`REFERENCE_CONTEXT` tokens."""
    return gap(REFERENCE_NODE["prefill_tokens_per_s"], REFERENCE_NODE["decode_tokens_per_s"], REFERENCE_SHAPE,
               hardware.PRESETS["H100_SXM"], prompt_len=REFERENCE_CONTEXT, tp=REFERENCE_TP)


def reference_decode_step() -> str:
    """Reading A's decode step on the node, split into what the roofline and the all-reduces
    account for and what is left."""
    h100 = hardware.PRESETS["H100_SXM"]
    step = 1 / REFERENCE_NODE["decode_tokens_per_s"]
    read = roofline.predicted_decode_step_seconds(REFERENCE_SHAPE, h100, 1, REFERENCE_CONTEXT, tp=REFERENCE_TP)
    reduce = roofline.allreduce_time(REFERENCE_SHAPE, h100, 1, tp=REFERENCE_TP)
    rest = step - read - reduce
    n = 2 * REFERENCE_SHAPE.n_layers
    return (f"decode at {REFERENCE_NODE['decode_tokens_per_s']:.0f} tok/s: a {step * 1e3:.2f} ms step; the weights and KV "
            f"read at the datasheet bandwidth take {read * 1e3:.2f} ms (the roofline), the {n} all-reduces "
            f"(two per layer, {h100.allreduce_latency_s * 1e6:.0f} us each at this size) {reduce * 1e3:.2f} ms; "
            f"{rest * 1e3:.2f} ms ({rest / step:.0%}) is left for kernels streaming below the bandwidth, launches, "
            f"sampling and the serving engine")


def reference_readings() -> str:
    """The reference node's two figures, read the two ways they can have been measured, and what each
    reading implies. Which one is right is not recorded."""
    ref = reference_gap()
    lo, hi = RAG_MIX
    mix = (lo * hi) ** 0.5
    return "\n".join([
        f"reading A, two speeds (prefill tok/s while prefilling; decode tok/s of one stream): writing is "
        f"{ref.measured:.1f}x slower per token; prefill ran at {ref.mfu:.1%} of the node's compute ceiling "
        f"and decode at {ref.mbu:.1%} of its bandwidth ceiling; a {lo}:1 request served alone spends "
        f"{ref.decode_share(lo, 1):.0%} of its time writing, a {hi}:1 one {ref.decode_share(hi, 1):.0%}",
        f"reading B, one run's two throughputs (prompt tokens and output tokens per second of the same run): "
        f"their ratio, {ref.measured:.1f}:1, is then the run's token mix, not a speed; the traffic's mix of "
        f"{lo}:1 to {hi}:1 has its geometric middle at sqrt({lo} x {hi}) = {mix:.1f}:1, "
        f"{abs(ref.measured / mix - 1):.0%} away. Under B the speed gap is unknown, {ref.mfu:.1%} is the prompt "
        f"FLOPs over the whole run (a floor under prefill's MFU, not its value), and "
        f"{ref.decode_tokens_per_s:,.0f} tok/s is every concurrent answer's tokens together",
        "how the figures were taken is not recorded; B fits the traffic's mix closely. Where the course needs "
        "a speed gap it uses A and says so."])


@dataclasses.dataclass
class TwoSpeeds:
    prompt_len: int
    new_tokens: int
    prefill: records.PrefillRecord
    decode: records.DecodeRecord

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill.prefill_tokens_per_s

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode.decode_tokens_per_s

    @property
    def ratio(self) -> float:
        return self.prefill_tokens_per_s / self.decode_tokens_per_s

    @property
    def ttft_s(self) -> float:
        return self.prefill.seconds

    @property
    def decode_s(self) -> float:
        return self.decode.step_seconds * self.new_tokens

    def gap(self, cfg, spec) -> Gap:
        return gap(self.prefill_tokens_per_s, self.decode_tokens_per_s, cfg, spec, prompt_len=self.prompt_len)

    def line(self) -> str:
        return (f"prompt length {self.prompt_len}, new tokens {self.new_tokens}: "
                f"prefill {self.prefill_tokens_per_s:,.0f} tok/s, decode {self.decode_tokens_per_s:,.1f} tok/s: "
                f"writing is {self.ratio:.1f}x slower per token (reference node: "
                f"{REFERENCE_NODE['prefill_tokens_per_s'] / REFERENCE_NODE['decode_tokens_per_s']:.0f}x)")


def two_speeds(model, prompt_len: int, new_tokens: int = 16) -> TwoSpeeds:
    """Prefill of one prompt, then ``new_tokens`` decode steps from it, both timed here, side by
    side (their ratio is the lesson)."""
    pre, dec = timing.measure_points([timing.PrefillPoint(model, 1, prompt_len),
                                      timing.DecodePoint(model, 1, prompt_len, new_tokens)])
    return TwoSpeeds(prompt_len, new_tokens, pre, dec)


def who_dominates(prompt_tokens: float, output_tokens: float, gap_x: float) -> str:
    """Which phase takes longer for one request: decode whenever prompt:output is below the
    speed gap (each output token costs ``gap_x`` prompt tokens' time)."""
    ratio = prompt_tokens / output_tokens
    if ratio < gap_x:
        return f"prompt:output {ratio:.3g}:1 is below the {gap_x:.3g}x gap: decode takes longer"
    return f"prompt:output {ratio:.3g}:1 is above the {gap_x:.3g}x gap: prefill takes longer"


class TwoSpeedsGrid:
    """Prefill and a decode step measured once at every prompt length of the dashboard, so the
    dashboard redraws from them at once (a slider move measures nothing; :meth:`measure` again
    on demand). A request of ``new_tokens`` is the prefill, then that many steps at the step
    time measured from that prompt (the cache grows by ``new_tokens`` during the answer, which
    moves the step time little at these lengths). Three repeats of eight steps by default: the
    grid is for exploring (the lesson's own verdicts use :func:`two_speeds`' full repeats), and
    its cost is mostly the longest prompt's prefill."""

    def __init__(self, model, prompt_lengths, *, steps: int = 8, repeats: int = 3):
        self.model, self.prompt_lengths = model, tuple(int(t) for t in prompt_lengths)
        self.steps, self.repeats = steps, repeats
        self.rounds = 0   # how many times the grid was measured (the readout says which)
        self.measure()

    def measure(self) -> None:
        points = [p for t in self.prompt_lengths for p in (timing.PrefillPoint(self.model, 1, t),
                                                           timing.DecodePoint(self.model, 1, t, self.steps))]
        recs = timing.measure_points(points, repeats=self.repeats, desc="every prompt length")
        self.measured = {t: (recs[2 * i], recs[2 * i + 1]) for i, t in enumerate(self.prompt_lengths)}
        self.rounds += 1

    def at(self, prompt_len: int, new_tokens: int) -> TwoSpeeds:
        if prompt_len not in self.measured:
            raise ValueError(f"prompt_len={prompt_len} was not measured; the grid has {self.prompt_lengths}")
        return TwoSpeeds(prompt_len, new_tokens, *self.measured[prompt_len])


def two_speeds_view(grid: TwoSpeedsGrid, prompt_len: int, new_tokens: int):
    """Dashboard: one request's timeline from the grid's measurements (nothing is timed here)."""
    result = grid.at(prompt_len, new_tokens)
    fig = plots.request_timeline(result.ttft_s, result.decode_s, prompt_len, new_tokens)
    share = result.decode_s / (result.ttft_s + result.decode_s)
    text = (f"prompt length {prompt_len}, new tokens {new_tokens}: first token after {result.ttft_s * 1e3:,.0f} ms, "
            f"then {result.decode_s * 1e3:,.0f} ms of decode ({share:.0%} of the request); "
            + who_dominates(prompt_len, new_tokens, result.ratio)
            + f" (measurement {grid.rounds}: every prompt length timed together)")
    return fig, text


# ------------------------------------------------------------------ one answer, token by token
@dataclasses.dataclass(frozen=True)
class Answer:
    """One streamed answer: its tokens and text, and when each token appeared (seconds since
    the request started; the first one's is the time to first token)."""

    prompt: str
    tokens: tuple
    text: str
    seconds: tuple

    @property
    def ttft_s(self) -> float:
        return self.seconds[0]

    @property
    def itl_s(self) -> tuple:
        """The gap before each later token: one decode step (and the copy of its token to the host)."""
        return tuple(b - a for a, b in zip(self.seconds, self.seconds[1:]))

    def line(self) -> str:
        itl = statistics.median(self.itl_s)
        return (f"{len(self.tokens)} tokens in {self.seconds[-1] * 1e3:,.0f} ms: the first after "
                f"{self.ttft_s * 1e3:,.1f} ms (prefill of {len(self.prompt.encode())} prompt bytes), then one every "
                f"{itl * 1e3:,.2f} ms at the median (decode): {1 / itl:,.0f} tokens/s once the answer flows")


def stream_answer(model, prompt: str = PROMPT, max_new_tokens: int = 180, *, temperature: float = 0.8,
                  top_k: int | None = 40, seed: int = 0, show: bool = True) -> Answer:
    """Write the answer with :func:`inference_lab.runtime.streaming.stream`, printing each piece of
    text as it appears (``show``). Compilation is done first, untimed, on the same shapes:
    the times are those of a warm server."""
    warm = streaming.stream(model, prompt, max_new_tokens, temperature=temperature, top_k=top_k, seed=seed)
    for _ in zip(range(2), warm):   # prefill and one decode step compile here
        pass
    tokens = []
    for tok in streaming.stream(model, prompt, max_new_tokens, temperature=temperature, top_k=top_k, seed=seed):
        tokens.append(tok)
        if show:
            print(tok.text, end="", flush=True)
    if show:
        print()
    return Answer(prompt, tuple(t.token for t in tokens), "".join(t.text for t in tokens),
                  tuple(t.seconds for t in tokens))


READING_WORDS_PER_S = 238 / 60   # silent reading of English non-fiction (Brysbaert 2019, a meta-analysis)
WORDS_PER_BPE_TOKEN = 0.75       # English text under a chat model's BPE tokenizer (OpenAI's rule of thumb)


def human_line(answer: Answer) -> str:
    """The streamed answer's speed in what a reader feels: words per second, against reading speed."""
    itl = statistics.median(answer.itl_s)
    words = max(1, len(answer.text.split()))
    bytes_per_word = len(answer.text.encode()) / words
    words_per_s = 1 / itl / bytes_per_word
    return (f"for a reader: this tokenizer writes one byte per token and this text has {bytes_per_word:.1f} bytes per "
            f"word (spaces included), so {1 / itl:,.0f} tokens/s is {words_per_s:,.0f} words/s; people read about "
            f"{READING_WORDS_PER_S:.1f} words/s. A chat model's tokenizer carries ~{WORDS_PER_BPE_TOKEN} words per "
            f"token, so it keeps ahead of a reader from ~{READING_WORDS_PER_S / WORDS_PER_BPE_TOKEN:.0f} tokens/s "
            f"(a TPOT under ~{WORDS_PER_BPE_TOKEN / READING_WORDS_PER_S * 1e3:.0f} ms); the first token's wait "
            f"({answer.ttft_s * 1e3:,.0f} ms here) is what the reader notices first")


# ------------------------------------------------------------------ what the KV cache saves
@dataclasses.dataclass(frozen=True)
class CacheComparison:
    """The same greedy answer written twice: with the KV cache (one new token per step) and
    without (the whole text again every step), with each step's time and the roofline's time
    of a forward over the whole text."""

    lengths: tuple          # tokens the step reads without a cache (prompt + tokens so far)
    cached_s: tuple         # step time with the cache (the first: the prefill)
    uncached_s: tuple       # step time without it
    predicted_uncached_s: tuple   # roofline time of a forward over `length` tokens
    cached_tokens: tuple
    uncached_tokens: tuple

    @property
    def same_until(self) -> int:
        """How many tokens the two answers share from the start (all of them, normally)."""
        n = 0
        for a, b in zip(self.cached_tokens, self.uncached_tokens):
            if a != b:
                break
            n += 1
        return n

    def line(self) -> str:
        n = len(self.cached_tokens)
        same = (f"the same {n} tokens both ways" if self.same_until == n else
                f"the answers part at token {self.same_until + 1} of {n}")
        return (f"{same}; text of {self.lengths[0]} to {self.lengths[-1]} tokens: a step without the cache took "
                f"{self.uncached_s[1] * 1e3:,.2f} to {self.uncached_s[-1] * 1e3:,.2f} ms, with it "
                f"{statistics.median(self.cached_s[1:]) * 1e3:,.2f} ms at the median")


def with_and_without_cache(model, prompt: str = PROMPT, max_new_tokens: int = 150) -> CacheComparison:
    """Greedy answers with and without the KV cache, every step timed (compilation excluded)."""
    spec = hardware.measure_ceilings(model.cfg.dtype, verbose=False)   # cached on disk after the first time
    cached = stream_answer(model, prompt, max_new_tokens, temperature=0.0, show=False)
    uncached = streaming.generate_without_cache(model, prompt, max_new_tokens)
    predicted = tuple(roofline.predicted_prefill_seconds(model.cfg, spec, 1, n) for n in uncached.lengths)
    return CacheComparison(tuple(uncached.lengths), (cached.ttft_s,) + cached.itl_s, tuple(uncached.step_seconds),
                           predicted, cached.tokens, tuple(uncached.tokens))


# ------------------------------------------------------------------ why the timings use a bigger model
SMALL_STEPS, LARGE_STEPS = 32, 8   # decode steps per timed loop of each model (a loop of ~5 and ~60 ms here)
STREAM_CONTEXT = 64                 # cached tokens per row when the two models and their twins are timed


def hollow(model):
    """The same model with almost no weights: every layer, head and kernel call of ``model``
    (the same number of matmuls, attentions, norms and the same vocabulary), at width 16. Its
    decode step is what ``model``'s costs whatever its bytes: the fixed cost of the step's
    operations (notebook 04's third regime)."""
    from flax import nnx

    from inference_lab.model.transformer import Transformer

    cfg = model.cfg.replace(name=f"{model.cfg.name} (hollow)", d_model=16, d_ff=16, head_dim=16)
    return Transformer(cfg, rngs=nnx.Rngs(0), kernels=model.kernels)


@dataclasses.dataclass(frozen=True)
class StreamRates:
    """Batch-1 decode of a small and a large model and of their hollow twins (:func:`hollow`),
    timed side by side, beside the read ceiling measured again at each model's byte count
    (:func:`pallas_kernels.ceilings.read_bandwidth`, re-read as a decode loop re-reads its
    weights) and the caches the processor reports."""

    small: records.DecodeRecord
    small_hollow: records.DecodeRecord
    large: records.DecodeRecord
    large_hollow: records.DecodeRecord
    small_read: float   # bytes/s: the read ceiling's method on a buffer of the small model's step bytes
    large_read: float
    processor: str

    @staticmethod
    def fixed_share(model, twin) -> float:
        """The share of a step its hollow twin takes: what the step costs whatever its bytes."""
        return twin.step_seconds / model.step_seconds

    @staticmethod
    def rate(record) -> float:
        return record.bytes_per_step / record.step_seconds

    def table(self) -> str:
        rows = [f"{'model':<14}{'bytes/step':>12}{'step':>11}{'hollow twin':>13}{'streams':>12}{'read ceiling':>14}"]
        for r, twin, read in ((self.small, self.small_hollow, self.small_read),
                              (self.large, self.large_hollow, self.large_read)):
            rows.append(f"{r.preset:<14}{r.bytes_per_step / 1e6:>9,.1f} MB{r.step_seconds * 1e3:>8,.3f} ms"
                        f"{twin.step_seconds * 1e3:>7,.3f} ms {self.fixed_share(r, twin):>4.0%}"
                        f"{self.rate(r) / 1e9:>7,.1f} GB/s{read / 1e9:>9,.1f} GB/s")
        return "\n".join(rows)

    def caches_line(self) -> str:
        """Which case this machine's caches are: a plain re-read of the small model's bytes
        against the large one's."""
        gain = self.small_read / self.large_read
        case = ("its caches re-read the small model's bytes faster than memory gives the large one's"
                if gain >= 1.2 else "its caches re-read no faster than its memory")
        return (f"this machine: {self.processor}\n{case} ({self.small_read / 1e9:,.1f} vs "
                f"{self.large_read / 1e9:,.1f} GB/s, {gain:.2f}x)")


def weight_stream_rates(small_model, large_model, *, context: int = STREAM_CONTEXT) -> StreamRates:
    """Read each model's bytes on this machine, then time batch-1 decode of both models and their
    hollow twins at the same context, side by side (round-robin: a burst of load from another
    program cannot decide the comparison)."""
    from pallas_kernels.ceilings import read_bandwidth

    points = [timing.DecodePoint(small_model, 1, context, SMALL_STEPS),
              timing.DecodePoint(hollow(small_model), 1, context, SMALL_STEPS),
              timing.DecodePoint(large_model, 1, context, LARGE_STEPS),
              timing.DecodePoint(hollow(large_model), 1, context, LARGE_STEPS)]
    small_bytes = costs.decode_loop_cost(small_model.cfg, 1, context, SMALL_STEPS).bytes
    large_bytes = costs.decode_loop_cost(large_model.cfg, 1, context, LARGE_STEPS).bytes
    reads = [read_bandwidth(int(n), repeats=9)["bytes_per_s"] for n in (small_bytes, large_bytes)]
    small, small_hollow, large, large_hollow = timing.measure_points(points, repeats=9)
    return StreamRates(small, small_hollow, large, large_hollow, *reads, hardware.processor_summary())


def same_step_twice(result: TwoSpeeds, rates: StreamRates, cfg, spec) -> str:
    """The lesson model's batch-1 step as the twin table and the two-speeds cell timed it: both
    inside one compiled loop, at different contexts and moments. Says how much of the difference
    the extra cached tokens explain (on the roofline) and leaves the rest to the moment."""
    here, there = result.decode, rates.large
    extra = (costs.decode_cost(cfg, 1, here.context).bytes - costs.decode_cost(cfg, 1, there.context).bytes)
    predicted = extra / spec.bandwidth
    diff = here.step_seconds - there.step_seconds
    rest = diff - predicted
    return (f"the same model's batch-1 step, timed twice in compiled loops: {here.step_seconds * 1e3:.2f} ms here "
            f"(context {here.context}), {there.step_seconds * 1e3:.2f} ms in the twin table (context {there.context}); "
            f"the {here.context - there.context:+,} cached tokens add {extra / 1e6:,.1f} MB a step, "
            f"{predicted * 1e3:+.2f} ms at the read ceiling, so {rest * 1e3:+.2f} ms of the difference is the moment "
            "(each cell timed its points side by side, at a different time) and attention's slower reads (notebook 03)")


def step_three_ways(answer: Answer, cache: CacheComparison, rates: StreamRates) -> str:
    """The trained model's decode step as three cells of notebook 01 timed it, and what each includes."""
    rows = [(f"{statistics.median(answer.itl_s) * 1e3:.2f} ms", "section 1, the streamed answer: one jitted decode "
             "step per token called from Python, then sampling (temperature and top-k, a second call), the token "
             "copied to the host, decoded and printed"),
            (f"{statistics.median(cache.cached_s[1:]) * 1e3:.2f} ms", "the cache comparison: the same loop, greedy "
             "(an argmax), nothing printed"),
            (f"{rates.small.step_seconds * 1e3:.3f} ms", f"the twin table: {SMALL_STEPS} steps in one compiled "
             "loop (jax.lax.fori_loop), the tokens kept on the device: no host round trip per token")]
    return "\n".join(f"{t:>10}  {what}" for t, what in rows)
