"""What an OpenAI-style request may ask of this server, read and checked before the engine sees it.

:func:`read_request` turns the JSON body of ``POST /v1/completions`` or ``/v1/chat/completions``
into a :class:`Parsed` request: the engine's :class:`~inference_lab.serving.requests.Request`
for each of its ``n`` choices, and what the answer needs (streaming, usage, stop strings,
log-probabilities). Every field is one of three kinds, and the lists below say which:

* **supported** (:data:`COMPLETION_FIELDS`, :data:`CHAT_FIELDS`): read and honoured;
* **neutral only** (:data:`NEUTRAL`): fields of OpenAI's API this engine does not implement,
  accepted at the value that changes nothing (``presence_penalty: 0``, ``logit_bias: {}``...);
* anything else: a 400 that names the field. Nothing is silently ignored: a client that asks
  for ``logit_bias`` gets an error, not an answer that pretends to honour it.

Every refusal is an :class:`APIError` with a 4xx status and the parameter at fault.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import secrets
import time

from inference_lab.base import checks
from inference_lab.serving.requests import MAX_STOP_TOKEN_IDS, Request

MAX_SEED = 2**64 - 1        # seeds are 64-bit, every bit used (generation.seed_key); -2**63.. too, as int64
MIN_SEED = -2**63
MAX_N = 8                   # choices per request
MAX_STOPS = 4               # stop strings (OpenAI's bound)
MAX_STOP_CHARS = 64
MAX_COMPLETION_LOGPROBS = 5   # the legacy completions API's bound on `logprobs`
_ids = itertools.count()

COMMON_FIELDS = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stream", "stream_options",
                 "stop", "stop_token_ids", "min_tokens", "logprobs", "seed", "ignore_eos", "user"}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt"}
CHAT_FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens", "top_logprobs"}
# OpenAI's fields this engine does not implement, accepted only at the value that changes nothing
NEUTRAL = {"echo": (False,), "best_of": (None, 1), "presence_penalty": (0,), "frequency_penalty": (0,),
           "repetition_penalty": (1,), "logit_bias": (None, {}), "suffix": (None, ""), "parallel_tool_calls": (None,),
           "tools": (None, []), "tool_choice": (None, "none"), "response_format": (None, {"type": "text"})}


class APIError(Exception):
    """A refusal: the HTTP status, the message, OpenAI's error type, the parameter at fault."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


@dataclasses.dataclass
class Parsed:
    """One checked request: ``requests`` (one engine request per choice, rids ``<id>-<i>``), and
    for the answer: ``rid`` (its id), ``created`` (unix seconds, when it was accepted), ``chat``,
    ``stream``, ``include_usage``, ``stops`` (stop strings), ``logprobs`` (None, or how many
    alternatives each token lists)."""

    rid: str
    created: int
    chat: bool
    requests: list
    stream: bool
    include_usage: bool
    stops: tuple
    logprobs: int | None


# ----------------------------------------------------------------------------- the fields
def _integer(body: dict, name: str, default, low: int, high: int) -> int:
    v = body.get(name, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise bad(f"{name}={v!r} must be an integer in {low}..{high}", name)
    return v


def _number(body: dict, name: str, default: float, low: float, high: float, *, low_open: bool = False,
            high_open: bool = False) -> float:
    v = body.get(name, default)
    if v is None:
        v = default
    inside = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
              and (low < v if low_open else low <= v) and (v < high if high_open else v <= high))
    if not inside:
        bounds = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise bad(f"{name}={v!r} must be a number in {bounds}", name)
    return float(v)


def _boolean(body: dict, name: str, default: bool) -> bool:
    v = body.get(name, default)
    if v is None:
        v = default
    if not isinstance(v, bool):
        raise bad(f"{name}={v!r} must be true or false", name)
    return v


def _only_known(body: dict, chat: bool) -> None:
    known = CHAT_FIELDS if chat else COMPLETION_FIELDS
    for name, value in body.items():
        if name in known:
            continue
        if name in NEUTRAL:
            if value not in NEUTRAL[name] and not (name == "best_of" and value == body.get("n", 1)):
                allowed = " or ".join(repr(v) for v in NEUTRAL[name] if v is not None) or "null"
                raise bad(f"{name}={value!r} is not supported by this engine (only {allowed})", name)
            continue
        route = "/v1/chat/completions" if chat else "/v1/completions"
        raise bad(f"{name} is not a field this engine supports on {route}", name)


def _prompt_ids(prompt, vocab: int, tokenizer) -> list[int]:
    """A completion's ``prompt``: a str (tokenized with BOS, as vLLM does) or a list of token ids
    (or a list holding one of them)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if (isinstance(prompt, list) and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in prompt)):
        return list(prompt)
    raise bad("prompt must be a string or a non-empty list of token ids in the vocabulary "
              f"(0..{vocab - 1}); send one prompt per request", "prompt")


def _chat_prompt(messages, tokenizer) -> list[int]:
    """The chat's token ids: ``messages`` checked, then the served tokenizer's chat template (a
    Hugging Face folder's own; the Shakespeare models' ``ROLE:`` dialogue for the byte-level one)."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of {\"role\": ..., \"content\": ...}", "messages")
    for i, m in enumerate(messages):
        if (not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"]
                or not isinstance(m.get("content"), str)):
            raise bad(f"messages[{i}] must be {{\"role\": str, \"content\": str}}", "messages")
    try:
        return tokenizer.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in messages])
    except ValueError as err:
        raise bad(str(err), "messages") from None


def _stops(body: dict) -> tuple:
    """``stop``: a string or a list of at most :data:`MAX_STOPS` non-empty strings."""
    stop = body.get("stop")
    if stop is None or stop == "" or stop == []:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (not isinstance(stops, list) or len(stops) > MAX_STOPS
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops)):
        raise bad(f"stop must be a string or a list of at most {MAX_STOPS} non-empty strings of at most "
                  f"{MAX_STOP_CHARS} characters", "stop")
    return tuple(stops)


def _stop_token_ids(body: dict, vocab: int) -> tuple:
    ids = body.get("stop_token_ids")
    if ids is None or ids == []:
        return ()
    if (not isinstance(ids, list) or len(ids) > MAX_STOP_TOKEN_IDS
            or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids)):
        raise bad(f"stop_token_ids must be a list of at most {MAX_STOP_TOKEN_IDS} token ids in 0..{vocab - 1}",
                  "stop_token_ids")
    return tuple(ids)


def _logprobs(body: dict, chat: bool) -> int | None:
    """How many alternatives each token lists (None: no log-probabilities). Completions: ``logprobs``
    0..5 (OpenAI's legacy API); chat: ``logprobs: true`` and ``top_logprobs`` 0..20."""
    if not chat:
        v = body.get("logprobs")
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_COMPLETION_LOGPROBS:
            raise bad(f"logprobs={v!r} must be an integer in 0..{MAX_COMPLETION_LOGPROBS}", "logprobs")
        return v
    wanted = _boolean(body, "logprobs", False)
    top = body.get("top_logprobs")
    if top is not None:
        top = _integer(body, "top_logprobs", 0, 0, checks.MAX_LOGPROBS)
        if not wanted:
            raise bad("top_logprobs needs logprobs: true", "top_logprobs")
    return (top or 0) if wanted else None


def _seed(body: dict) -> int:
    """``seed`` as 64 bits (an int64 or uint64 value; no seed: a fresh one, as OpenAI's and vLLM's
    servers then sample differently on every call)."""
    if body.get("seed") is None:
        return secrets.randbelow(MAX_SEED + 1)
    return _integer(body, "seed", 0, MIN_SEED, MAX_SEED) & MAX_SEED


# ----------------------------------------------------------------------------- the request
def read_request(body: dict, chat: bool, *, model_name: str, max_seq_len: int, vocab_size: int,
                 tokenizer) -> Parsed:
    """The checked request of a completions (or chat) ``body``, or an :class:`APIError`.
    ``tokenizer``: the served model's (``ByteTokenizer`` or a folder's ``FolderTokenizer``)."""
    _only_known(body, chat)
    model = body.get("model")
    if not isinstance(model, str):
        raise bad("model is required: the name /v1/models lists", "model")
    if model != model_name:
        raise APIError(404, f"The model `{model}` does not exist; this server serves `{model_name}`",
                       param="model", code="model_not_found")
    if chat:
        prompt = _chat_prompt(body.get("messages"), tokenizer)
    else:
        if "prompt" not in body:
            raise bad("prompt is required", "prompt")
        prompt = _prompt_ids(body["prompt"], vocab_size, tokenizer)
    room = max_seq_len - len(prompt)
    if room < 1:
        raise bad(f"This model's maximum context length is {max_seq_len} tokens; the prompt "
                  f"has {len(prompt)}. Shorten the prompt.", "prompt" if not chat else "messages")
    name = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = body.get(name)
    if max_tokens is None:
        max_tokens = min(16, room) if not chat else room
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad(f"{name}={max_tokens!r} must be a positive integer", name)
    if max_tokens > room:
        raise bad(f"This model's maximum context length is {max_seq_len} tokens. However, you "
                  f"requested {len(prompt) + max_tokens} tokens ({len(prompt)} in the prompt, "
                  f"{max_tokens} in the completion). Reduce the prompt or {name} (at most {room} here).", name)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_k = _integer(body, "top_k", -1, -1, vocab_size)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    min_p = _number(body, "min_p", 0.0, 0.0, 1.0, high_open=True)
    min_tokens = _integer(body, "min_tokens", 0, 0, max_tokens)
    n = _integer(body, "n", 1, 1, MAX_N)
    seed = _seed(body)
    stream = _boolean(body, "stream", False)
    ignore_eos = _boolean(body, "ignore_eos", False)
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise bad("stream_options may hold include_usage only", "stream_options")
    include_usage = _boolean(options or {}, "include_usage", False)
    if options is not None and not stream:
        raise bad("stream_options needs stream: true", "stream_options")
    logprobs = _logprobs(body, chat)
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{next(_ids)}"
    common = dict(prompt=prompt, max_tokens=max_tokens, temperature=temperature,
                  top_k=None if top_k in (-1, 0) else top_k, stop_at_eos=not ignore_eos, top_p=top_p, min_p=min_p,
                  stop_token_ids=_stop_token_ids(body, vocab_size), min_tokens=min_tokens, logprobs=logprobs,
                  eos_ids=tuple(tokenizer.eos_ids))
    # choice i draws with seed + i (a seeded request gives the same n choices every time); every
    # choice after the first starts once the first's prompt is in the prefix cache (it shares its blocks)
    requests = [Request(rid=f"{rid}-{i}", seed=(seed + i) & MAX_SEED, after=f"{rid}-0" if i else None, **common)
                for i in range(n)]
    return Parsed(rid=rid, created=int(time.time()), chat=chat, requests=requests, stream=stream,
                  include_usage=include_usage, stops=_stops(body), logprobs=logprobs)
