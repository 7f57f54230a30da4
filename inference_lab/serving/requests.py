"""What the engine is asked and what it answers: a :class:`Request` (token ids, how to sample, when
to stop), the :class:`TokenEvent` each of its tokens (or its end) becomes, the one-line checks every
engine runs at ``submit`` (:func:`check_request`), and :class:`QueueFull`, the back-pressure the
server answers 429. Host only, no jax.
"""

from __future__ import annotations

import dataclasses
import time

from inference_lab.base import checks, tokenizer


class QueueFull(Exception):
    """The engine holds as many requests as it may: the server answers 429 rather than queue without bound."""


MAX_STOP_TOKEN_IDS = 8    # stop_token_ids a request may name (with EOS, the tokens min_tokens bans)


@dataclasses.dataclass
class Request:
    """One request as the engine sees it: token ids (with BOS), how to sample and when to stop.

    ``top_p``/``min_p``: nucleus and min-p sampling (1 and 0: off); ``stop_token_ids``: tokens that
    end the request as end-of-sequence does (finish ``"stop"``); ``min_tokens``: none of those ends it
    (nor is drawn) before this many tokens; ``logprobs``: None, or how many of the likeliest
    alternatives each token's event carries beside its own log-probability (0..``checks.MAX_LOGPROBS``);
    ``after``: another request's id whose prompt this one shares (the choices of one ``n > 1``
    request): with prefix caching it starts once that one's prompt is scheduled, to share its blocks;
    ``eos_ids``: the model's end-of-sequence ids (the byte-level tokenizer's EOS unless the served
    tokenizer says otherwise: a Hugging Face folder's ``generation_config.json``)."""

    rid: str
    prompt: list
    max_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    seed: int = 0
    stop_at_eos: bool = True
    top_p: float = 1.0
    min_p: float = 0.0
    stop_token_ids: tuple = ()
    min_tokens: int = 0
    logprobs: int | None = None
    after: str | None = None
    eos_ids: tuple = (tokenizer.EOS,)

    def stop_tokens(self) -> tuple:
        """The tokens that end this request: its stop tokens, and end-of-sequence unless ignored."""
        return tuple(self.stop_token_ids) + (tuple(self.eos_ids) if self.stop_at_eos else ())


@dataclasses.dataclass(frozen=True)
class TokenEvent:
    """Token ``index`` of request ``rid`` reached the host at ``time`` (``time.perf_counter``,
    a system-wide monotonic clock on Linux, so worker processes' stamps compare). ``finish``:
    ``"length"``/``"stop"`` on the last token; ``"abort"`` (a cancel, or the engine stopping) and
    ``"error"`` (the engine failed) end a request without one: ``token`` is then -1 and ``error``
    says why (empty for a cancel the client asked for). ``logprob`` and ``top_logprobs`` (``((id,
    logprob), ...)``, likeliest first) where the request asked for log-probabilities; ``scheduled``:
    on a request's first token, when it got its slot (the end of its time in the queue)."""

    rid: str
    token: int
    index: int
    time: float
    finish: str | None = None
    error: str = ""
    logprob: float | None = None
    top_logprobs: tuple = ()
    scheduled: float | None = None


def now() -> float:
    return time.perf_counter()


def check_request(request: Request, *, vocab_size: int, max_len: int) -> None:
    """One-line errors for a request no engine of this model can serve (the API answers them 400
    first); every engine runs it at ``submit``, before the request could reach a worker loop."""
    if not isinstance(request, Request):
        raise ValueError(f"request must be a serving.requests.Request, got {type(request).__name__}")
    rid = request.rid
    try:
        prompt = checks.token_ids("prompt", request.prompt, vocab_size)
    except ValueError as err:
        raise ValueError(f"request {rid}: {err}") from None
    if len(prompt) >= max_len:
        raise ValueError(f"request {rid}: a prompt of {len(prompt)} tokens leaves no room in max_len={max_len}; "
                         "shorten it")
    if isinstance(request.max_tokens, bool) or not isinstance(request.max_tokens, int) or request.max_tokens < 1:
        raise ValueError(f"request {rid}: max_tokens={request.max_tokens!r} must be a positive integer")
    try:
        checks.sampling(request.temperature, request.top_k, vocab_size)
        checks.probability_cuts(request.top_p, request.min_p)
        checks.seed("seed", request.seed)
        checks.flag("stop_at_eos", request.stop_at_eos)
        for name in ("stop_token_ids", "eos_ids"):
            ids = getattr(request, name)
            if not isinstance(ids, (list, tuple)) or len(ids) > MAX_STOP_TOKEN_IDS:
                raise ValueError(f"{name} must be a list of at most {MAX_STOP_TOKEN_IDS} token ids")
            if ids:
                checks.token_ids(name, ids, vocab_size)
        if (isinstance(request.min_tokens, bool) or not isinstance(request.min_tokens, int)
                or not 0 <= request.min_tokens <= request.max_tokens):
            raise ValueError(f"min_tokens={request.min_tokens!r} must be an integer in 0..max_tokens "
                             f"({request.max_tokens})")
        checks.logprobs(request.logprobs)
        if request.after is not None and not isinstance(request.after, str):
            raise ValueError(f"after={request.after!r} must be None or a request id")
    except ValueError as err:
        raise ValueError(f"request {rid}: {err}") from None
