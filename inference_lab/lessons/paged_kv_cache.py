"""Notebook 10, "Memory is the batch": what the paged KV cache, prefix caching and preemption do
to a real engine, predicted from block arithmetic and the simulator, then measured.

Three experiments on the lab's engine (:mod:`inference_lab.serving`), each with a prediction made
first and a verdict that can fail:

1. **One KV memory budget, two layouts.** The memory of :data:`CONTEXTS` full contexts: the
   contiguous engine gets that many slots (each reserves the whole context); the paged one gets
   the same bytes as blocks, and as many requests run as their real lengths fit. The same
   length mix (:func:`length_mix`) on both: requests decoding at once, throughput, TTFT.
2. **A shared system prompt.** Every prompt starts with the same text (80% of its tokens): with
   prefix caching its blocks are prefilled once, so each later request prefills only its own
   part. TTFT with and without, predicted from the hit rate.
3. **A pool too small for the load.** A server whose pool holds one full context, given
   requests that outgrow it: preemption in ``/metrics``, and every request still finishes with
   the text it would have had alone.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from inference_lab.analytic import costs
from inference_lab.analytic.serving_metrics import ServingTrace
from inference_lab.analytic.simulator import KVMemory, simulate_requests
from inference_lab.analytic.workload import Requests, sample_requests
from inference_lab.base.progress import bar as progress_bar
from inference_lab.lessons.claims import Verdict, decide, log_midpoint
from inference_lab.lessons.serving_engine import StepCosts, step_costs
from inference_lab.serving.blocks import WATERMARK
from inference_lab.serving.load import drive_engine, prompt_texts

PRESET = "shakespeare_large"
CONTEXTS = 2              # the budget: the KV memory of this many full contexts
BLOCK = 16                # tokens per block (vLLM's default)
PAGED_SLOTS = 8           # the paged engine's decode rows (a slot no longer costs memory)
BUDGET_TOKENS = 64        # max_num_batched_tokens of every engine here (chunked prefill)
N_REQUESTS = 40
SHARED, OWN = 160, 40     # the shared-prompt workload: system prompt and each user's own tokens
SMALL_POOL = 17           # the preemption server's blocks: one full context and the null block
BACK_TO_BACK = 4          # steps timed one behind the other, as the engine runs them under load
FIRST_ALONE_S = 0.3       # the shared-prompt workload's first request arrives this far ahead


def budget_bytes(cfg, contexts: int = CONTEXTS) -> int:
    """The KV memory of ``contexts`` full contexts of ``cfg``."""
    return int(contexts * cfg.max_seq_len * costs.kv_bytes_per_token(cfg))


def length_mix(seed: int = 0) -> Requests:
    """The experiment's workload: :data:`N_REQUESTS` requests arriving at once (the engine is the
    bottleneck), prompts of 8-48 tokens and answers of 32-96: chat-like turns, far shorter than
    the 256-token context a contiguous slot reserves for each."""
    return sample_requests(N_REQUESTS, 1000.0, prompt_len=(8, 48), output_len=(32, 96), seed=seed)


# ----------------------------------------------------------------------------- block arithmetic
@dataclasses.dataclass(frozen=True)
class Arithmetic:
    """What the budget holds, before anything runs."""

    budget: int                   # bytes
    block_bytes: int
    contiguous_slots: int         # requests the contiguous engine runs at once
    blocks: int                   # the paged pool's blocks (the null block included)
    mean_blocks: float            # blocks a request holds, averaged over its life
    predicted_paged: float        # requests the paged engine runs at once (blocks / mean, capped by the slots)
    contiguous_waste: float       # share of the contiguous cache reserved but never written

    def __str__(self) -> str:
        return (f"budget {self.budget / 2**20:.1f} MiB = {self.contiguous_slots} contiguous slots of the full context, "
                f"or {self.blocks} blocks of {BLOCK} tokens ({self.block_bytes / 2**10:.0f} KiB each); a request "
                f"holds {self.mean_blocks:.1f} blocks on average over its life, so about {self.predicted_paged:.1f} "
                f"run at once paged; contiguous slots leave {self.contiguous_waste:.0%} of their memory unwritten")


def block_arithmetic(cfg, requests: Requests, budget: int) -> Arithmetic:
    """Slots and blocks in ``budget`` bytes, and how many of ``requests`` each layout runs at once:
    a request holds ``ceil((prompt + t) / block)`` blocks after its ``t``-th token, so over its
    life the mean of that for t = 1 .. output; the pool, less the watermark, over that mean."""
    per_token = costs.kv_bytes_per_token(cfg)
    block_bytes = int(BLOCK * per_token)
    slots = int(budget // (cfg.max_seq_len * per_token))
    blocks = int(budget // block_bytes)
    held = [np.mean(np.ceil((p + np.arange(1, o + 1)) / BLOCK)) for p, o in zip(requests.prompt_len, requests.output_len)]
    mean_blocks = float(np.mean(held))
    usable = (blocks - 1) * (1 - WATERMARK)
    tokens = np.mean([p + (o + 1) / 2 for p, o in zip(requests.prompt_len, requests.output_len)])
    return Arithmetic(budget, block_bytes, slots, blocks, mean_blocks, min(PAGED_SLOTS, usable / mean_blocks),
                      float(1 - tokens / cfg.max_seq_len))


# ----------------------------------------------------------------------------- the engines
def start_engines(model, budget: int) -> tuple[dict, StepCosts]:
    """The engines of the experiments, warmed up, and their step costs timed before they serve (back to
    back, as a loaded engine runs them: the throughput these experiments compare is a loaded one's):
    ``contiguous`` (the budget as slots), ``paged`` (the budget as blocks, prefix caching on, as
    vLLM v1 runs), ``paged, no prefix cache`` (the same, for experiment 2)."""
    from inference_lab.serving.engine import Engine

    arithmetic_slots = int(budget // (model.cfg.max_seq_len * costs.kv_bytes_per_token(model.cfg)))
    engines = {
        "contiguous": Engine(model, n_slots=arithmetic_slots, max_num_batched_tokens=BUDGET_TOKENS),
        "paged": Engine(model, n_slots=PAGED_SLOTS, max_num_batched_tokens=BUDGET_TOKENS, block_size=BLOCK,
                        kv_cache_memory=budget, enable_prefix_caching=True),
        "paged, no prefix cache": Engine(model, n_slots=PAGED_SLOTS, max_num_batched_tokens=BUDGET_TOKENS,
                                         block_size=BLOCK, kv_cache_memory=budget),
    }
    with progress_bar(total=len(engines) + 1, desc="starting the engines", unit="step", transient=True) as bar:
        for name, e in engines.items():
            bar.set_postfix_str(f"compiling {name}", refresh=False)
            e.warmup()
            bar.update()
        timed = {}
        for name in ("contiguous", "paged"):
            e = engines[name]
            shapes = e.scheduler.shapes()
            timed[name] = step_costs(e.slots.time_shapes(shapes, context=64, back_to_back=BACK_TO_BACK),
                                     n_slots=e.n_slots)
        bar.update()
    for e in engines.values():
        e.start()
    return engines, timed


@dataclasses.dataclass
class MemoryRun:
    """One engine's run of a workload: its trace and what its cache did meanwhile."""

    name: str
    trace: ServingTrace
    preemptions: int
    preempted_tokens: int         # cache positions the preemptions threw away
    prefix_hits: int
    prefix_queries: int

    @property
    def throughput(self) -> float:
        return self.trace.output_tokens_per_s

    @property
    def at_once(self) -> float:
        return self.trace.decoding_at_once()

    def ttft_ms(self, q: int = 50) -> float:
        return 1e3 * self.trace.percentiles()["ttft"][q]


def run(engine, name: str, requests: Requests, prompts=None) -> MemoryRun:
    """``requests`` through ``engine`` in-process; the counts are this run's alone."""
    def kv():
        s = engine.stats()
        c = s["kv_cache"]
        return s["preemptions"], s["preempted_tokens"], c.get("prefix_cache_hits", 0), c.get("prefix_cache_queries", 0)

    before = kv()
    trace = drive_engine(engine, requests, label=name, prompts=prompts)
    after = kv()
    return MemoryRun(name, trace, *(b - a for a, b in zip(before, after)))


def run_layouts(engines: dict, requests: Requests, repeats: int = 3) -> dict:
    """``{name: [MemoryRun, ...]}``: the contiguous and the paged engine on ``requests``, interleaved."""
    runs = {"contiguous": [], "paged": []}
    with progress_bar(total=repeats * 2, desc="serving the length mix", unit="run", transient=True) as bar:
        for _ in range(repeats):
            for name in runs:
                runs[name].append(run(engines[name], name, requests))
                bar.update()
    return runs


def median_run(runs: list) -> MemoryRun:
    return sorted(runs, key=lambda r: r.throughput)[len(runs) // 2]


def spread(runs: list) -> float:
    """How far one run's throughput may move from noise alone: the square root of the repeats'
    max over min (as ``claims.noise`` weighs a spread)."""
    t = [r.throughput for r in runs]
    return math.sqrt(max(t) / min(t)) if min(t) > 0 else 1.0


def simulated(requests: Requests, timed: StepCosts, cfg, *, layout: str, budget: int, n_slots: int,
              cached_prompt=None) -> ServingTrace:
    """The simulator's run of ``requests`` on this machine's step costs, with the budget as
    ``layout`` memory (chunked prefill, the engine's budget counted in tokens)."""
    per_token = costs.kv_bytes_per_token(cfg)
    kv = KVMemory(int(budget // per_token), layout=layout, block_size=BLOCK,
                  reserve=cfg.max_seq_len if layout == "contiguous" else None)
    return simulate_requests(requests, timed.phases(per_token), mode="chunked", chunk_tokens=BUDGET_TOKENS,
                             max_batch=n_slots, kv=kv, cached_prompt=cached_prompt)


def recompute_seconds(timed: StepCosts, tokens: int) -> float:
    """What computing ``tokens`` prompt positions again costs on this machine: the largest mixed
    step's chunk tokens over what the same step costs without them, per token, times ``tokens``."""
    most = max(timed.mixed)
    per_token = (timed.mixed[most] - timed.step(PAGED_SLOTS)) / most
    return tokens * max(per_token, 0.0)


def predicted_gain(sim: dict, timed: StepCosts, paged: MemoryRun) -> float:
    """The simulator's throughput ratio, paged over contiguous, made again with the recompute the
    paged run's preemptions caused (the simulator never preempts; at most every position a
    preemption threw away is computed again, at this machine's prefill cost per token)."""
    p, c = sim["paged"], sim["contiguous"]
    tokens = p.requests.output_len[p.ok].sum()
    return float(tokens / (p.makespan + recompute_seconds(timed, paged.preempted_tokens)) / c.output_tokens_per_s)


# ----------------------------------------------------------------------------- the shared system prompt
def shared_prompt_workload(seed: int = 100, n: int = 16, rate: float = 6.0) -> tuple[Requests, list[str]]:
    """``n`` requests, each a system prompt of :data:`SHARED` tokens that all share (BOS included)
    and :data:`OWN` tokens of its own, answers of 16 tokens, arriving at ``rate`` per second (slow
    enough that prompts rarely queue: TTFT is then mostly the prefill); the first arrives alone,
    :data:`FIRST_ALONE_S` ahead of the rest, so its blocks are cached before anyone looks. (Texts
    of another seed than :func:`length_mix`'s, so no earlier run left its blocks cached.)"""
    system = prompt_texts([SHARED], seed)[0]
    own = prompt_texts([OWN + 1] * n, seed + 1)
    drawn = sample_requests(n, rate, prompt_len=SHARED + OWN, output_len=16, seed=seed)
    arrival = drawn.arrival - drawn.arrival[0]
    arrival[1:] += FIRST_ALONE_S
    return Requests(arrival, drawn.prompt_len, drawn.output_len), [system + o for o in own]


def predicted_hits(requests: Requests) -> np.ndarray:
    """Prompt tokens the prefix cache holds for each request: none for the first; for the others the
    shared prompt's whole blocks (a block is cached once full, and only behind the same blocks)."""
    hits = np.full(len(requests), (SHARED // BLOCK) * BLOCK)
    hits[0] = 0
    return hits


# ----------------------------------------------------------------------------- verdicts
def paged_runs_more_at_once(contiguous: MemoryRun, paged: MemoryRun, *, predicted: float) -> Verdict:
    """At one KV budget the paged engine keeps at least the log midpoint of 1 and ``predicted``
    times as many requests decoding at once (counted from each request's first to last token:
    what the engine's memory allowed, not a timing, so no noise allowance)."""
    ratio = paged.at_once / contiguous.at_once
    need = log_midpoint(predicted)
    return Verdict("the same KV memory, cut into blocks, runs more requests at once than as contiguous slots",
                   decide(ratio, need),
                   f"decoding at once: paged {paged.at_once:.1f}, contiguous {contiguous.at_once:.1f}: x{ratio:.2f} "
                   f"(predicted x{predicted:.2f} from block arithmetic, needed x{need:.2f})")


def paged_raises_throughput(contiguous: list, paged: list, *, predicted: float) -> Verdict:
    """The paged engine's median throughput is at least the log midpoint of 1 and ``predicted``
    (the simulator's ratio on this machine's step costs, with the run's recompute: :func:`predicted_gain`)
    times the contiguous one's, allowing for the repeats' spread."""
    c, p = median_run(contiguous), median_run(paged)
    ratio = p.throughput / c.throughput
    need = log_midpoint(predicted)
    u = spread(contiguous) * spread(paged)
    return Verdict("a larger batch in the same memory raises output throughput",
                   decide(ratio, need, u),
                   f"output tok/s: paged {p.throughput:,.0f}, contiguous {c.throughput:,.0f}: x{ratio:.2f} "
                   f"(predicted x{predicted:.2f} by the simulator on this machine's steps and the run's "
                   f"{p.preemptions} preemptions, needed x{need:.2f}{'; noise x%.2f' % u if u > 1.005 else ''})")


def prefix_cache_cuts_ttft(uncached: MemoryRun, cached: MemoryRun, *, predicted: float, u: float = 1.0) -> Verdict:
    """With the shared system prompt cached, TTFT p50 falls by at least the log midpoint of 1 and
    ``predicted`` (the simulator's ratio with the predicted hits)."""
    a, b = uncached.ttft_ms(), cached.ttft_ms()
    ratio = a / b
    need = log_midpoint(predicted)
    return Verdict("a cached prefix is prefill you never pay again: the time to the first token falls",
                   decide(ratio, need, u),
                   f"TTFT p50 without the prefix cache {a:.1f} ms, with it {b:.1f} ms: x{ratio:.2f} (predicted "
                   f"x{predicted:.2f} from the hit rate, needed x{need:.2f}; {cached.prefix_hits:,} of "
                   f"{cached.prefix_queries:,} prompt tokens found in the cache)")


def ttft_noise(*repeats: list) -> float:
    """The noise allowance of a TTFT comparison: for each condition's repeats, the square root of
    their TTFT p50's max over min, multiplied."""
    u = 1.0
    for runs in repeats:
        t = [r.ttft_ms() for r in runs]
        u *= math.sqrt(max(t) / min(t)) if min(t) > 0 else 1.0
    return u


def median_ttft_run(runs: list) -> MemoryRun:
    return sorted(runs, key=lambda r: r.ttft_ms())[len(runs) // 2]


# ----------------------------------------------------------------------------- a pool too small
def start_small_server():
    """The lab's server with a pool of :data:`SMALL_POOL` blocks (one full context), four slots and
    prefix caching, as a child process on a free port (``server.stop()``, or it stops with this kernel)."""
    from inference_lab.serving.server import ServerProcess

    return ServerProcess("--slots", "4", "--block-size", str(BLOCK), "--num-kv-blocks", str(SMALL_POOL),
                         "--enable-prefix-caching", "--max-num-batched-tokens", str(BUDGET_TOKENS),
                         policy="chunked", preset=PRESET)


def scrape(server) -> dict:
    """The server's ``/metrics``, parsed: ``{name: value}``."""
    import httpx

    from inference_lab.serving.metrics import parse

    return parse(httpx.get(server.url + "/metrics", timeout=30).text)


def overload(server, n: int = 4, output: int = 150, seed: int = 0):
    """``n`` requests of 20-token prompts and ``output``-token answers at once (together they
    need about twice the pool), then each again alone: ``(together, alone, metrics before,
    metrics after the crowd, the highest KV cache usage /metrics showed while it ran)``, the two
    runs' texts in order. The usage is a gauge: after the crowd every block is free again, so only
    a scrape during the run sees the pool fill (every 50 ms here, as ``watch`` would)."""
    import threading

    from inference_lab.serving.load import bench_serve

    prompts = prompt_texts([20] * n, seed)
    together = Requests(np.zeros(n), np.full(n, 20), np.full(n, output))
    before = scrape(server)
    highest, finished = [before["vllm:kv_cache_usage_perc"]], threading.Event()

    def watch():
        while not finished.wait(0.05):
            highest.append(scrape(server)["vllm:kv_cache_usage_perc"])

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        crowd = bench_serve(server.base_url, together, model=PRESET, prompts=prompts, label="together")
    finally:
        finished.set()
        watcher.join()
    after = scrape(server)
    alone = [bench_serve(server.base_url, Requests(np.zeros(1), np.array([20]), np.array([output])), model=PRESET,
                         prompts=[p], label="alone").results[0] for p in prompts]
    return crowd.results, alone, before, after, max(highest)



# ----------------------------------------------------------------------------- the dashboard
BUDGETS = (2, 3, 4, 6)              # the dashboard's KV budgets, in full contexts
PROMPT_LENGTHS = (16, 32, 64, 128)  # its slider: the mean prompt length of the mix


def mix_with_prompts(prompt_len: int, seed: int = 0) -> Requests:
    """:func:`length_mix` with prompts of about ``prompt_len`` tokens (+-50%), the same answers."""
    lo, hi = max(1, prompt_len // 2), prompt_len + prompt_len // 2
    return sample_requests(N_REQUESTS, 1000.0, prompt_len=(lo, hi), output_len=(32, 96), seed=seed)


def budget_rows(requests: Requests, timed: StepCosts, cfg, budgets=BUDGETS) -> list[dict]:
    """The simulator's run of ``requests`` at each budget, both layouts, on one set of step costs
    (a step costs what its batch and chunk tokens cost, whichever layout feeds it: docs/benchmarks.md)."""
    rows = []
    for contexts in budgets:
        budget = budget_bytes(cfg, contexts)
        for layout, slots in (("contiguous", contexts), ("paged", PAGED_SLOTS)):
            t = simulated(requests, timed, cfg, layout=layout, budget=budget, n_slots=slots)
            rows.append(row(contexts, layout, t))
    return rows


def row(contexts: float, layout: str, trace: ServingTrace) -> dict:
    return {"budget": contexts, "layout": layout, "at_once": trace.decoding_at_once(),
            "tokens_per_s": trace.output_tokens_per_s, "ttft_p50_ms": 1e3 * trace.percentiles()["ttft"][50]}


def memory_view(timed: StepCosts, cfg, measured: list):
    """The dashboard: the simulator on this machine's paged step costs, both layouts against the KV
    budget, for a mix whose prompts are about the slider's length; ``measured``: the engine's rows
    at the experiment's budget, drawn filled at the default length. Returns ``view(prompt_len)``."""
    from inference_lab.plots.serving import kv_memory_plot

    def view(prompt_len: int):
        rows = budget_rows(mix_with_prompts(prompt_len), timed, cfg)
        shown = measured if prompt_len == 32 else []
        fig = kv_memory_plot(rows, shown, title=f"Simulated on this machine's steps: prompts of about {prompt_len} tokens")
        at = {r["layout"]: r for r in rows if r["budget"] == CONTEXTS}
        text = (f"prompts ~{prompt_len} tokens, {CONTEXTS} contexts of memory: paged runs "
                f"{at['paged']['at_once']:.1f} at once against {at['contiguous']['at_once']:.1f}, "
                f"x{at['paged']['tokens_per_s'] / at['contiguous']['tokens_per_s']:.2f} the throughput")
        return fig, text

    return view
