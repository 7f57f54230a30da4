"""Nothing stuck, nothing lost: what happens to requests when the serving engine is flooded,
stopped, timed out, sent garbage or loses a worker.

Two servers (the trained `shakespeare` model, two slots, room for 18 more requests): one pool
(chunked, with a short request timeout) and two pools. Each is flooded past its bound (the
two-pool server counts every request in both pools), must give its memory back, and is then
stopped with 20 requests in flight: every request ends, with tokens or an error, none later than
10 s. A two-pool engine in this process is sent a bad request behind its front's back, has
requests cancelled while they are being prefilled, and loses its decode worker mid-stream.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import threading
import time

import httpx
import pytest

from inference_lab.base import tokenizer
from inference_lab.serving import server as serving_server
from inference_lab.serving.disaggregated import TwoPoolEngine, _Held
from inference_lab.serving.requests import Request, TokenEvent
from serving_helpers import PRESET, Listener

SLOTS, QUEUE = 2, 18
HELD = SLOTS + QUEUE


@pytest.fixture(scope="module")
def servers():
    started = {}
    try:
        # the budget of tests/test_engine_loop.py's engines: the same compiled programs, from the cache
        started["chunked"] = serving_server.ServerProcess("--slots", str(SLOTS), "--max-queue", str(QUEUE),
                                                          "--max-num-batched-tokens", "32", "--request-timeout",
                                                          "0.1", policy="chunked", preset=PRESET)
        started["disaggregated"] = serving_server.ServerProcess("--slots", str(SLOTS), "--max-queue", str(QUEUE),
                                                                policy="disaggregated", preset=PRESET)
        yield started
    finally:
        for s in started.values():
            s.stop()


def _rss_mib(pids) -> float:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return total / 1024


def _pids(server):
    health = httpx.get(server.url + "/health", timeout=10).json()
    return [server.process.pid] + health.get("worker_pids", [])


def _stream(url, max_tokens, *, started=None):
    """One streamed request: (HTTP status, tokens, the error text or '') and when it ended; status
    0 when the connection failed or was cut. A 429 must say when to retry, as OpenAI's does."""
    body = {"model": PRESET, "prompt": "ROMEO:\n", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    tokens, error, status = 0, "", 200
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            if r.status_code != 200:
                r.read()
                error = r.json()["error"]
                if r.status_code == 429:
                    assert r.headers["retry-after"] == "1" and error["type"] == "rate_limit_error", error
                return r.status_code, 0, error["message"], time.perf_counter()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                message = json.loads(line[6:])
                if "error" in message:
                    error = message["error"]["message"]
                    break
                if started is not None and not tokens:
                    started.release()
                tokens += 1
    except httpx.HTTPError as e:   # a connection cut is an end too: the client is not left waiting
        status, error = 0, f"{type(e).__name__}: {e}"
    return status, tokens, error, time.perf_counter()


@pytest.mark.parametrize("policy", ["chunked", "disaggregated"])
def test_a_flood_gets_429_beyond_the_bound_and_the_memory_back(servers, policy):
    url = servers[policy].url
    with concurrent.futures.ThreadPoolExecutor(8) as pool:      # the allocator's steady state first
        list(pool.map(lambda _: _stream(url, 40), range(8)))
    idle = _rss_mib(_pids(servers[policy]))
    with concurrent.futures.ThreadPoolExecutor(2 * HELD) as pool:
        results = list(pool.map(lambda _: _stream(url, 60), range(2 * HELD)))
    codes = [r[0] for r in results]
    assert codes.count(200) >= HELD and 429 in codes, codes
    assert all(r[1] == 60 and not r[2] for r in results if r[0] == 200), "an accepted request did not finish"
    assert httpx.get(url + "/health").json()["held"] == 0
    after = _rss_mib(_pids(servers[policy]))
    assert after <= idle * 1.1 + 20, f"RSS {idle:.0f} MiB idle -> {after:.0f} MiB after the flood"


def test_a_non_streamed_request_past_the_timeout_gets_504(servers):
    url = servers["chunked"].url
    r = httpx.post(url + "/v1/completions", timeout=30,
                   json={"model": PRESET, "prompt": "ROMEO:\n", "max_tokens": 240, "ignore_eos": True})
    assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout", r.text
    deadline = time.time() + 10
    while httpx.get(url + "/health").json()["held"]:          # cancelled, not left running
        assert time.time() < deadline
        time.sleep(0.05)
    quick = httpx.post(url + "/v1/completions", json={"model": PRESET, "prompt": "A", "max_tokens": 3}, timeout=30)
    assert quick.status_code == 200


@pytest.mark.parametrize("policy", ["chunked", "disaggregated"])
def test_stopping_the_server_ends_every_request_in_flight(servers, policy):
    server = servers[policy]
    started = threading.Semaphore(0)
    with concurrent.futures.ThreadPoolExecutor(HELD) as pool:
        futures = [pool.submit(_stream, server.url, 240, started=started) for _ in range(HELD)]
        assert started.acquire(timeout=60)
        t0 = time.perf_counter()
        server.process.send_signal(signal.SIGINT)
        results = [f.result(timeout=30) for f in futures]
    assert server.process.wait(30) == 0
    # those that reached the server as it stopped are refused (503) or cut off: they end too
    assert {r[0] for r in results} <= {200, 503, 0} and sum(r[0] == 200 for r in results) >= 1
    assert all(r[1] == 240 or r[2] for r in results), "a request ended short without saying why"
    assert max(r[3] for r in results) - t0 < 10
    assert any("stopping" in r[2] for r in results), [r[2] for r in results]


# ----------------------------------------------------------------------------- a two-pool engine in this process
@pytest.fixture(scope="module")
def pools():
    two = TwoPoolEngine(PRESET, n_slots=SLOTS, max_queue=QUEUE).start()
    yield two
    two.stop()
    # the prefill worker (its decode partner was killed by the last test) still exits cleanly: it
    # aborted at exit when a helper thread, not its main thread, freed the engine's arrays
    assert two._procs[0].exitcode == 0


def test_the_front_puts_tokens_in_order():
    """Token 0 (the prefill worker's) may arrive after token 1 (the decode worker's): the front
    holds 1 back until 0 is out; an end comes after every token before it."""
    two = TwoPoolEngine(PRESET)                     # not started: the front's bookkeeping alone
    got = []
    two._held["r"] = _Held(got.append)
    for index, finish in ((2, None), (1, None), (4, "length"), (0, None), (3, None)):
        two._arrived(TokenEvent("r", 10 + index, index, 0.0, finish))
    assert [e.index for e in got] == [0, 1, 2, 3, 4] and got[-1].finish == "length" and "r" not in two._held


def test_a_bad_request_sent_straight_to_a_worker_is_refused_not_fatal(pools):
    listen = Listener()
    with pools._lock:
        pools._held["bad"] = _Held(listen)
    pools._outbox.put((pools._to_prefill, ("submit", Request("bad", [9999], 4))))   # behind the front's check
    listen.wait(1)
    bad = listen.events["bad"][-1]
    assert bad.finish == "error" and "vocabulary" in bad.error
    pools.submit(Request("good", tokenizer.encode("ROMEO:\n"), 8), listen)
    listen.wait(1)
    assert [e.index for e in listen.events["good"]] == list(range(8)) and pools.stats()["error"] is None


def test_cancels_while_prefilling_end_once_and_free_everything(pools):
    """Cancels sent at moments around each request's prefill (before it, during it, around the
    hand-off): each request ends exactly once, and then the pools hold nothing and every
    shared-memory buffer is free again."""
    listen = Listener()
    long = tokenizer.encode("First Citizen:\n" + "Before we proceed any further, hear me speak. " * 4)
    for i, delay in enumerate((0.0, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08)):
        pools.submit(Request(f"c{i}", long, 30, stop_at_eos=False), listen)
        time.sleep(delay)
        pools.cancel(f"c{i}")
    listen.wait(7)
    ends = [ev[-1].finish for ev in listen.events.values()]
    assert all(sum(e.finish is not None for e in ev) == 1 for ev in listen.events.values())
    assert "abort" in ends and set(ends) <= {"abort", "length"}
    deadline = time.time() + 10
    while pools.stats()["held"] or pools.stats()["kv_buffers_free"] != pools.n_buffers:
        assert time.time() < deadline, pools.stats()
        time.sleep(0.05)


def test_a_dead_decode_worker_ends_every_request_at_once(pools):
    """Last in this file: it kills the fixture's decode worker."""
    listen = Listener()
    for i in range(3):
        pools.submit(Request(f"k{i}", tokenizer.encode("ROMEO:\n"), 250, stop_at_eos=False), listen)
    deadline = time.time() + 60
    while not all(len(listen.events.get(f"k{i}", [])) > 2 for i in range(2)):
        assert time.time() < deadline
        time.sleep(0.01)
    t0 = time.perf_counter()
    os.kill(pools.pids()[1], signal.SIGKILL)
    listen.wait(3, timeout=10)
    assert time.perf_counter() - t0 < 10
    assert {listen.events[f"k{i}"][-1].finish for i in range(3)} == {"error"}
    assert "exited" in pools.stats()["error"]
    with pytest.raises(RuntimeError, match="exited"):
        pools.submit(Request("after", [tokenizer.BOS], 3), listen)
