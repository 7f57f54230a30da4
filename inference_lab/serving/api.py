"""The OpenAI-compatible HTTP API of the serving engine, on Starlette (the ASGI toolkit under
FastAPI, which vLLM's server uses).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streamed with server-sent
events when ``"stream": true``, as OpenAI's and vLLM's servers stream: one ``data: {json}``
per token, a last chunk with ``usage`` when ``stream_options.include_usage`` is set, then
``data: [DONE]``), ``GET /v1/models``, ``GET /health`` (the engine's state as JSON: slots, queue,
KV blocks free and used, preemptions, prefix-cache counts) and ``GET /metrics`` (the same and the
requests' latencies in the Prometheus text format, vLLM's metric names: :mod:`inference_lab.serving.metrics`).

Every request is checked before the engine sees it, and every refusal is an OpenAI-style JSON
error (``{"error": {"message", "type", "param", "code"}}``) with a 4xx status, never a
traceback: a wrong or missing API key (401), a body that is not a JSON object or is too large
(400, 413), an unknown model (404), a prompt and ``max_tokens`` past the context (400), an
out-of-range or unsupported sampling setting (400), a full engine (429, with ``Retry-After``).
A request the engine could not finish says why: a stopping server (503), a failed engine (500), a
non-streamed request past ``request_timeout`` (504, and the request is cancelled). A client that
goes away mid-request has its request cancelled: its slot is free at the engine's next iteration.
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import hmac
import itertools
import json
import math
import secrets
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from inference_lab.base import tokenizer
from inference_lab.serving.metrics import CONTENT_TYPE, ServingMetrics
from inference_lab.serving.scheduler import QueueFull, Request, now

MAX_BODY_BYTES = 1 << 20
MAX_SEED = 2**63 - 1
_ids = itertools.count()


class APIError(Exception):
    """A refusal: the HTTP status, the message, OpenAI's error type, the parameter at fault."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def _bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


# ----------------------------------------------------------------------------- reading a request
def _integer(body: dict, name: str, default, low: int, high: int) -> int:
    v = body.get(name, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise _bad(f"{name}={v!r} must be an integer in {low}..{high}", name)
    return v


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    v = body.get(name, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not low <= v <= high:
        raise _bad(f"{name}={v!r} must be a number in {low:g}..{high:g}", name)
    return float(v)


def _neutral(body: dict, name: str, neutral) -> None:
    """A setting this engine does not implement is accepted only at the value that changes nothing."""
    v = body.get(name)
    if v is not None and v != neutral:
        raise _bad(f"{name}={v!r} is not supported by this engine (only {neutral!r})", name)


def _prompt_ids(prompt, vocab: int) -> list[int]:
    """A completion's ``prompt``: a str or a list of token ids (or a list holding one of them)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if (isinstance(prompt, list) and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in prompt)):
        return list(prompt)
    raise _bad("prompt must be a string or a non-empty list of token ids in the vocabulary "
               f"(0..{vocab - 1}); send one prompt per request", "prompt")


def _chat_prompt(messages) -> str:
    """Messages as the Shakespeare models know dialogue: ``ROLE:\\ncontent\\n\\n``, then the
    assistant's turn opened."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of {\"role\": ..., \"content\": ...}", "messages")
    parts = []
    for i, m in enumerate(messages):
        if (not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"]
                or not isinstance(m.get("content"), str)):
            raise _bad(f"messages[{i}] must be {{\"role\": str, \"content\": str}}", "messages")
        parts.append(f"{m['role'].upper()}:\n{m['content']}\n\n")
    return "".join(parts) + "ASSISTANT:\n"


class Served:
    """What the API serves: the engine (anything with ``submit``, ``cancel`` and ``stats``),
    the model's name, context and vocabulary, and the request limits."""

    def __init__(self, backend, *, model_name: str, max_seq_len: int, vocab_size: int,
                 api_key: str | None = None, max_body: int = MAX_BODY_BYTES, request_timeout: float | None = None):
        self.backend, self.model_name = backend, model_name
        self.max_seq_len, self.vocab_size = max_seq_len, vocab_size
        self.api_key, self.max_body, self.request_timeout = api_key, max_body, request_timeout
        self.relay: _Relay | None = None   # made in the event loop, by the first request
        self.created = int(time.time())
        self.metrics = ServingMetrics(backend, model_name)

    def engine_request(self, body: dict, chat: bool) -> tuple[Request, dict]:
        """The engine's :class:`Request` and the stream options, or an :class:`APIError`."""
        model = body.get("model")
        if not isinstance(model, str):
            raise _bad("model is required: the name /v1/models lists", "model")
        if model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist; this server serves `{self.model_name}`",
                           param="model", code="model_not_found")
        if chat:
            prompt = tokenizer.encode(_chat_prompt(body.get("messages")))
        else:
            if "prompt" not in body:
                raise _bad("prompt is required", "prompt")
            prompt = _prompt_ids(body["prompt"], self.vocab_size)
        room = self.max_seq_len - len(prompt)
        if room < 1:
            raise _bad(f"This model's maximum context length is {self.max_seq_len} tokens; the prompt "
                       f"has {len(prompt)}. Shorten the prompt.", "prompt" if not chat else "messages")
        name = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
        max_tokens = body.get(name)
        if max_tokens is None:
            max_tokens = min(16, room) if not chat else room
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise _bad(f"{name}={max_tokens!r} must be a positive integer", name)
        if max_tokens > room:
            raise _bad(f"This model's maximum context length is {self.max_seq_len} tokens. However, you "
                       f"requested {len(prompt) + max_tokens} tokens ({len(prompt)} in the prompt, "
                       f"{max_tokens} in the completion). Reduce the prompt or {name} (at most {room} here).",
                       name)
        temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
        top_k = _integer(body, "top_k", -1, -1, self.vocab_size)
        # no seed: a fresh one, as OpenAI's and vLLM's servers sample differently on every call
        seed = _integer(body, "seed", secrets.randbelow(MAX_SEED), 0, MAX_SEED)
        for name, neutral in (("n", 1), ("best_of", 1), ("top_p", 1), ("echo", False), ("logprobs", False),
                              ("presence_penalty", 0), ("frequency_penalty", 0), ("repetition_penalty", 1)):
            _neutral(body, name, neutral)
        if body.get("stop") not in (None, [], ""):
            raise _bad("stop sequences are not supported by this engine; use max_tokens", "stop")
        stream = body.get("stream", False)
        options = body.get("stream_options") or {}
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(stream, bool) or not isinstance(options, dict) or not isinstance(ignore_eos, bool):
            raise _bad("stream and ignore_eos must be booleans and stream_options an object", "stream")
        request = Request(rid=f"{'chatcmpl' if chat else 'cmpl'}-{next(_ids)}", prompt=prompt,
                          max_tokens=max_tokens, temperature=temperature,
                          top_k=None if top_k in (-1, 0) else top_k, seed=seed, stop_at_eos=not ignore_eos)
        return request, {"stream": stream, "include_usage": bool(options.get("include_usage", False))}


# ----------------------------------------------------------------------------- answering
async def _body(served: Served, http: HTTPRequest) -> dict:
    size = http.headers.get("content-length")
    if size is not None and (not size.isdigit() or int(size) > served.max_body):
        raise APIError(413, f"the request body is over {served.max_body} bytes", code="body_too_large")
    data = bytearray()
    async for piece in http.stream():
        data += piece
        if len(data) > served.max_body:
            raise APIError(413, f"the request body is over {served.max_body} bytes", code="body_too_large")
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        raise _bad("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    return body


def _check_key(served: Served, http: HTTPRequest) -> None:
    if served.api_key is None:
        return
    given = http.headers.get("authorization", "")
    scheme, _, key = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), served.api_key.encode()):
        raise APIError(401, "Incorrect or missing API key: send `Authorization: Bearer <key>`",
                       code="invalid_api_key")


class _Relay:
    """Events from the engine's thread into the event loop, one wake-up per batch: the engine
    sends every token of a step at once, and waking the loop once per token (a write to its
    self-pipe and a pass of the loop each) cost more than the rest of the server's work."""

    def __init__(self, loop):
        self.loop = loop
        self.batch: collections.deque = collections.deque()
        self.waking = False

    def put(self, queue: asyncio.Queue, event) -> None:
        """From any thread: ``event`` into ``queue`` on the loop."""
        self.batch.append((queue, event))
        if not self.waking:          # a wake-up already on its way takes this one too
            self.waking = True
            try:
                self.loop.call_soon_threadsafe(self._hand_out)
            except RuntimeError:     # the event loop closed (the server is stopping): nobody is listening
                pass

    def _hand_out(self) -> None:
        self.waking = False
        while self.batch:
            queue, event = self.batch.popleft()
            queue.put_nowait(event)


class _Stream:
    """One request's events, carried from the engine's thread into the event loop."""

    def __init__(self, served: Served, request: Request):
        loop = asyncio.get_running_loop()
        if served.relay is None or served.relay.loop is not loop:
            served.relay = _Relay(loop)
        self.relay = served.relay
        self.queue: asyncio.Queue = asyncio.Queue()
        self.served, self.request, self.finished = served, request, False
        self.text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.completion_tokens = 0
        self.arrival, self.last = now(), None
        try:
            served.backend.submit(request, self._from_engine)
        except QueueFull as e:
            raise APIError(429, f"the server is full: {e}; retry shortly", code="queue_full",
                           kind="rate_limit_error", headers={"Retry-After": "1"}) from None
        except RuntimeError as e:
            raise APIError(503, str(e), code="engine_stopped", kind="server_error") from None
        except ValueError as e:   # the engine's own check (the API's came first)
            raise _bad(str(e)) from None

    def _from_engine(self, event) -> None:
        if event.token >= 0:   # (on the engine's thread: the latencies, on its clock)
            self.served.metrics.token(self.arrival, self.last, event)
            self.last = event.time
        self.relay.put(self.queue, event)

    async def events(self):
        """(text piece, finish reason) per token until the request ends."""
        while not self.finished:
            event = await self.queue.get()
            if event.finish in ("abort", "error"):
                self.finished = True
                if event.finish == "error":
                    raise APIError(500, f"the engine failed: {event.error}", kind="server_error")
                if event.error:   # not a cancel this client asked for: the server is stopping
                    raise APIError(503, f"the request was stopped: {event.error}", code="engine_stopped",
                                   kind="server_error")
                return
            self.completion_tokens += 1
            piece = self.text.decode(bytes([event.token]) if 0 <= event.token < 256 else b"",
                                     final=event.finish is not None)
            self.finished = event.finish is not None
            yield piece, event.finish

    def cancel(self) -> None:
        if not self.finished:
            self.finished = True
            self.served.backend.cancel(self.request.rid)

    def usage(self) -> dict:
        p = len(self.request.prompt)
        return {"prompt_tokens": p, "completion_tokens": self.completion_tokens,
                "total_tokens": p + self.completion_tokens}


def _chunk(served, stream, chat, piece, finish, first):
    base = {"id": stream.request.rid, "created": served.created, "model": served.model_name}
    if chat:
        delta = {"role": "assistant", "content": piece} if first else {"content": piece}
        return {**base, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    return {**base, "object": "text_completion",
            "choices": [{"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}]}


async def _streamed(served, stream, chat, include_usage):
    try:
        first = True
        async for piece, finish in stream.events():
            yield f"data: {json.dumps(_chunk(served, stream, chat, piece, finish, first))}\n\n"
            first = False
        if include_usage:
            last = {"id": stream.request.rid, "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": served.created, "model": served.model_name, "choices": [], "usage": stream.usage()}
            yield f"data: {json.dumps(last)}\n\n"
        yield "data: [DONE]\n\n"
    except APIError as e:
        yield f"data: {json.dumps({'error': {'message': e.message, 'type': e.kind, 'code': e.status}})}\n\n"
    finally:
        stream.cancel()   # a no-op once finished; a client that went away frees its slot here


async def _collected(served, stream, chat, http):
    pieces, finish = [], None
    events = stream.events()
    deadline = None if served.request_timeout is None else time.monotonic() + served.request_timeout
    try:
        while True:
            waiting = asyncio.ensure_future(anext(events))
            while not waiting.done():
                left = 0.5 if deadline is None else min(0.5, max(deadline - time.monotonic(), 0.0))
                await asyncio.wait({waiting}, timeout=left)
                if waiting.done():
                    break
                if await http.is_disconnected():
                    waiting.cancel()
                    return None
                if deadline is not None and time.monotonic() > deadline:
                    waiting.cancel()
                    raise APIError(504, f"the request did not finish within --request-timeout="
                                        f"{served.request_timeout:g} s ({stream.completion_tokens} tokens written); "
                                        "it was cancelled: ask for fewer tokens, or stream", code="request_timeout",
                                   kind="timeout_error")
            try:
                piece, finish = waiting.result()
            except StopAsyncIteration:
                break
            pieces.append(piece)
    finally:
        stream.cancel()
    text = "".join(pieces)
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
               "finish_reason": finish} if chat else
              {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
    return JSONResponse({"id": stream.request.rid, "object": "chat.completion" if chat else "text_completion",
                         "created": served.created, "model": served.model_name, "choices": [choice],
                         "usage": stream.usage()})


def _completion_route(chat: bool):
    async def route(http: HTTPRequest):
        served: Served = http.app.state.served
        try:
            _check_key(served, http)
            request, options = served.engine_request(await _body(served, http), chat)
            stream = _Stream(served, request)
        except APIError as e:
            return e.response()
        if options["stream"]:
            return StreamingResponse(_streamed(served, stream, chat, options["include_usage"]),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            response = await _collected(served, stream, chat, http)
        except APIError as e:
            return e.response()
        return response if response is not None else JSONResponse({}, status_code=499)
    return route


def _keyed(answer):
    """A GET route that checks the API key first: ``answer(served)`` gives its response."""
    async def route(http: HTTPRequest):
        served: Served = http.app.state.served
        try:
            _check_key(served, http)
        except APIError as e:
            return e.response()
        return answer(served)
    return route


def _models(served: Served) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [
        {"id": served.model_name, "object": "model", "created": served.created, "owned_by": "inference-lab",
         "max_model_len": served.max_seq_len}]})


def _health(served: Served) -> JSONResponse:
    stats = served.backend.stats()
    ok = stats.get("error") is None
    return JSONResponse({"status": "ok" if ok else "failed", **stats}, status_code=200 if ok else 503)


def _metrics(served: Served) -> Response:
    return Response(served.metrics.text(), media_type=CONTENT_TYPE)


async def _http_error(http, exc: HTTPException):
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return APIError(exc.status_code, f"{http.method} {http.url.path}: {exc.detail}", kind=kind).response()


async def _internal_error(http, exc: Exception):
    return APIError(500, f"internal error ({type(exc).__name__}); the server log has the details",
                    kind="server_error").response()


def create_app(served: Served, *, lifespan=None) -> Starlette:
    """The ASGI app serving ``served`` (run it with uvicorn: :mod:`inference_lab.serving.server`)."""
    app = Starlette(routes=[
        Route("/v1/completions", _completion_route(chat=False), methods=["POST"]),
        Route("/v1/chat/completions", _completion_route(chat=True), methods=["POST"]),
        Route("/v1/models", _keyed(_models), methods=["GET"]),
        Route("/health", _keyed(_health), methods=["GET"]),
        Route("/metrics", _keyed(_metrics), methods=["GET"]),
    ], exception_handlers={HTTPException: _http_error, Exception: _internal_error}, lifespan=lifespan)
    app.state.served = served
    return app
