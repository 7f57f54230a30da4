"""The serving engine's benchmark figures (docs/benchmarks.md, "The serving engine"), side by side
in one run on this machine:

1. ``sampling``: tokens/s of 1 stream, 8 greedy streams and 8 streams at the API's default sampling
   (temperature 1.0, a random top-k each), in-process, with the host/device overlap on and off
   (what it saves), and the XLA compiles seen after warm-up (the target: none);
2. ``budget``: the token-budget step against the engine before it (a git worktree of
   ``--baseline``, run in a child process on the same trace, interleaved with this one): the
   serving lesson's heavy trace as timed (arrival-bound) and all at once (engine-bound);
3. ``http``: 8 concurrent streams through the server with the official ``openai`` client against
   the same 8 streams given to the same engine in-process;
4. ``pools``: the KV cache between the two pools, bytes and seconds per request, ours against
   the baseline's pipe, on the heavy trace;
5. ``memory``: the paged KV cache (issue 34): its decode and mixed steps against the contiguous
   ones at the same batch and context; at one KV budget (two full contexts) on notebook 10's length
   mix, requests at once, throughput and TTFT of each layout; with an 80%-shared prompt, TTFT with
   and without prefix caching;
6. ``long``: prefill through the ragged step at 256, 2,048 and 3,840 prompt tokens on ``small``,
   per prompt token, against what attention's own FLOPs add at that length;
7. ``target``: notebook 09's latency target against two fixed budgets, once per repeat.

    .venv/bin/python scripts/serving_bench.py [--parts sampling,budget,http,pools,memory,long,target] [--repeats 3]

Prints medians over the repeats, the processor and the versions. No GPU needed; nothing is asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from inference_lab.analytic.workload import Requests
from inference_lab.base import hardware
from inference_lab.lessons import serving_engine as lesson
from inference_lab.serving.engine import Engine
from inference_lab.serving.load import drive_engine
from inference_lab.serving.models import load_model

BASELINE = "5d7ebfa"      # the engine before the token-budget step (issue 33): two programs an iteration
KEYS = ("output_tokens_per_s", "itl_p50_ms", "itl_p99_ms", "ttft_p50_ms", "tpot_p50_ms")

# The baseline's side, run with its own code: one engine (or the two pools), one trace per line read.
BASELINE_RUNNER = """
import dataclasses, json, sys
import numpy as np
from inference_lab.lessons import serving_engine as lesson
from inference_lab.serving.load import drive_engine
policy, preset = sys.argv[1], sys.argv[2]
if policy == "disaggregated":
    from inference_lab.serving.disaggregated import TwoPoolEngine
    engine = TwoPoolEngine(preset, n_slots=8).start()
else:
    from inference_lab.serving.models import load_model
    try:                       # the engine from issue 33 on
        from inference_lab.serving.engine import Engine
        engine = Engine(load_model(preset), policy=policy, n_slots=8, max_num_batched_tokens=int(sys.argv[3]))
    except ImportError:        # the engine before it
        from inference_lab.serving.scheduler import Engine
        engine = Engine(load_model(preset), policy=policy, n_slots=8, chunk_tokens=int(sys.argv[3]))
    engine.warmup()
    engine.start()
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    seed, burst = json.loads(line)
    trace = lesson.traces(seed)["heavy"]
    if burst:
        trace = dataclasses.replace(trace, arrival=np.zeros(len(trace)))
    row = drive_engine(engine, trace, label="baseline").summary()
    row["stats"] = {k: v for k, v in engine.stats().items() if isinstance(v, (int, float, str, type(None)))}
    print(json.dumps(row), flush=True)
engine.stop()
"""


def med(rows, key):
    return statistics.median(r[key] for r in rows)


def streams(n: int, tokens: int, prompt: int = 32) -> Requests:
    return Requests(np.zeros(n), np.full(n, prompt), np.full(n, tokens))


def default_sampling(n: int, rng) -> list[dict]:
    """The API's default: temperature 1.0, and here a random top-k for each request."""
    return [dict(temperature=1.0, top_k=int(rng.integers(1, 259)), seed=int(rng.integers(0, 2**62)))
            for _ in range(n)]


def random_settings(n: int, rng) -> list[dict]:
    """Every setting a request can carry, drawn at random (for the compile count only): temperature,
    top-k, top-p, min-p, a 64-bit seed, stop tokens, min_tokens, log-probabilities, and every other
    request sharing its neighbour's prompt (``after``: the choices of an ``n = 2`` request)."""
    return [dict(temperature=float(rng.choice([0.0, 0.6, 1.0, 1.5])), top_k=None if rng.random() < 0.3 else int(rng.integers(1, 259)),
                 top_p=float(rng.choice([1.0, 0.9, 0.3])), min_p=float(rng.choice([0.0, 0.05, 0.5])),
                 seed=int(rng.integers(0, 2**63)) * 2 + 1,
                 stop_token_ids=tuple(int(t) for t in rng.integers(32, 127, rng.integers(0, 4))),
                 min_tokens=int(rng.integers(0, 16)), logprobs=None if rng.random() < 0.5 else int(rng.integers(0, 21)),
                 **({"after": f"drive-{i - 1}"} if i % 2 else {}))
            for i in range(n)]


class Compiles:
    """Counts XLA backend compiles from now on."""

    def __init__(self):
        import jax

        self.n = 0
        jax.monitoring.register_event_duration_secs_listener(self._seen)

    def _seen(self, name, seconds, **kw):
        if name == "/jax/core/compile/backend_compile_duration":
            self.n += 1


def part_sampling(model, repeats, tokens):
    print(f"\n## 1. Sampling in the step, and the overlap ({tokens} tokens per stream, 32-token prompts)")
    counter = Compiles()
    rows, compiled = {}, {}
    rng = np.random.default_rng(0)
    engines = {overlap: Engine(model, policy="chunked", n_slots=8, async_scheduling=overlap) for overlap in (True, False)}
    for e in engines.values():
        e.warmup()
        e.start()
    before = counter.n
    for _ in range(repeats):
        for overlap, e in engines.items():
            for name, n, sampling in (("1 stream", 1, None), ("8 greedy", 8, None),
                                      ("8 default-sampled", 8, default_sampling(8, rng))):
                rows.setdefault((overlap, name), []).append(drive_engine(e, streams(n, tokens), sampling=sampling).summary())
            drive_engine(e, streams(8, tokens), sampling=random_settings(8, rng))   # counted for compiles only
    compiled["after warm-up"] = counter.n - before
    for e in engines.values():
        e.stop()
    print("| overlap | streams | tok/s | ITL p50 ms | ITL p99 ms |\n|---|---|---|---|---|")
    for (overlap, name), r in rows.items():
        print(f"| {'async' if overlap else 'sync'} | {name} | {med(r, 'output_tokens_per_s'):.0f} | "
              f"{med(r, 'itl_p50_ms'):.2f} | {med(r, 'itl_p99_ms'):.2f} |")
    for overlap in (True, False):
        tag = "async" if overlap else "sync"
        s, g, one = (med(rows[(overlap, k)], "output_tokens_per_s") for k in ("8 default-sampled", "8 greedy", "1 stream"))
        print(f"{tag}: 8 default-sampled / 8 greedy x{s / g:.2f} (target >= 0.9); / 1 stream x{s / one:.2f} (target >= 4)")
    for name in ("1 stream", "8 greedy", "8 default-sampled"):
        a, b = med(rows[(True, name)], "output_tokens_per_s"), med(rows[(False, name)], "output_tokens_per_s")
        print(f"the overlap, {name}: x{a / b:.2f} tok/s (ITL p50 {med(rows[(False, name)], 'itl_p50_ms'):.2f} -> "
              f"{med(rows[(True, name)], 'itl_p50_ms'):.2f} ms)")
    print(f"XLA compiles after warm-up, over {8 * repeats} runs of random settings (every request setting, prompts "
          f"shared as n = 2 shares them, included): {compiled['after warm-up']} (target 0)")


class Baseline:
    """The engine at ``rev``, in a child process over a git worktree of it."""

    def __init__(self, rev: str, policy: str, preset: str, budget: int = 64):
        self.folder = tempfile.mkdtemp(prefix="inference-lab-baseline-")
        subprocess.run(["git", "worktree", "add", "--detach", self.folder, rev], check=True, capture_output=True)
        self.process = subprocess.Popen([sys.executable, "-c", BASELINE_RUNNER, policy, preset, str(budget)],
                                        cwd=self.folder,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env={**os.environ, "PYTHONPATH": self.folder})
        assert json.loads(self.process.stdout.readline())["ready"]

    def run(self, seed: int, burst: bool) -> dict:
        self.process.stdin.write(json.dumps([seed, burst]) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self):
        self.process.stdin.close()
        self.process.wait(60)
        subprocess.run(["git", "worktree", "remove", "--force", self.folder], capture_output=True)


def heavy(seed: int, burst: bool) -> Requests:
    trace = lesson.traces(seed)["heavy"]
    return dataclasses.replace(trace, arrival=np.zeros(len(trace))) if burst else trace


def part_budget(model, repeats, rev, preset):
    print(f"\n## 2. The token-budget step against the engine at {rev} (chunked, 8 slots), the lesson's heavy trace")
    old = Baseline(rev, "chunked", preset)
    new = {b: Engine(model, policy="chunked", n_slots=8, max_num_batched_tokens=b) for b in (64, 128)}
    for e in new.values():
        e.warmup()
        e.start()
    rows = {}
    try:
        for rep in range(repeats):
            for burst in (False, True):
                rows.setdefault((burst, f"{rev}, budget 64"), []).append(old.run(rep, burst))
                for b, e in new.items():
                    rows.setdefault((burst, f"this engine, budget {b}"), []).append(drive_engine(e, heavy(rep, burst)).summary())
    finally:
        old.close()
        for e in new.values():
            e.stop()
    print("| arrivals | engine | tok/s | ITL p50 | ITL p99 | TTFT p50 | TPOT p50 |\n|---|---|---|---|---|---|---|")
    for (burst, name), r in rows.items():
        print(f"| {'all at once' if burst else 'as timed'} | {name} | " + " | ".join(f"{med(r, k):.1f}" for k in KEYS) + " |")
    for burst in (False, True):
        base = rows[(burst, f"{rev}, budget 64")]
        for b in (64, 128):
            r = rows[(burst, f"this engine, budget {b}")]
            print(f"{'all at once' if burst else 'as timed'}, budget {b}: throughput x"
                  f"{med(r, 'output_tokens_per_s') / med(base, 'output_tokens_per_s'):.2f}, ITL p99 x"
                  f"{med(r, 'itl_p99_ms') / med(base, 'itl_p99_ms'):.2f} of the baseline's (target: >= 1.2x at the same ITL p99)")


def openai_streams(base_url: str, n: int, tokens: int, model_name: str) -> dict:
    """``n`` concurrent streamed completions through the official client: output tokens/s from the
    first request sent to the last token received."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
    prompt = lesson_prompt(32)
    counts, last = [0] * n, [0.0] * n

    def one(i):
        for chunk in client.completions.create(model=model_name, prompt=prompt, max_tokens=tokens, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True}):
            if chunk.choices:
                counts[i] += 1
                last[i] = time.perf_counter()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"output_tokens_per_s": sum(counts) / (max(last) - t0), "tokens": sum(counts)}


def curl_streams(base_url: str, n: int, tokens: int, model_name: str) -> dict:
    """The same ``n`` streams with curl, one process each, its output thrown away: a client that
    costs next to nothing, so what remains is the server's own cost."""
    body = json.dumps({"model": model_name, "prompt": lesson_prompt(32), "max_tokens": tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True})
    cmd = ["curl", "-sN", "-o", "/dev/null", "-H", "Content-Type: application/json", "-d", body,
           base_url + "/completions"]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd) for _ in range(n)]
    for p in procs:
        p.wait()
    return {"output_tokens_per_s": n * tokens / (time.perf_counter() - t0)}


def lesson_prompt(n_tokens: int) -> str:
    from inference_lab.serving.load import prompt_texts
    return prompt_texts([n_tokens])[0]


def cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds used so far by process ``pid`` (None: this one and its finished children)."""
    if pid is None:
        import resource

        return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                   for f in ("ru_utime", "ru_stime"))
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def part_http(model, repeats, tokens, preset):
    from inference_lab.serving.server import ServerProcess

    print(f"\n## 3. Through HTTP, 8 streams of {tokens} tokens: the official openai client, curl, in-process")
    engine = Engine(model, policy="chunked", n_slots=8)
    engine.warmup()
    engine.start()
    rows = {}
    # the server's cache laid out as the in-process engine's (contiguous slots): what differs is HTTP alone
    with ServerProcess("--max-num-seqs", "8", "--kv-cache-layout", "contiguous", policy="chunked", preset=preset) as server:
        openai_streams(server.base_url, 8, tokens, preset)        # one run first: the client's connections
        runs = {"http, openai client": lambda: openai_streams(server.base_url, 8, tokens, preset),
                "http, curl": lambda: curl_streams(server.base_url, 8, tokens, preset),
                "in-process": lambda: drive_engine(engine, streams(8, tokens)).summary()}
        for _ in range(repeats):                                   # interleaved: drift hits all alike
            for name, run in runs.items():
                server0, here0 = cpu_seconds(server.process.pid), cpu_seconds()
                row = run()
                row["server_cpu_s"] = cpu_seconds(server.process.pid) - server0
                row["client_cpu_s"] = cpu_seconds() - here0      # in-process: the engine's own
                rows.setdefault(name, []).append(row)
    engine.stop()
    p = med(rows["in-process"], "output_tokens_per_s")
    print("| 8 streams | tok/s | x in-process | server CPU s | client CPU s |\n|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {med(r, 'output_tokens_per_s'):.0f} | {med(r, 'output_tokens_per_s') / p:.2f} | "
              f"{med(r, 'server_cpu_s'):.2f} | {med(r, 'client_cpu_s'):.2f} |")
    for name in ("http, openai client", "http, curl"):
        print(f"{name}: the server costs {100 * (1 - med(rows[name], 'output_tokens_per_s') / p):.1f}% of the "
              "in-process tokens/s (target <= 10%); run by run: " + ", ".join(
                  f"{100 * (1 - a['output_tokens_per_s'] / b['output_tokens_per_s']):+.1f}%"
                  for a, b in zip(rows[name], rows["in-process"])))


def part_pools(repeats, rev, preset):
    from inference_lab.serving.disaggregated import TwoPoolEngine

    print("\n## 4. The KV cache between the two pools (the heavy trace, as timed)")
    old = Baseline(rev, "disaggregated", preset)
    new = TwoPoolEngine(preset, n_slots=8).start()
    rows = {}
    try:
        for rep in range(repeats):
            rows.setdefault(rev, []).append(old.run(rep, False))
            row = drive_engine(new, heavy(rep, False)).summary()
            row["stats"] = new.stats()
            rows.setdefault("this engine", []).append(row)
    finally:
        old.close()
        new.stop()
    print("| two pools | KV bytes per request | seconds per transfer (median) | TTFT p50 ms | TPOT p50 ms |\n"
          "|---|---|---|---|---|")
    for name, r in rows.items():
        s = r[-1]["stats"]
        print(f"| {name} | {s['kv_bytes_mean'] / 1e6:.2f} MB | {1e3 * med([x['stats'] for x in r], 'kv_seconds_median'):.2f} ms | "
              f"{med(r, 'ttft_p50_ms'):.0f} | {med(r, 'tpot_p50_ms'):.1f} |")


def part_memory(model, repeats):
    from inference_lab.lessons import paged_kv_cache as lesson

    print("\n## 5. The paged KV cache")
    # (a) the step at equal batch and context: contiguous slots against a pool holding every slot's
    # whole context in blocks of its own (the default pool), each step read through its table
    contiguous = Engine(model, n_slots=8, max_num_batched_tokens=64)
    paged = Engine(model, n_slots=8, max_num_batched_tokens=64, block_size=16)
    shapes = [(1, 0), (8, 0), (8, 3)]
    for e in (contiguous, paged):
        e.warmup()
    steps = {name: [] for name in ("contiguous", "paged")}
    for _ in range(repeats):
        for name, e in (("contiguous", contiguous), ("paged", paged)):
            steps[name].append(e.slots.time_shapes(shapes, context=200, repeats=7))
    print("| step (decode rows, pieces), context 200 | contiguous ms | paged ms | paged / contiguous |\n|---|---|---|---|")
    for shape in shapes:
        c = statistics.median(t[shape] for t in steps["contiguous"])
        p = statistics.median(t[shape] for t in steps["paged"])
        print(f"| {shape} | {1e3 * c:.2f} | {1e3 * p:.2f} | x{p / c:.3f} |")
    # (b) one budget, two layouts; (c) the shared prompt
    budget = lesson.budget_bytes(model.cfg)
    requests = lesson.length_mix()
    engines, timed = lesson.start_engines(model, budget)
    runs = lesson.run_layouts(engines, requests, repeats=repeats)
    print(f"\n{lesson.block_arithmetic(model.cfg, requests, budget)}")
    print("| budget of 2 contexts | at once | output tok/s | TTFT p50 ms | preemptions |\n|---|---|---|---|---|")
    for name, rs in runs.items():
        print(f"| {name} | {statistics.median(r.at_once for r in rs):.2f} | "
              f"{statistics.median(r.throughput for r in rs):.0f} | {statistics.median(r.ttft_ms() for r in rs):.0f} | "
              f"{statistics.median(r.preemptions for r in rs):.0f} |")
    c, p = lesson.median_run(runs["contiguous"]), lesson.median_run(runs["paged"])
    print(f"paged / contiguous: x{p.at_once / c.at_once:.2f} at once (target >= 2), x{p.throughput / c.throughput:.2f} "
          f"throughput (target >= 1.5); run by run: " + ", ".join(
              f"x{b.throughput / a.throughput:.2f}" for a, b in zip(runs["contiguous"], runs["paged"])))
    shared, prompts = lesson.shared_prompt_workload()
    cold, warm = [], []
    for _ in range(repeats):
        cold.append(lesson.run(engines["paged, no prefix cache"], "no prefix cache", shared, prompts))
        warm.append(lesson.run(engines["paged"], "prefix cache", shared, prompts))
    a = statistics.median(r.ttft_ms() for r in cold)
    b = statistics.median(r.ttft_ms() for r in warm)
    print(f"80%-shared prompts ({lesson.SHARED} of {lesson.SHARED + lesson.OWN} tokens), TTFT p50: without prefix caching "
          f"{a:.1f} ms, with it {b:.1f} ms: x{a / b:.2f} (target >= 3); hits "
          + ", ".join(f"{r.prefix_hits} of {r.prefix_queries}" for r in warm))
    for e in engines.values():
        e.stop()


LONG_PROMPTS = (256, 2048, 3840)    # prompt tokens: the short reference and two long ones


def part_long(repeats):
    """Prefill through the engine's ragged step at 256 and 2,048+ prompt tokens on ``small``."""
    from flax import nnx

    from inference_lab.base.config import ModelConfig
    from inference_lab.model.transformer import Transformer

    cfg = ModelConfig.preset("small", max_seq_len=4096)   # random weights; a context the long prompts fit
    print(f"\n## 6. Long prompts: `small` with a {cfg.max_seq_len}-position context, paged (blocks of 16), "
          "budget 512, one request at a time, a 1-token answer")
    engine = Engine(Transformer(cfg, rngs=nnx.Rngs(0)), n_slots=2, max_num_batched_tokens=512, block_size=16)
    engine.warmup()
    engine.start()
    ttft = {n: [] for n in LONG_PROMPTS}
    for _ in range(repeats):
        for n in LONG_PROMPTS:
            trace = drive_engine(engine, Requests(np.zeros(1), np.array([n]), np.array([1])))
            ttft[n].append(float(trace.ttft[0]))
    engine.stop()
    # what a prompt token costs in FLOPs at position p: the layers' matmuls (the head runs only where a
    # token is sampled) and attention over the p tokens before it (q.k and p.v: 4 x heads x head_dim x p)
    matmul = 2 * (cfg.matmul_params - cfg.head_params)

    def flops_per_token(n):
        return matmul + 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * (n - 1) / 2

    attention = {n: attention_seconds(cfg, n, budget=512) / n for n in LONG_PROMPTS}
    base = statistics.median(ttft[LONG_PROMPTS[0]]) / LONG_PROMPTS[0]
    print("| prompt tokens | TTFT ms | ms per prompt token | x 256's | attention's FLOPs allow | "
          "attention's measured time allows | repeats' spread |\n|---|---|---|---|---|---|---|")
    for n in LONG_PROMPTS:
        per = statistics.median(ttft[n]) / n
        by_flops = flops_per_token(n) / flops_per_token(LONG_PROMPTS[0])
        by_time = (base - attention[LONG_PROMPTS[0]] + attention[n]) / base
        print(f"| {n} | {1e3 * statistics.median(ttft[n]):.0f} | {1e3 * per:.3f} | x{per / base:.2f} | x{by_flops:.2f} | "
              f"x{by_time:.2f} | x{max(ttft[n]) / min(ttft[n]):.2f} |")
    print("attention's measured time: the step's attention alone (the same function, shapes and query blocks, jitted "
          "by itself), its prompt's chunks summed over the layers, per prompt token: " + ", ".join(
              f"{n}: {1e3 * a:.3f} ms" for n, a in attention.items()))


def attention_seconds(cfg, n: int, *, budget: int, repeats: int = 5) -> float:
    """What the engine's attention alone takes to prefill an ``n``-token prompt in chunks of
    ``budget`` tokens, over all layers: each chunk's ragged paged attention (this backend's, with
    the step's query blocks of 16) at its place in the context, timed by itself (median)."""
    import jax
    import jax.numpy as jnp

    import pallas_kernels as pk

    block, pages = 16, cfg.max_seq_len // 16
    rng = np.random.default_rng(0)
    k = jnp.asarray(rng.standard_normal((pages + 1, block, cfg.n_kv_heads, cfg.head_dim)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((pages + 1, block, cfg.n_kv_heads, cfg.head_dim)), jnp.float32)
    table = jnp.arange(1, pages + 1, dtype=jnp.int32)[None]
    total = 0.0
    for first in range(0, n, budget):
        t = min(budget, n - first)
        q = jnp.asarray(rng.standard_normal((t, cfg.n_heads, cfg.head_dim)), jnp.float32)
        run = jax.jit(lambda *a, t=t: pk.ragged_paged_attention(*a, max_query_len=t, query_unit=16))
        args = (q, k, v, table, jnp.array([0, t], jnp.int32), jnp.array([first + t], jnp.int32))
        run(*args).block_until_ready()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run(*args).block_until_ready()
            times.append(time.perf_counter() - t0)
        total += statistics.median(times)
    return cfg.n_layers * total


def part_target(model, repeats):
    """Notebook 09's section 5, ``repeats`` times: two fixed budgets and a latency target between them."""
    from inference_lab.lessons import step_timeline as timeline

    print(f"\n## 7. A latency target against fixed budgets {timeline.FIXED_BUDGETS} (notebook 09, section 5): "
          "a queue of 48 heavy-trace prompts")
    queue = timeline.queue_trace()
    for rep in range(repeats):
        fixed = timeline.engines(model)
        runs = timeline.run(fixed, queue)
        for e in fixed.values():
            e.stop()
        target_ms = timeline.target_between(runs)
        held = timeline.engines(model, budgets=(), target_ms=target_ms)
        runs |= timeline.run(held, queue)
        for e in held.values():
            e.stop()
        name = timeline.target_name(target_ms)
        print(f"\nrun {rep + 1}\n{timeline.table(runs, target_ms)}")
        print(timeline.target_holds(runs[name][0], target_ms))
        print(timeline.fixed_budgets_miss_or_waste(runs, name, target_ms))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="shakespeare_large")
    p.add_argument("--parts", default="sampling,budget,http,pools,memory,long,target")
    p.add_argument("--tokens", type=int, default=128, help="output tokens per stream in parts 1 and 3")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--baseline", default=BASELINE, help="the git revision to compare against (parts 2 and 4)")
    args = p.parse_args()
    import jax
    import flax

    print(f"{time.strftime('%Y-%m-%d')}, {hardware.processor_summary()}; Python {sys.version.split()[0]}, "
          f"jax {jax.__version__}, flax {flax.__version__}; {args.preset}, medians of {args.repeats}")
    parts = args.parts.split(",")
    model = load_model(args.preset) if {"sampling", "budget", "http", "memory", "target"} & set(parts) else None
    if "sampling" in parts:
        part_sampling(model, args.repeats, args.tokens)
    if "budget" in parts:
        part_budget(model, args.repeats, args.baseline, args.preset)
    if "http" in parts:
        part_http(model, args.repeats, args.tokens, args.preset)
    if "pools" in parts:
        part_pools(args.repeats, args.baseline, args.preset)
    if "memory" in parts:
        part_memory(model, args.repeats)
    if "long" in parts:
        part_long(args.repeats)
    if "target" in parts:
        part_target(model, args.repeats)


if __name__ == "__main__":
    main()
