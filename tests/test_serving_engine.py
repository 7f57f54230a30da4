"""The serving engine's server: text equal to generate() under every policy (speculative decoding
on one), through the official OpenAI client; every bad request its 4xx; the key; a disconnect frees
its slot; the server and its workers stop cleanly; the load generator's file reads back. (The
engine alone: tests/test_engine_loop.py; floods, stops, timeouts and dead workers:
tests/test_serving_faults.py.)

Servers start once for the module (the trained 1.7M-parameter `shakespeare` model: quick to
compile, same code as the larger one) and every test keeps its request count small; `make
unit-test` hands whole files to its workers, so they start once. The two-pool server is started
by a stand-in notebook kernel (a child process), which the last test kills as a kernel restart
would: the server and both workers must go with it.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from inference_lab.analytic.serving_metrics import trace_from_token_times
from inference_lab.analytic.workload import Requests
from inference_lab.base import tokenizer
from inference_lab.lessons import serving_engine as lesson
from inference_lab.serving import metrics
from inference_lab.serving import server as serving_server
from serving_helpers import LENGTHS, PRESET, PROMPTS, generated, load

KEY = "test-key-123"
# the chunked server's KV cache: paged, one full context of blocks (the in-process paged engines'
# programs), prefix caching on; the other servers keep contiguous slots
PAGED = ("--block-size", "16", "--num-kv-blocks", "17", "--enable-prefix-caching")


@pytest.fixture(scope="module")
def expected():
    return generated(load())


class KernelServer:
    """A server started by a stand-in notebook kernel: ``python -c`` running ServerProcess."""

    def __init__(self, policy: str):
        code = ("from inference_lab.serving.server import ServerProcess\n"
                f"s = ServerProcess('--slots', '2', policy={policy!r}, preset={PRESET!r})\n"
                "print(s.process.pid, s.url, flush=True)\nimport time\ntime.sleep(600)\n")
        self.kernel = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        line = self.kernel.stdout.readline().split()
        assert len(line) == 2, "the kernel's server did not start"
        self.pid, self.url = int(line[0]), line[1]
        self.base_url = self.url + "/v1"

    def stop(self):
        if self.kernel.poll() is None:
            self.kernel.kill()
            self.kernel.wait()


@pytest.fixture(scope="module")
def servers():
    """One server per policy, each with two slots (so they compile the programs of the engines of
    tests/test_engine_loop.py and tests/test_serving_faults.py: the compile cache serves them all):
    chunked with a key and a paged KV cache, prefill-first with n-gram speculative decoding, disaggregated (two worker processes, started by a stand-in kernel). One after
    another, from this thread: a server dies with the thread that started it (PR_SET_PDEATHSIG
    follows the thread), so they cannot be started side by side from worker threads."""
    started = {}
    try:
        started["disaggregated"] = KernelServer("disaggregated")
        started["chunked"] = serving_server.ServerProcess("--api-key", KEY, "--slots", "2", "--max-num-batched-tokens",
                                                          "32", *PAGED, "--step-timeline", "500", policy="chunked",
                                                          preset=PRESET)
        started["prefill-first"] = serving_server.ServerProcess("--slots", "2", "--speculative", "ngram",
                                                                "--num-speculative-tokens", "3", "--kv-cache-layout",
                                                                "contiguous", policy="prefill-first", preset=PRESET)
        yield started
    finally:
        for s in started.values():
            s.stop()


def _headers(policy):
    return {"Authorization": f"Bearer {KEY}"} if policy == "chunked" else {}


def _client(servers, policy):
    import openai
    return openai.OpenAI(base_url=servers[policy].base_url, api_key=KEY if policy == "chunked" else "none",
                         max_retries=0, timeout=60)


# ----------------------------------------------------------------------------- through the OpenAI client
@pytest.mark.parametrize("policy", ["chunked", "prefill-first", "disaggregated"])
def test_openai_client_streams_the_text_generate_writes(servers, expected, policy):
    """Three concurrent streams of different lengths (the prefill-first server has two slots:
    one waits): continuous batching changes timing, never text."""
    client = _client(servers, policy)
    out = [None] * 3

    def one(i):
        pieces, usage = [], None
        for chunk in client.completions.create(model=PRESET, prompt=PROMPTS[i], max_tokens=LENGTHS[i], temperature=0,
                                               stream=True, stream_options={"include_usage": True},
                                               extra_body={"ignore_eos": True}):
            if chunk.choices:
                pieces.append(chunk.choices[0].text)
            if chunk.usage:
                usage = chunk.usage
        out[i] = ("".join(pieces), usage)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [o[0] for o in out] == expected
    assert [o[1].completion_tokens for o in out] == LENGTHS
    assert out[0][1].prompt_tokens == len(tokenizer.encode(PROMPTS[0]))


def test_speculative_server_reports_its_acceptance(servers, expected):
    """The prefill-first server speculates (n-gram, 3 tokens): greedy text as generate() writes it
    (the streaming test above), and /health counts the guesses checked and kept."""
    song = "ROMEO:\nO Romeo, Romeo, wherefore art thou Romeo? O Romeo, Romeo, wherefore art thou"
    r = httpx.post(servers["prefill-first"].base_url + "/completions", timeout=60,
                   json={"model": PRESET, "prompt": song, "max_tokens": 30, "temperature": 0})
    assert r.status_code == 200
    health = httpx.get(servers["prefill-first"].url + "/health").json()
    spec = health["speculative"]
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == 3 and spec["proposed"] > 0
    assert spec["acceptance_rate"] == spec["accepted"] / spec["proposed"]


def test_openai_client_without_streaming_and_chat(servers, expected):
    client = _client(servers, "chunked")
    done = client.completions.create(model=PRESET, prompt=PROMPTS[1], max_tokens=LENGTHS[1], temperature=0,
                                     extra_body={"ignore_eos": True})
    assert done.choices[0].text == expected[1] and done.choices[0].finish_reason == "length"
    assert done.usage.completion_tokens == LENGTHS[1]
    chat = client.chat.completions.create(model=PRESET, messages=[{"role": "romeo", "content": "But soft!"}],
                                          max_tokens=10, temperature=0)
    assert chat.choices[0].message.role == "assistant" and len(chat.choices[0].message.content) > 0
    assert chat.usage.completion_tokens == 10
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=PRESET, messages=[{"role": "romeo", "content": "But soft!"}], max_tokens=10, temperature=0,
        stream=True) if c.choices)
    assert streamed == chat.choices[0].message.content
    assert [m.id for m in client.models.list().data] == [PRESET]


# ----------------------------------------------------------------------------- what a request may ask
def _complete(servers, **body):
    r = httpx.post(servers["chunked"].base_url + "/completions", headers=_headers("chunked"), timeout=60,
                   json={"model": PRESET, **body})
    assert r.status_code == 200, r.text
    return r.json()


def _streamed_text(servers, **body) -> tuple[str, str]:
    """(text, finish reason) of a streamed completion of one choice."""
    pieces, finish = [], None
    with httpx.stream("POST", servers["chunked"].base_url + "/completions", headers=_headers("chunked"), timeout=60,
                      json={"model": PRESET, "stream": True, **body}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                pieces.append(choice["text"])
                finish = choice["finish_reason"] or finish
    return "".join(pieces), finish


def test_stop_strings_stop_tokens_and_min_tokens(servers, expected):
    """Greedy answers whose text is known (generate()): a stop string cuts the text before its
    first appearance, streamed or not (the stream holds back what could begin it), finish "stop";
    a stop token ends it before its own character; with min_tokens it may not end, nor be drawn,
    before that many tokens."""
    want = expected[2]                                             # 45 greedy tokens of PROMPTS[2]
    cut = want[10:13]
    at = want.index(cut)
    body = dict(prompt=PROMPTS[2], max_tokens=45, temperature=0, ignore_eos=True)
    done = _complete(servers, stop=[cut, "never in it"], **body)["choices"][0]
    assert (done["text"], done["finish_reason"]) == (want[:at], "stop")
    assert _streamed_text(servers, stop=cut, **body) == (want[:at], "stop")
    stop_char = want[5]
    first = want.index(stop_char)
    done = _complete(servers, stop_token_ids=[ord(stop_char)], **body)["choices"][0]
    assert (done["text"], done["finish_reason"]) == (want[:first], "stop")
    late = _complete(servers, stop_token_ids=[ord(stop_char)], min_tokens=first + 5, **body)
    text = late["choices"][0]["text"]
    assert late["usage"]["completion_tokens"] >= first + 5 and stop_char not in text[:first + 4]
    assert text[:first] == want[:first]                            # the same greedy text up to the ban


def test_logprobs_on_both_routes(servers, expected):
    """Completions (logprobs=3) and chat (logprobs, top_logprobs=2, through the official client):
    every token has its log-probability and its alternatives, likeliest first; a greedy token is
    the likeliest, so its log-probability is the first alternative's; logprobs 0 gives the token's
    own only."""
    done = _complete(servers, prompt=PROMPTS[1], max_tokens=12, temperature=0, ignore_eos=True, logprobs=3)
    lp = done["choices"][0]["logprobs"]
    assert done["choices"][0]["text"] == expected[1] and "".join(lp["tokens"]) == expected[1]
    assert len(lp["token_logprobs"]) == 12 and all(v <= 0 for v in lp["token_logprobs"])
    for chosen, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        values = list(top.values())
        assert len(top) <= 3 and values == sorted(values, reverse=True) and chosen == values[0]
    assert lp["text_offset"] == list(range(12))
    bare = _complete(servers, prompt=PROMPTS[1], max_tokens=3, temperature=0, logprobs=0)["choices"][0]["logprobs"]
    assert bare["top_logprobs"] == [{}, {}, {}] and len(bare["token_logprobs"]) == 3
    chat = _client(servers, "chunked").chat.completions.create(
        model=PRESET, messages=[{"role": "romeo", "content": "But soft!"}], max_tokens=6, temperature=0,
        logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == 6 and all(len(c.top_logprobs) == 2 and c.logprob == c.top_logprobs[0].logprob
                                     for c in content)
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    plain = _complete(servers, prompt=PROMPTS[1], max_tokens=3, temperature=0)["choices"][0]
    assert plain["logprobs"] is None


def test_n_choices_share_the_prompt_and_each_is_its_own_seed(servers):
    """n=3 sampled choices of one prompt: each is what a one-choice request with seed + i writes
    (a seeded request gives the same choices again), usage counts the prompt once, and the later
    choices found the prompt's blocks in the prefix cache instead of computing them again."""
    prompt = PROMPTS[2]                                         # 68 tokens: 4 whole blocks of 16
    page = lambda: metrics.parse(httpx.get(servers["chunked"].url + "/metrics").text)   # noqa: E731
    body = dict(prompt=prompt, max_tokens=8, temperature=1.0, ignore_eos=True)
    before = page()
    many = _complete(servers, n=3, seed=11, **body)
    hits = page()["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    assert hits >= 2 * 64                                       # choices 1 and 2: the prompt's 4 blocks each
    texts = [c["text"] for c in sorted(many["choices"], key=lambda c: c["index"])]
    assert [c["index"] for c in many["choices"]] == [0, 1, 2] and len(set(texts)) > 1
    assert texts == [_complete(servers, seed=11 + i, **body)["choices"][0]["text"] for i in range(3)]
    usage = many["usage"]
    assert usage["prompt_tokens"] == len(tokenizer.encode(prompt)) and usage["completion_tokens"] == 24
    streamed = {}
    with httpx.stream("POST", servers["chunked"].base_url + "/completions", headers=_headers("chunked"), timeout=60,
                      json={"model": PRESET, "stream": True, "n": 3, "seed": 11, **body}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    streamed[c["index"]] = streamed.get(c["index"], "") + c["text"]
    assert [streamed[i] for i in range(3)] == texts


def test_sampling_settings_seeds_and_created(servers, expected):
    """top_p and min_p so tight that only the likeliest token is left give the greedy text; seeds
    use all 64 bits (a seed and the seed + 2**32 sample differently; -1 is 2**64 - 1); each answer
    has its own `created`, the time it was made."""
    greedy = expected[1]
    body = dict(prompt=PROMPTS[1], max_tokens=12, ignore_eos=True, temperature=1.0)
    assert _complete(servers, top_p=1e-6, seed=3, **body)["choices"][0]["text"] == greedy
    assert _complete(servers, min_p=0.999999, seed=3, **body)["choices"][0]["text"] == greedy
    texts = [_complete(servers, seed=s, **body)["choices"][0]["text"] for s in (5, 5 + 2**32, -1, 2**64 - 1)]
    assert texts[0] != texts[1] and texts[2] == texts[3]
    t0 = int(time.time())
    made = _complete(servers, prompt="a", max_tokens=1)["created"]
    assert t0 <= made <= int(time.time())


# ----------------------------------------------------------------------------- refusals
BAD = [
    ({"model": "gpt-9", "prompt": "a"}, 404, "model"),
    ({"prompt": "a"}, 400, "model"),
    ({"model": PRESET}, 400, "prompt"),
    ({"model": PRESET, "prompt": "a" * 300}, 400, "prompt"),
    ({"model": PRESET, "prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": PRESET, "prompt": "a", "max_tokens": 300}, 400, "max_tokens"),
    ({"model": PRESET, "prompt": "a", "max_tokens": "5"}, 400, "max_tokens"),
    ({"model": PRESET, "prompt": "a", "temperature": -1}, 400, "temperature"),
    ({"model": PRESET, "prompt": "a", "temperature": float("nan")}, 400, "temperature"),   # Python's json reads NaN
    ({"model": PRESET, "prompt": "a", "seed": 2**64}, 400, "seed"),
    ({"model": PRESET, "prompt": "a", "seed": -2**63 - 1}, 400, "seed"),
    ({"model": PRESET, "prompt": "a", "top_k": 10_000}, 400, "top_k"),
    ({"model": PRESET, "prompt": "a", "n": 9}, 400, "n"),
    ({"model": PRESET, "prompt": "a", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"model": PRESET, "prompt": "a", "stop": [""]}, 400, "stop"),
    ({"model": PRESET, "prompt": "a", "top_p": 0}, 400, "top_p"),
    ({"model": PRESET, "prompt": "a", "min_p": 1}, 400, "min_p"),
    ({"model": PRESET, "prompt": "a", "min_tokens": 17}, 400, "min_tokens"),    # past max_tokens (16)
    ({"model": PRESET, "prompt": "a", "stop_token_ids": [10, 9999]}, 400, "stop_token_ids"),
    ({"model": PRESET, "prompt": "a", "logprobs": 6}, 400, "logprobs"),
    ({"model": PRESET, "prompt": "a", "logprobs": True}, 400, "logprobs"),
    ({"model": PRESET, "prompt": "a", "logit_bias": {"10": 5}}, 400, "logit_bias"),
    ({"model": PRESET, "prompt": "a", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ({"model": PRESET, "prompt": "a", "best_of": 3}, 400, "best_of"),
    ({"model": PRESET, "prompt": "a", "frobnicate": 1}, 400, "frobnicate"),
    ({"model": PRESET, "prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"model": PRESET, "prompt": "a", "stream": True, "stream_options": {"continuous": True}}, 400, "stream_options"),
    ({"model": PRESET, "prompt": ["a", "b"]}, 400, "prompt"),
    ({"model": PRESET, "prompt": [1, 2, 99999]}, 400, "prompt"),
    ({"model": PRESET, "prompt": "a", "stream": "yes"}, 400, "stream"),
    ([1, 2, 3], 400, None),
]


@pytest.mark.parametrize("body,status,param", BAD, ids=[str(i) for i in range(len(BAD))])
def test_each_bad_request_gets_its_4xx(servers, body, status, param):
    data = json.dumps(body, allow_nan=True)
    r = httpx.post(servers["chunked"].base_url + "/completions", content=data, headers=_headers("chunked"), timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["param"] == param and "Traceback" not in r.text


def test_transport_refusals(servers):
    url = servers["chunked"].base_url + "/completions"
    h = _headers("chunked")
    assert httpx.post(url, content=b"{not json", headers=h).status_code == 400
    assert httpx.post(url, content=b"[" * 100_000 + b"]" * 100_000, headers=h).status_code == 400   # deep nesting
    big = httpx.post(url, content=b"x" * (2 << 20), headers=h)
    assert big.status_code == 413 and big.json()["error"]["code"] == "body_too_large"
    for given in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.post(url, json={"model": PRESET, "prompt": "a"}, headers=given)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(servers["chunked"].base_url + "/models").status_code == 401
    # a load balancer's probe and a Prometheus scrape carry no key: /health and /metrics answer them
    assert httpx.get(servers["chunked"].url + "/health").status_code == 200
    assert httpx.get(servers["chunked"].url + "/metrics").status_code == 200
    assert httpx.get(servers["chunked"].url + "/nowhere", headers=h).json()["error"]["message"]
    assert httpx.get(url, headers=h).status_code == 405


def test_the_step_timeline_is_served_behind_the_key(servers, expected):
    """--step-timeline: GET /debug/steps lists the last iterations (behind the API key, as /v1); a
    request's prompt and tokens are in them; a server without the flag answers 404 saying how."""
    steps = servers["chunked"].url + "/debug/steps"
    before = httpx.get(steps, headers=_headers("chunked")).json()["data"]
    client = _client(servers, "chunked")
    client.completions.create(model=PRESET, prompt=PROMPTS[0], max_tokens=6, temperature=0,
                              extra_body={"ignore_eos": True})
    after = httpx.get(steps, headers=_headers("chunked")).json()["data"]
    new = after[len(before):] if len(after) < 500 else after
    assert sum(r["prompt_tokens"] for r in new) >= 1 and sum(r["decode_rows"] for r in new) >= 5
    assert all(r["seconds"] > 0 and r["predicted_s"] > 0 and len(r["shape"]) == 2 for r in new)
    assert httpx.get(steps).status_code == 401
    off = httpx.get(servers["prefill-first"].url + "/debug/steps")
    assert off.status_code == 404 and "--step-timeline" in off.json()["error"]["message"]


@pytest.mark.parametrize("policy", ["chunked", "disaggregated"])
def test_a_client_that_goes_away_frees_its_slot(servers, policy):
    base = servers[policy].base_url
    with httpx.stream("POST", base + "/completions", headers=_headers(policy), timeout=30,
                      json={"model": PRESET, "prompt": "a", "max_tokens": 250, "stream": True, "ignore_eos": True}) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
        assert httpx.get(servers[policy].url + "/health", headers=_headers(policy)).json()["active"] == 1
    deadline = time.time() + 10
    while httpx.get(servers[policy].url + "/health", headers=_headers(policy)).json()["active"]:
        assert time.time() < deadline, "the slot was not freed after the client left"
        time.sleep(0.05)


def test_paged_server_preempts_shares_prefixes_and_says_so_in_metrics(servers):
    """Through the official client: two long answers on the paged server (2 slots, a pool of one
    full context) outgrow the pool, so one is preempted and recomputed, and the same prompt twice hits
    the prefix cache. Each text is what generate() writes alone; /metrics (Prometheus text, vLLM's
    names) counts the preemption, the prefix-cache lookups and hits, the latencies, and the pool is
    free again."""
    from inference_lab.runtime import generation

    client = _client(servers, "chunked")
    prompt = PROMPTS[2]
    want = generation.generate(load(), prompt, max_new_tokens=140)
    before = collections.defaultdict(float, metrics.parse(
        httpx.get(servers["chunked"].url + "/metrics", headers=_headers("chunked")).text))   # a counter not yet seen: 0
    out = [None, None]

    def one(i):
        out[i] = client.completions.create(model=PRESET, prompt=prompt, max_tokens=140, temperature=0,
                                           extra_body={"ignore_eos": True}).choices[0].text

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert out == [want, want]
    page = httpx.get(servers["chunked"].url + "/metrics", headers=_headers("chunked"))
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
    assert 'model_name="shakespeare"' in page.text
    m = metrics.parse(page.text)
    assert m["vllm:num_preemptions_total"] > before["vllm:num_preemptions_total"]
    assert m["vllm:prefix_cache_hits_total"] >= before["vllm:prefix_cache_hits_total"] + 32
    assert m["vllm:prefix_cache_queries_total"] > m["vllm:prefix_cache_hits_total"]
    assert m["vllm:time_to_first_token_seconds_count"] >= before["vllm:time_to_first_token_seconds_count"] + 2
    assert m["vllm:inter_token_latency_seconds_count"] >= before["vllm:inter_token_latency_seconds_count"] + 2 * 139
    assert m["vllm:e2e_request_latency_seconds_count"] >= before["vllm:e2e_request_latency_seconds_count"] + 2
    assert m["vllm:kv_cache_usage_perc"] == 0.0 and m["vllm:num_requests_running"] == 0
    health = httpx.get(servers["chunked"].url + "/health", headers=_headers("chunked")).json()
    kv = health["kv_cache"]
    assert kv["layout"] == "paged" and kv["blocks_free"] == kv["blocks_usable"] == 16 and kv["blocks_used"] == 0
    assert m["vllm:prompt_tokens_total"] >= before["vllm:prompt_tokens_total"] + 2 * len(tokenizer.encode(prompt))
    assert m["vllm:generation_tokens_total"] >= before["vllm:generation_tokens_total"] + 2 * 140
    assert m["vllm:request_success_total"] >= before["vllm:request_success_total"] + 2
    assert 'finished_reason="length"' in page.text
    for stage in ("queue", "prefill", "decode"):
        name = f"vllm:request_{stage}_time_seconds_count"
        assert m[name] >= before[name] + 2, stage
    contiguous = metrics.parse(httpx.get(servers["prefill-first"].url + "/metrics").text)
    assert contiguous["vllm:num_preemptions_total"] == 0 == contiguous["vllm:prefix_cache_queries_total"]


# ----------------------------------------------------------------------------- the load generator
def test_bench_file_reads_back_with_the_numbers_measured(servers, tmp_path):
    from inference_lab.measure.vllm_bench import load_vllm_bench
    from inference_lab.serving.load import bench_serve

    reqs = Requests(np.array([0.0, 0.05, 0.1, 0.15]), np.array([20, 60, 9, 40]), np.array([12, 5, 20, 8]))
    result = bench_serve(servers["disaggregated"].base_url, reqs, model=PRESET, label="lab-test")
    path = result.save(tmp_path / "run.json")
    run, = load_vllm_bench(path)
    assert run.completed == 4 and run.failed == 0 and run.label == "lab-test"
    assert run.trace.requests.output_len.tolist() == [12, 5, 20, 8] == [r.output_len for r in result.results]
    mine, theirs = result.trace().summary(), run.summary()
    for key in ("ttft_p50_ms", "tpot_p50_ms", "itl_p99_ms", "e2e_p90_ms", "output_tokens_per_s"):
        assert theirs[key] == pytest.approx(mine[key], rel=1e-9), key
    with pytest.raises(ValueError, match="already exists"):
        result.save(path)


def test_bench_serve_command_and_a_refused_bind(servers, tmp_path):
    out = tmp_path / "cli.json"
    cli = [sys.executable, "-m", "inference_lab", "bench-serve", "--base-url", servers["chunked"].base_url,
           "--model", PRESET, "--api-key", KEY, "--num-prompts", "3", "--prompt-len", "30", "--output-len", "6",
           "--save-result", str(out)]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "3 of 3 requests completed" in done.stdout, done.stderr
    assert json.loads(out.read_text())["output_lens"] == [6, 6, 6]
    refused = subprocess.run([sys.executable, "-m", "inference_lab", "serve", "--host", "0.0.0.0"],
                             capture_output=True, text=True, timeout=60, env={**os.environ, "INFERENCE_LAB_API_KEY": ""})
    assert refused.returncode == 2 and "--api-key" in refused.stderr and "Traceback" not in refused.stderr


def test_parse_args_rules():
    with pytest.raises(SystemExit):
        serving_server.parse_args(["--host", "10.0.0.5", "--api-key", " "])
    assert serving_server.parse_args(["--host", "10.0.0.5", "--api-key", "k"]).api_key == "k"
    assert serving_server.parse_args(["--host", "::1"]).api_key in (None, os.environ.get("INFERENCE_LAB_API_KEY"))
    for bad in (["--slots", "8", "--max-num-batched-tokens", "8"], ["--num-speculative-tokens", "16"],
                ["--request-timeout", "0"], ["--speculative", "eagle"]):
        with pytest.raises(SystemExit):
            serving_server.parse_args(bad)
    for bad, words in ((["--block-size", "24"], "--block-size=24"), (["--num-kv-blocks", "16"], "full context"),
                       (["--kv-cache-memory", "lots"], "--kv-cache-memory"), (["--num-kv-blocks", "1"], ">= 2"),
                       (["--policy", "disaggregated", "--enable-prefix-caching"], "contiguous caches"),
                       (["--num-kv-blocks", "40", "--kv-cache-memory", "9MiB"], "not both")):
        err = subprocess.run([sys.executable, "-m", "inference_lab", "serve", *bad], capture_output=True, text=True,
                             timeout=60)
        assert err.returncode == 2 and words in err.stderr and "Traceback" not in err.stderr, (bad, err.stderr)
    paged = serving_server.parse_args(["--kv-cache-memory", "8MiB", "--enable-prefix-caching"])
    assert paged.kv_cache_memory == "8MiB" and paged.enable_prefix_caching and paged.block_size is None
    args = serving_server.parse_args(["--no-async-scheduling", "--speculative", "ngram"])
    assert args.async_scheduling is False and args.speculative_config == ("ngram", 3)
    assert args.max_num_batched_tokens is None


def test_the_servers_defaults_and_vllms_spellings():
    """Paged with prefix caching unless asked otherwise (the two pools hand on contiguous caches);
    --max-num-seqs with --slots as its older name; --speculative-config as vLLM takes it; a latency
    target and the step timeline; every bad value one line naming the flag."""
    flags = serving_server._paged_flags
    assert flags(serving_server.parse_args([])) == dict(block_size=16, num_kv_blocks=None, kv_cache_memory=None,
                                                        prefix_caching=True)
    assert flags(serving_server.parse_args(["--no-enable-prefix-caching"]))["prefix_caching"] is False
    assert flags(serving_server.parse_args(["--kv-cache-layout", "contiguous"])) == dict(
        block_size=None, num_kv_blocks=None, kv_cache_memory=None, prefix_caching=False)
    assert flags(serving_server.parse_args(["--policy", "disaggregated"]))["block_size"] is None
    assert serving_server.parse_args(["--max-num-seqs", "16"]).slots == serving_server.parse_args(["--slots", "16"]).slots == 16
    spec = serving_server.parse_args(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 5}'])
    assert spec.speculative_config == ("ngram", 5)
    assert serving_server.parse_args(["--speculative-config", '{"method": "ngram"}']).speculative_config == ("ngram", 3)
    assert serving_server.parse_args([]).speculative_config is None
    slo = serving_server.parse_args(["--target-itl-ms", "25", "--step-timeline", "100"])
    assert slo.target_itl_ms == 25 and slo.step_timeline == 100
    for bad, words in (
            (["--speculative-config", "ngram"], "not JSON"),
            (["--speculative-config", '{"method": "eagle"}'], "method 'eagle'"),
            (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 99}'], "1..15"),
            (["--speculative-config", '{"method": "ngram", "model": "x"}'], "--speculative-config takes"),
            (["--speculative-config", '{"method": "ngram"}', "--speculative", "ngram"], "not both"),
            (["--num-speculative-tokens", "2"], "needs --speculative"),
            (["--target-itl-ms", "0"], "--target-itl-ms=0.0"),
            (["--target-itl-ms", "20", "--policy", "prefill-first"], "applies to --policy chunked"),
            (["--step-timeline", "-1"], "--step-timeline=-1"),
            (["--kv-cache-layout", "contiguous", "--block-size", "16"], "has no blocks: drop --block-size")):
        err = subprocess.run([sys.executable, "-m", "inference_lab", "serve", *bad], capture_output=True, text=True,
                             timeout=60)
        assert err.returncode == 2 and words in err.stderr and "Traceback" not in err.stderr, (bad, err.stderr)


# ----------------------------------------------------------------------------- stopping
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:   # a zombie is gone for our purposes
        return f.read().split()[2] != "Z"


def test_sigint_stops_the_server_cleanly(servers):
    s = servers["chunked"]
    assert s.stop() == 0
    assert "Traceback" not in "\n".join(s.log) and s.log[-1] == "inference-lab server stopped", s.log[-5:]


def test_the_two_pool_server_and_its_workers_die_with_their_kernel(servers):
    """Killing the kernel (as a restart does) takes the server (SIGTERM from the kernel at its
    parent's death) and so both worker processes with it."""
    s = servers["disaggregated"]
    pids = [s.pid] + httpx.get(s.url + "/health").json()["worker_pids"]
    assert all(_alive(p) for p in pids)
    s.stop()
    deadline = time.time() + 15
    while any(_alive(p) for p in pids):
        assert time.time() < deadline, f"outlived their kernel: {[p for p in pids if _alive(p)]}"
        time.sleep(0.1)


# ----------------------------------------------------------------------------- the claims, on counter-data
def _trace(gaps_ms, n=10, first_ms=50.0):
    reqs = Requests(np.zeros(n), np.full(n, 100), np.full(n, len(gaps_ms) + 1))
    times = [np.concatenate([[first_ms], first_ms + np.cumsum(gaps_ms)]) / 1e3 for _ in range(n)]
    return trace_from_token_times("t", reqs, times)


def test_chunking_claim_can_fail():
    steady = _trace([15.0] * 40)
    stalled = _trace([15.0] * 38 + [180.0, 180.0])
    assert lesson.chunking_bounds_the_stall(stalled, steady, predicted=6.0).holds is True
    assert lesson.chunking_bounds_the_stall(steady, steady, predicted=6.0).holds is False
    # noise as wide as the effect: undecided
    assert lesson.chunking_bounds_the_stall(stalled, _trace([15.0] * 36 + [60.0] * 4), predicted=6.0, u=2.0).holds is None


def test_two_pools_claim_can_fail():
    light, held, doubled = _trace([16.0] * 30), _trace([17.0] * 30), _trace([32.0] * 30)
    assert lesson.two_pools_hold_tpot(light, doubled, light, held).holds is True
    assert lesson.two_pools_hold_tpot(light, doubled, light, doubled).holds is False    # both degrade
    assert lesson.two_pools_hold_tpot(light, held, light, held).holds is False          # neither does


def test_step_costs_are_the_engine_steps_by_shape():
    """The lesson's cost model reads the engine's steps by shape: prompts in tokens, the smallest
    compiled count of chunk tokens that holds them (in proportion past the largest), decode rows at
    the smallest compiled width; the predicted stall is a decode step plus the longest prompt
    alone, against a chunked iteration with every slot decoding and the tokens beside them."""
    timed = {(1, 0): 0.005, (2, 0): 0.006, (4, 0): 0.007, (8, 0): 0.010, (0, 16): 0.011, (0, 64): 0.020,
             (0, 128): 0.035, (0, 256): 0.070, (8, 16): 0.013, (8, 48): 0.020, (8, 64): 0.024}
    costs = lesson.step_costs(timed)
    assert costs.decode == {1: 0.005, 2: 0.006, 4: 0.007, 8: 0.010} and costs.mixed == {16: 0.013, 48: 0.020, 64: 0.024}
    assert costs.step(3) == 0.007 and costs.tokens(costs.prefill, 65) == 0.035
    assert costs.tokens(costs.prefill, 512) == 0.140
    phases = costs.phases(kv_bytes_per_token=8192)
    assert phases.prefill_seconds([20, 30]) == 0.020          # 50 tokens: the 64-token step
    assert phases.iteration_seconds(8, 0, [(40, 0)]) == 0.020   # 40 tokens beside the decode rows: the 48-token step
    assert phases.iteration_seconds(5, 0) == 0.010              # decode rows alone: the 8-wide step
    heavy = Requests(np.zeros(2), np.array([100, 219]), np.array([30, 30]))
    # 219 tokens alone: the 256-token step; beside 8 rows, 64 - 8 = 56 tokens: the 64-token step
    assert lesson.predicted_stall(costs, heavy) == pytest.approx((0.010 + 0.070) / 0.024)
