"""The OpenAI-compatible HTTP API of the serving engine, on Starlette (the ASGI toolkit under
FastAPI, which vLLM's server uses).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streamed with server-sent
events when ``"stream": true``, as OpenAI's and vLLM's servers stream: one ``data: {json}``
per token and choice, a last chunk with ``usage`` when ``stream_options.include_usage`` is set,
then ``data: [DONE]``), ``GET /v1/models``, ``GET /health`` (the engine's state as JSON: slots,
queue, KV blocks free and used, preemptions, prefix-cache counts) and ``GET /metrics`` (the same
and the requests' latencies in the Prometheus text format, vLLM's metric names:
:mod:`inference_lab.serving.metrics`), and with ``--step-timeline`` ``GET /debug/steps`` (the
engine's last iterations: :mod:`inference_lab.serving.timeline`). With an API key, ``/v1`` and
``/debug`` answer only who sends it;
``/health`` and ``/metrics`` answer without it, as vLLM's do (a load balancer's probe and a
Prometheus scrape carry none, and they show no request's content).

What a request may ask is :mod:`inference_lab.serving.protocol` (sampling, ``n`` choices sharing
the prompt's KV blocks, ``stop`` strings and ``stop_token_ids``, ``min_tokens``, log-probabilities;
anything else a 400 naming the field); the text a choice's tokens make, stop strings cut, is
:mod:`inference_lab.serving.text`. Every refusal is an OpenAI-style JSON error (``{"error":
{"message", "type", "param", "code"}}``) with a 4xx status, never a traceback: a wrong or missing
API key (401), a body that is not a JSON object or is too large (400, 413), an unknown model
(404), a full engine (429, with ``Retry-After``). A request the engine could not finish says why:
a stopping server (503), a failed engine (500), a non-streamed request past ``request_timeout``
(504, and the request is cancelled). A client that goes away mid-request has its request
cancelled: its slot is free at the engine's next iteration.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import json
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from inference_lab.base.tokenizer import ByteTokenizer
from inference_lab.serving.metrics import CONTENT_TYPE, ServingMetrics
from inference_lab.serving.protocol import APIError, Parsed, bad, read_request
from inference_lab.serving.requests import QueueFull, now
from inference_lab.serving.text import TextStream

MAX_BODY_BYTES = 1 << 20


def _error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


class Served:
    """What the API serves: the engine (anything with ``submit``, ``cancel`` and ``stats``),
    the model's name, context, vocabulary and tokenizer (the byte-level one unless given: a Hugging
    Face folder's ``FolderTokenizer``), and the request limits."""

    def __init__(self, backend, *, model_name: str, max_seq_len: int, vocab_size: int, tokenizer=None,
                 api_key: str | None = None, max_body: int = MAX_BODY_BYTES, request_timeout: float | None = None):
        self.backend, self.model_name = backend, model_name
        self.tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        self.max_seq_len, self.vocab_size = max_seq_len, vocab_size
        self.api_key, self.max_body, self.request_timeout = api_key, max_body, request_timeout
        self.relay: _Relay | None = None   # made in the event loop, by the first request
        self.created = int(time.time())
        self.metrics = ServingMetrics(backend, model_name)

    def read(self, body: dict, chat: bool) -> Parsed:
        """The checked request (:func:`inference_lab.serving.protocol.read_request`), or an APIError."""
        return read_request(body, chat, model_name=self.model_name, max_seq_len=self.max_seq_len,
                            vocab_size=self.vocab_size, tokenizer=self.tokenizer)


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
        raise bad("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
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


class _Choices:
    """One request's ``n`` choices, each an engine request whose events come into one queue (tagged
    with the choice's index), from the engine's thread into the event loop, and the text each
    makes (:class:`~inference_lab.serving.text.TextStream`: stop strings end a choice, and cancel
    its engine request)."""

    def __init__(self, served: Served, parsed: Parsed):
        loop = asyncio.get_running_loop()
        if served.relay is None or served.relay.loop is not loop:
            served.relay = _Relay(loop)
        self.relay, self.served, self.parsed = served.relay, served, parsed
        self.queue: asyncio.Queue = asyncio.Queue()
        n = len(parsed.requests)
        # the tokens that end a request add no text (a folder's EOS may be an ordinary token; vLLM drops it too)
        self.texts = [TextStream(served.tokenizer, parsed.stops, skip=r.stop_tokens(), min_tokens=r.min_tokens)
                      for r in parsed.requests]
        self.completion_tokens = [0] * n
        self.open = set(range(n))          # choices not finished
        self.arrival, self.last = now(), [None] * n
        for i, request in enumerate(parsed.requests):
            try:
                served.backend.submit(request, lambda event, i=i: self._from_engine(i, event))
            except (QueueFull, RuntimeError, ValueError) as e:
                self.cancel()               # the choices already submitted go too
                if isinstance(e, QueueFull):
                    raise APIError(429, f"the server is full: {e}; retry shortly", code="queue_full",
                                   kind="rate_limit_error", headers={"Retry-After": "1"}) from None
                if isinstance(e, RuntimeError):
                    raise APIError(503, str(e), code="engine_stopped", kind="server_error") from None
                raise bad(str(e)) from None   # the engine's own check (the API's came first)

    def _from_engine(self, i: int, event) -> None:
        # (on the engine's thread: the latencies, on its clock)
        if event.token >= 0 and not self.texts[i].stopped:
            self.served.metrics.token(self.arrival, self.last[i], event, len(self.parsed.requests[i].prompt))
            self.last[i] = event.time
        elif event.finish in ("abort", "error"):
            self.served.metrics.end(event.rid, None, event.time, self.arrival)
        self.relay.put(self.queue, (i, event))

    async def events(self):
        """(choice, text piece, finish reason, log-probability entry or None) per token until every
        choice has ended."""
        while self.open:
            i, event = await self.queue.get()
            if i not in self.open:           # a choice its stop string ended: the rest of its events
                continue
            if event.finish in ("abort", "error"):
                self.open.discard(i)
                if event.finish == "error":
                    self.cancel()
                    raise APIError(500, f"the engine failed: {event.error}", kind="server_error")
                if event.error:   # not a cancel this client asked for: the server is stopping
                    self.cancel()
                    raise APIError(503, f"the request was stopped: {event.error}", code="engine_stopped",
                                   kind="server_error")
                continue
            self.completion_tokens[i] += 1
            text = self.texts[i]
            piece = text.feed(event.token, last=event.finish is not None)
            finish = event.finish
            if text.stopped:
                finish = "stop"
                self._cancel_one(i)
                if event.finish is None:   # (a last token's end the engine's thread counted already)
                    self.served.metrics.end(event.rid, "stop", event.time, self.arrival)
            if finish is not None:
                self.open.discard(i)
            yield i, piece, finish, self._logprob_entry(event)

    def _logprob_entry(self, event) -> dict | None:
        if self.parsed.logprobs is None or event.logprob is None:
            return None
        return {"token": event.token, "logprob": event.logprob, "top": event.top_logprobs}

    def _cancel_one(self, i: int) -> None:
        if i in self.open:
            self.open.discard(i)
            self.served.backend.cancel(self.parsed.requests[i].rid)

    def cancel(self) -> None:
        """Every choice still open ends (a no-op once all have)."""
        for i in list(self.open):
            self._cancel_one(i)

    def usage(self) -> dict:
        p = len(self.parsed.requests[0].prompt)
        c = sum(self.completion_tokens)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


# ----------------------------------------------------------------------------- the answer's shapes
def _completion_logprobs(tokenizer, entries: list, offset: int) -> dict:
    """The legacy completions API's ``logprobs`` of these tokens (their text starting at ``offset``)."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in entries:
        text = tokenizer.token_text(e["token"])
        out["tokens"].append(text)
        out["token_logprobs"].append(e["logprob"])
        out["top_logprobs"].append({tokenizer.token_text(t): lp for t, lp in e["top"]})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def _chat_logprobs(tokenizer, entries: list) -> dict:
    """The chat API's ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}, ...]}``."""
    def one(token, logprob):
        return {"token": tokenizer.token_text(token), "logprob": logprob, "bytes": tokenizer.token_bytes(token)}
    return {"content": [{**one(e["token"], e["logprob"]), "top_logprobs": [one(t, lp) for t, lp in e["top"]]}
                        for e in entries]}


def _choice(served: Served, parsed: Parsed, i: int, text: str, finish, entries: list, *, delta: bool,
            first: bool = False, offset: int = 0) -> dict:
    """One choice of an answer: a whole one, or a streamed chunk's (``delta``)."""
    lp = None
    if parsed.logprobs is not None:
        tok = served.tokenizer
        lp = _chat_logprobs(tok, entries) if parsed.chat else _completion_logprobs(tok, entries, offset)
    if not parsed.chat:
        return {"index": i, "text": text, "logprobs": lp, "finish_reason": finish}
    if delta:
        body = {"role": "assistant", "content": text} if first else {"content": text}
        return {"index": i, "delta": body, "logprobs": lp, "finish_reason": finish}
    return {"index": i, "message": {"role": "assistant", "content": text}, "logprobs": lp, "finish_reason": finish}


def _envelope(served: Served, parsed: Parsed, *, chunk: bool) -> dict:
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if parsed.chat else "text_completion"
    return {"id": parsed.rid, "object": kind, "created": parsed.created, "model": served.model_name}


async def _streamed(served: Served, choices: _Choices):
    parsed = choices.parsed
    started, offsets = set(), [0] * len(parsed.requests)
    try:
        async for i, piece, finish, entry in choices.events():
            choice = _choice(served, parsed, i, piece, finish, [entry] if entry else [], delta=True,
                             first=i not in started, offset=offsets[i])
            started.add(i)
            offsets[i] += len(piece)
            yield f"data: {json.dumps({**_envelope(served, parsed, chunk=True), 'choices': [choice]})}\n\n"
        if parsed.include_usage:
            last = {**_envelope(served, parsed, chunk=True), "choices": [], "usage": choices.usage()}
            yield f"data: {json.dumps(last)}\n\n"
        yield "data: [DONE]\n\n"
    except APIError as e:
        yield f"data: {json.dumps({'error': {'message': e.message, 'type': e.kind, 'code': e.status}})}\n\n"
    finally:
        choices.cancel()   # a no-op once finished; a client that went away frees its slots here


async def _collected(served: Served, choices: _Choices, http: HTTPRequest):
    parsed = choices.parsed
    n = len(parsed.requests)
    texts, finishes, entries = [[] for _ in range(n)], [None] * n, [[] for _ in range(n)]
    events = choices.events()
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
                                        f"{served.request_timeout:g} s ({sum(choices.completion_tokens)} tokens "
                                        "written); it was cancelled: ask for fewer tokens, or stream",
                                   code="request_timeout", kind="timeout_error")
            try:
                i, piece, finish, entry = waiting.result()
            except StopAsyncIteration:
                break
            texts[i].append(piece)
            finishes[i] = finish or finishes[i]
            if entry:
                entries[i].append(entry)
    finally:
        choices.cancel()
    return JSONResponse({**_envelope(served, parsed, chunk=False),
                         "choices": [_choice(served, parsed, i, "".join(texts[i]), finishes[i], entries[i], delta=False)
                                     for i in range(n)],
                         "usage": choices.usage()})


def _completion_route(chat: bool):
    async def route(http: HTTPRequest):
        served: Served = http.app.state.served
        try:
            _check_key(served, http)
            parsed = served.read(await _body(served, http), chat)
            choices = _Choices(served, parsed)
        except APIError as e:
            return _error_response(e)
        if parsed.stream:
            return StreamingResponse(_streamed(served, choices), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            response = await _collected(served, choices, http)
        except APIError as e:
            return _error_response(e)
        return response if response is not None else JSONResponse({}, status_code=499)
    return route


def _keyed(answer):
    """A GET route under ``/v1``: it checks the API key first; ``answer(served)`` gives its response."""
    async def route(http: HTTPRequest):
        served: Served = http.app.state.served
        try:
            _check_key(served, http)
        except APIError as e:
            return _error_response(e)
        return answer(served)
    return route


def _open(answer):
    """A GET route any caller may read (a health probe, a metrics scrape): no key asked."""
    async def route(http: HTTPRequest):
        return answer(http.app.state.served)
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


def _steps(served: Served) -> JSONResponse:
    """The engine's step timeline (:mod:`inference_lab.serving.timeline`), when it keeps one."""
    timeline = getattr(served.backend, "timeline", None)
    if timeline is None:
        return _error_response(APIError(404, "the step timeline is off: start the server with --step-timeline N",
                                        kind="invalid_request_error", code="not_found"))
    return JSONResponse({"object": "list", "data": timeline.as_json()})


async def _http_error(http, exc: HTTPException):
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return _error_response(APIError(exc.status_code, f"{http.method} {http.url.path}: {exc.detail}", kind=kind))


async def _internal_error(http, exc: Exception):
    return _error_response(APIError(500, f"internal error ({type(exc).__name__}); the server log has the details",
                                    kind="server_error"))


def create_app(served: Served, *, lifespan=None) -> Starlette:
    """The ASGI app serving ``served`` (run it with uvicorn: :mod:`inference_lab.serving.server`)."""
    app = Starlette(routes=[
        Route("/v1/completions", _completion_route(chat=False), methods=["POST"]),
        Route("/v1/chat/completions", _completion_route(chat=True), methods=["POST"]),
        Route("/v1/models", _keyed(_models), methods=["GET"]),
        Route("/health", _open(_health), methods=["GET"]),
        Route("/metrics", _open(_metrics), methods=["GET"]),
        Route("/debug/steps", _keyed(_steps), methods=["GET"]),
    ], exception_handlers={HTTPException: _http_error, Exception: _internal_error}, lifespan=lifespan)
    app.state.served = served
    return app
