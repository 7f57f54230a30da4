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
    "source": "a 27B model measured on a 4xH100 node with tensor parallelism",
}

# The reference model's exact layout is not part of the figures we have: this is a
# Llama-style dense shape of the same size (the GQA layout of recent 27-32B models), which
# is what the reconciliation needs. Its answers depend on the parameter count (the weight
# bytes, the FLOPs per token) almost only; the KV term is a few percent at the context used.
REFERENCE_SHAPE = ModelConfig(name="dense_27b (assumed shape)", vocab_size=151_936, d_model=5120, n_layers=64,
                              n_heads=40, n_kv_heads=8, head_dim=128, d_ff=22_016, max_seq_len=32_768,
                              rope_theta=1_000_000.0, tie_embeddings=False, dtype="bfloat16")
REFERENCE_TP = 4
REFERENCE_CONTEXT = 4096  # prompt length assumed for the ceilings (a RAG request's order of size)


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


def two_speeds_view(model, prompt_len: int, new_tokens: int):
    result = two_speeds(model, prompt_len, new_tokens)
    fig = plots.request_timeline(result.ttft_s, result.decode_s, prompt_len, new_tokens)
    share = result.decode_s / (result.ttft_s + result.decode_s)
    text = (f"prompt length {prompt_len}, new tokens {new_tokens}: first token after {result.ttft_s * 1e3:,.0f} ms, "
            f"then {result.decode_s * 1e3:,.0f} ms of decode ({share:.0%} of the request); "
            + who_dominates(prompt_len, new_tokens, result.ratio))
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
    timed side by side, beside a plain read of each model's bytes on this machine
    (:func:`pallas_kernels.ceilings.read_bandwidth`, re-read as a decode loop re-reads its
    weights) and the caches the processor reports."""

    small: records.DecodeRecord
    small_hollow: records.DecodeRecord
    large: records.DecodeRecord
    large_hollow: records.DecodeRecord
    small_read: float   # bytes/s of a plain read of the small model's step bytes
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
        rows = [f"{'model':<14}{'bytes/step':>12}{'step':>11}{'hollow twin':>13}{'streams':>12}{'a plain read':>14}"]
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


def weight_stream_rates(small_model, large_model, *, context: int = 64) -> StreamRates:
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
