"""``python -m inference_lab bench-serve``: send a trace to any OpenAI-compatible server and time
every token, the way ``vllm bench serve`` does, into the file ``vllm bench serve --save-result
--save-detailed`` writes.

The trace is one of the simulator's workloads (:func:`inference_lab.analytic.workload.sample_requests`:
Poisson arrivals, prompt and output lengths as constants, ranges or the RAG ratios). Each request
is sent at its arrival time as a streamed ``/v1/completions`` call (``ignore_eos``, so it writes
exactly its output length, as vLLM's random dataset asks); from the stream come, per request,
TTFT (the first chunk with a choice), every inter-token gap and the end-to-end latency. The
prompts are text from the held-out end of the Shakespeare corpus, cut so that a byte-level
tokenizer sees exactly the trace's prompt length (BOS included); another server's tokenizer
counts them its own way, and its ``usage`` says how.

The saved file reads back through :func:`inference_lab.measure.vllm_bench.load_vllm_bench` as
any vLLM run does, so this engine, a real vLLM server and the simulator land in the same records
and plots. ``vllm bench serve --backend openai --base-url http://HOST:PORT --model NAME`` also
works against ``python -m inference_lab serve``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import math
import sys
import time

import numpy as np

from inference_lab.analytic.serving_metrics import ServingTrace, trace_from_token_times
from inference_lab.analytic.workload import Requests, sample_requests
from inference_lab.base import tokenizer as byte_tokenizer
from inference_lab.serving.requests import Request
from pallas_kernels import files

PERCENTILES = (50, 90, 99)


def prompt_texts(lengths, seed: int = 0) -> list[str]:
    """One text per prompt length (tokens of the byte-level tokenizer, BOS included): ASCII from
    the held-out Shakespeare prompts, from a seeded offset."""
    from inference_lab.model import pretrained

    source = "".join(pretrained.heldout_prompts()).encode("ascii", "ignore").decode()
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        want = int(n) - 1
        text = source * (want // len(source) + 2)
        start = int(rng.integers(0, len(source)))
        out.append(text[start:start + want])
    return out


def prompt_ids(lengths, tokenizer, seed: int = 0) -> list[list[int]]:
    """One prompt of token ids per length, ``tokenizer``'s (BOS included where it adds one): the
    texts of :func:`prompt_texts`, long enough to cut, encoded and cut to each length."""
    out = []
    for n, text in zip(lengths, prompt_texts([4 * int(n) + 64 for n in lengths], seed)):
        ids = tokenizer.encode(text)
        while len(ids) < n:
            ids += tokenizer.encode(text, bos=False)
        out.append(ids[:int(n)])
    return out


@dataclasses.dataclass
class RequestResult:
    """What one streamed request measured (seconds from the run's start)."""

    sent: float
    prompt_len: int
    output_len: int = 0
    ttft: float | None = None
    itls: list = dataclasses.field(default_factory=list)
    latency: float | None = None
    text: str = ""
    error: str = ""


async def _one(client, url, payload, headers, sent, t0) -> RequestResult:
    result = RequestResult(sent=sent - t0, prompt_len=payload["_prompt_len"])
    body = {k: v for k, v in payload.items() if not k.startswith("_")}
    start = time.perf_counter()
    last = start
    chunks, usage = 0, None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {text[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                message = json.loads(data)
                if "error" in message:
                    result.error = str(message["error"])[:200]
                    return result
                stamp = time.perf_counter()
                if message.get("usage"):
                    usage = message["usage"]
                choices = message.get("choices")
                if not choices:
                    continue
                if result.ttft is None:
                    result.ttft = stamp - start
                else:
                    result.itls.append(stamp - last)
                last = stamp
                chunks += 1
                result.text += choices[0].get("text") or ""
    except Exception as e:   # a refused connection or a reset stream is a failed request, not a crash
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.latency = last - start
    result.output_len = int(usage["completion_tokens"]) if usage else chunks
    if usage:   # the server's own count of the prompt (its tokenizer's, for a text prompt)
        result.prompt_len = int(usage["prompt_tokens"])
    if result.ttft is None:
        result.error = "the stream ended without a token"
    return result


async def _run(base_url, model, requests: Requests, prompts, *, api_key, max_concurrency, timeout):
    import httpx

    url = base_url.rstrip("/") + "/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limit = asyncio.Semaphore(max_concurrency or len(requests))
    limits = httpx.Limits(max_connections=max_concurrency or len(requests) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
        t0 = time.perf_counter()

        async def send(i):
            delay = t0 + float(requests.arrival[i]) - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with limit:
                payload = {"model": model, "prompt": prompts[i], "max_tokens": int(requests.output_len[i]),
                           "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
                           "ignore_eos": True, "_prompt_len": int(requests.prompt_len[i])}
                return await _one(client, url, payload, headers, time.perf_counter(), t0)

        results = await asyncio.gather(*(send(i) for i in range(len(requests))))
        return results, time.perf_counter() - t0


@dataclasses.dataclass
class BenchResult:
    """One run of the load generator: per-request results, the run's length and its trace."""

    label: str
    model: str
    base_url: str
    request_rate: float
    max_concurrency: int | None
    results: list
    duration: float

    def trace(self) -> ServingTrace:
        """The run as a :class:`ServingTrace` (failed requests kept, marked not ok)."""
        ok = np.array([not r.error for r in self.results])
        sent = np.array([r.sent for r in self.results])
        ttft = np.array([r.ttft or 0.0 for r in self.results])
        gaps = [np.asarray(r.itls if not r.error else [], np.float64) for r in self.results]
        offsets = np.concatenate([[0], np.cumsum([len(g) for g in gaps])]).astype(np.int64)
        out = np.array([max(r.output_len, 1) for r in self.results])
        reqs = Requests(sent, np.array([r.prompt_len for r in self.results]), out)
        finish = sent + np.array([r.latency or 0.0 for r in self.results])
        return ServingTrace(mode=self.label, requests=reqs, first_token=sent + ttft, finish=finish,
                            itl_values=np.concatenate(gaps) if offsets[-1] else np.empty(0),
                            itl_offsets=offsets, ok=ok, duration=self.duration)

    def as_vllm(self) -> dict:
        """The run as ``vllm bench serve --save-result --save-detailed`` writes it."""
        ok = [r for r in self.results if not r.error]
        out = {
            "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "openai", "label": self.label,
            "model_id": self.model, "tokenizer_id": self.model, "endpoint_type": "openai",
            "num_prompts": len(self.results), "request_rate": "inf" if math.isinf(self.request_rate) else self.request_rate,
            "burstiness": 1.0, "max_concurrency": self.max_concurrency, "duration": self.duration,
            "completed": len(ok), "failed": len(self.results) - len(ok),
            "total_input_tokens": int(sum(r.prompt_len for r in ok)),
            "total_output_tokens": int(sum(r.output_len for r in ok)),
            "request_throughput": len(ok) / self.duration,
            "request_goodput": None,
            "output_throughput": sum(r.output_len for r in ok) / self.duration,
            "total_token_throughput": sum(r.output_len + r.prompt_len for r in ok) / self.duration,
        }
        per = {"ttft": [r.ttft for r in ok], "itl": [g for r in ok for g in r.itls],
               "tpot": [(r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1],
               "e2el": [r.latency for r in ok]}
        for name, values in per.items():
            v = 1e3 * np.asarray(values, np.float64)
            out[f"mean_{name}_ms"] = float(v.mean()) if len(v) else 0.0
            out[f"median_{name}_ms"] = float(np.median(v)) if len(v) else 0.0
            out[f"std_{name}_ms"] = float(v.std()) if len(v) else 0.0
            for q in PERCENTILES:
                out[f"p{q}_{name}_ms"] = float(np.percentile(v, q)) if len(v) else 0.0
        out.update(
            input_lens=[r.prompt_len for r in self.results],
            output_lens=[r.output_len if not r.error else 0 for r in self.results],
            ttfts=[r.ttft or 0.0 for r in self.results],
            itls=[r.itls for r in self.results],
            start_times=[r.sent for r in self.results],
            latencies=[r.latency or 0.0 for r in self.results],
            generated_texts=[r.text for r in self.results],
            errors=[r.error for r in self.results])
        return out

    def save(self, path, *, force: bool = False):
        """Write :meth:`as_vllm` to ``path`` (refused if it exists, unless ``force``)."""
        path = files.check_output_path(path, force=force, flag="--save-result")
        return files.atomic_write_text(path, json.dumps(self.as_vllm(), indent=1) + "\n")


def bench_serve(base_url: str, requests: Requests, *, model: str, api_key: str | None = None,
                max_concurrency: int | None = None, label: str = "inference-lab", seed: int = 0,
                timeout: float = 300.0, request_rate: float | None = None, prompts=None,
                tokenizer=None) -> BenchResult:
    """Send ``requests`` (arrival times, prompt and output lengths) to the OpenAI-compatible
    server at ``base_url`` (``http://host:port/v1``) and time every token. ``request_rate`` is
    only recorded (the arrivals carry it). In a notebook, where an event loop already runs,
    the run takes a thread of its own. ``prompts``: the texts (or token-id lists) to send; by
    default held-out Shakespeare cut to each prompt length, as text, or as ``tokenizer``'s ids
    when one is given (:func:`prompt_ids`)."""
    if prompts is None:
        lengths = requests.prompt_len
        prompts = prompt_texts(lengths, seed) if tokenizer is None else prompt_ids(lengths, tokenizer, seed)
    prompts = list(prompts)
    run = _run(base_url, model, requests, prompts, api_key=api_key, max_concurrency=max_concurrency,
               timeout=timeout)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        results, duration = asyncio.run(run)
    else:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            results, duration = pool.submit(asyncio.run, run).result()
    rate = request_rate if request_rate is not None else math.inf
    return BenchResult(label, model, base_url, rate, max_concurrency, list(results), duration)


def drive_engine(backend, requests: Requests, *, label: str | None = None, seed: int = 0,
                 timeout: float = 300.0, sampling=None, prompts=None, start: float | None = None) -> ServingTrace:
    """The same trace sent to an engine directly, without HTTP: each request is submitted at its
    arrival time (from this thread) and its tokens are timed as the engine stamps them. What
    the server adds is the difference between this and :func:`bench_serve` on the same trace.
    ``sampling``: one dict per request of :class:`~inference_lab.serving.requests.Request`'s
    ``temperature``, ``top_k`` and ``seed`` (default: greedy). ``prompts``: the texts to send
    (default: :func:`prompt_texts` of the trace's lengths). ``start``: the moment (on the engine's
    clock, :func:`~inference_lab.serving.requests.now`) the trace's times count from, arrivals
    included; default: once the prompts are tokenized."""
    import threading

    texts = prompt_texts(requests.prompt_len, seed) if prompts is None else list(prompts)
    prompts = [byte_tokenizer.encode(t) for t in texts]
    n = len(requests)
    times: list[list[float]] = [[] for _ in range(n)]
    failed = np.zeros(n, bool)
    done = threading.Semaphore(0)

    def emit_for(i):
        def emit(event):
            if event.finish in ("abort", "error"):
                failed[i] = True
            else:
                times[i].append(event.time)
            if event.finish is not None:
                done.release()
        return emit

    t0 = time.perf_counter() if start is None else start   # the engine stamps its tokens with this clock
    sent = np.zeros(n)
    for i in range(n):
        delay = t0 + float(requests.arrival[i]) - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent[i] = time.perf_counter() - t0
        backend.submit(Request(f"drive-{i}", prompts[i], int(requests.output_len[i]), stop_at_eos=False,
                               **(sampling[i] if sampling is not None else {})), emit_for(i))
    for _ in range(n):
        if not done.acquire(timeout=timeout):
            raise TimeoutError(f"the engine did not finish {n} requests within {timeout:g} s")
    got = Requests(sent, requests.prompt_len.copy(), requests.output_len.copy())
    stamps = [np.asarray(t) - t0 if t else np.array([0.0]) for t in times]
    return trace_from_token_times(label or getattr(backend, "policy", "engine"), got, stamps, ok=~failed)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m inference_lab bench-serve",
                                description="Time an OpenAI-compatible server with a trace of streamed requests; "
                                            "save the result in vllm bench serve's --save-result format.")
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the server's /v1 URL (default: %(default)s)")
    p.add_argument("--model", default="shakespeare_large", help="the model name /v1/models lists")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="a Hugging Face folder whose tokenizer cuts the prompts: they go as its token ids, exactly "
                        "--prompt-len each (default: text cut for the byte-level tokenizer)")
    p.add_argument("--api-key", default=None, help="sent as `Authorization: Bearer KEY`")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests/s, Poisson (default: all at once)")
    p.add_argument("--prompt-len", type=int, default=64, help="prompt tokens (default: %(default)s)")
    p.add_argument("--output-len", type=int, default=32, help="output tokens (default: %(default)s)")
    p.add_argument("--rag", action="store_true", help="prompt = output x 19..47 (RAG traffic), replacing --prompt-len")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="inference-lab")
    p.add_argument("--save-result", default=None, help="write the vllm bench serve result file here")
    p.add_argument("--force", action="store_true", help="replace an existing --save-result file")
    args = p.parse_args(argv)
    for name in ("num_prompts", "prompt_len", "output_len"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be at least 1")
    if not args.request_rate > 0:
        p.error(f"--request-rate={args.request_rate} must be > 0 (inf: all at once)")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        p.error(f"--max-concurrency={args.max_concurrency} must be at least 1")
    if args.save_result:
        try:
            files.check_output_path(args.save_result, force=args.force, flag="--save-result")
        except ValueError as e:
            p.error(str(e))
    tok = None
    if args.tokenizer is not None:
        from inference_lab.base import folder_tokenizer

        try:
            tok = folder_tokenizer.load(args.tokenizer)
        except ValueError as e:
            p.error(f"--tokenizer {args.tokenizer}: {e}")
    rate = args.request_rate
    requests = sample_requests(args.num_prompts, rate if math.isfinite(rate) else 1.0, output_len=args.output_len,
                               prompt_len=args.prompt_len, ratio=(19, 47) if args.rag else None, seed=args.seed)
    if not math.isfinite(rate):
        requests = dataclasses.replace(requests, arrival=np.zeros(len(requests)))
    result = bench_serve(args.base_url, requests, model=args.model, api_key=args.api_key,
                         max_concurrency=args.max_concurrency, label=args.label, seed=args.seed, request_rate=rate,
                         tokenizer=tok)
    row = result.trace().summary()
    failed = sum(1 for r in result.results if r.error)
    print(f"{row['completed']} of {len(requests)} requests completed in {result.duration:.2f} s "
          f"({row['output_tokens_per_s']:.0f} output tok/s)")
    for name in ("ttft", "tpot", "itl", "e2e"):
        print(f"  {name.upper():5s} p50 {row[f'{name}_p50_ms']:8.1f} ms   p99 {row[f'{name}_p99_ms']:8.1f} ms")
    if failed:
        first = next(r.error for r in result.results if r.error)
        print(f"{failed} requests failed; the first: {first}", file=sys.stderr)
    if args.save_result:
        print(f"wrote {result.save(args.save_result, force=args.force)}")
    return 1 if failed == len(requests) else 0
