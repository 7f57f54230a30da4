"""Notebook 01, one model, two speeds: the same request's prefill and decode, timed here."""

from __future__ import annotations

import dataclasses

from inference_lab import measure, plots


REFERENCE_NODE = {
    "name": "Qwen3.5-27B, 4xH100, TP=4",
    "prefill_tokens_per_s": 3288.0,
    "decode_tokens_per_s": 108.0,
    "source": "the brief's measured node: a 27B model on 4xH100 with tensor parallelism",
}


@dataclasses.dataclass
class TwoSpeeds:
    prompt_len: int
    new_tokens: int
    prefill: measure.PrefillRecord
    decode: measure.DecodeRecord

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

    def line(self) -> str:
        return (f"prompt length {self.prompt_len}, new tokens {self.new_tokens}: "
                f"prefill {self.prefill_tokens_per_s:,.0f} tok/s, decode {self.decode_tokens_per_s:,.1f} tok/s: "
                f"writing is {self.ratio:.1f}x slower per token (reference node: "
                f"{REFERENCE_NODE['prefill_tokens_per_s'] / REFERENCE_NODE['decode_tokens_per_s']:.0f}x)")


def two_speeds(model, prompt_len: int, new_tokens: int = 32) -> TwoSpeeds:
    """Prefill of one prompt, then ``new_tokens`` decode steps from it, both timed here."""
    pre = measure.measure_prefill(model, batch=1, prompt_len=prompt_len)
    dec = measure.measure_decode(model, batch=1, context=prompt_len, steps=new_tokens)
    return TwoSpeeds(prompt_len, new_tokens, pre, dec)


def two_speeds_view(model, prompt_len: int, new_tokens: int):
    result = two_speeds(model, prompt_len, new_tokens)
    fig = plots.request_timeline(result.ttft_s, result.decode_s, prompt_len, new_tokens)
    text = (f"prompt length {prompt_len}, new tokens {new_tokens}: first token after {result.ttft_s * 1e3:,.0f} ms, "
            f"then {result.decode_s * 1e3:,.0f} ms of decode; {result.ratio:.1f}x slower per token to write")
    return fig, text
