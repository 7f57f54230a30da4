"""A serving simulator: requests arrive, prefill and decode share GPUs (or run in pools).

Seeded Poisson arrivals with prompt and output lengths from distributions (RAG traffic has
prompt:output token ratios of 19:1 to 47:1), served in one of three modes:

* ``"colocated"`` (prefill first): every GPU does both phases with continuous batching. Each
  iteration is either a prefill of whole newly admitted prompts or one decode step of every
  running sequence, and waiting prompts go first. A long prompt stalls everyone's decode:
  the stall is one long ITL gap for every running request.
* ``"chunked"`` (chunked prefill, the default of vLLM's scheduler, SGLang and Sarathi-Serve):
  every iteration has a token budget (``chunk_tokens``, default :data:`DEFAULT_CHUNK_TOKENS`).
  Each running sequence's next token takes one token of it; what is left goes to pieces
  (chunks) of waiting prompts, oldest first. No iteration grows past the budget, so no gap
  grows past one budget-sized iteration; a long prompt needs several iterations, so its TTFT
  grows instead.
* ``"disaggregated"`` (xPyD): ``prefill_gpus`` workers only prefill and ship each KV cache
  over an interconnect (``interconnect_bandwidth``: bytes/s in ONE direction, the way the
  cache travels; each prefill worker's transfers queue on its own link) to ``decode_gpus``
  workers that only generate (a new sequence goes to the least loaded one). Prompt load raises
  TTFT; TPOT barely moves.

**Memory** (``kv=KVMemory(...)``, colocated and chunked): a worker's KV cache holds so many
token positions. Contiguous, each request reserves the whole context from its start, so
``tokens // context`` requests run at once; paged, a request holds blocks as its tokens come,
and starts when the pool could hold its whole prompt and still keep a block free for every
running request (the lab's engine's rule), so the batch follows the real lengths. The simulator
never preempts: a running request always gets its next block (where the engine would preempt,
the simulation is optimistic by the recompute it leaves out). ``cached_prompt``: the tokens of
each prompt a prefix cache already holds, which its prefill skips.

Phase times come from a :class:`PhaseModel`: the roofline of a ``ModelConfig`` on a
``HardwareSpec`` (:func:`roofline_phases`) or fits to measured records
(:func:`measured_phases`). The simulation is exact event order, no jax, a few thousand
requests in a fraction of a second. Same requests and settings, same result.

Every output token is timestamped: the first one comes out of the iteration that finishes its
prompt's prefill, every later one at the end of a decode (or mixed) iteration. From those the
:class:`SimResult` computes TTFT, TPOT, ITL, E2E and goodput the way serving benchmarks do
(:mod:`inference_lab.analytic.serving_metrics`). Disaggregated: the first token comes from the prefill
worker, so the KV transfer and the wait for a decode slot land in the first ITL gap.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
from typing import Iterable

import numpy as np

from inference_lab.analytic.phases import PhaseModel
from inference_lab.analytic.serving_metrics import SLO, ServingTrace
from inference_lab.analytic.workload import Requests, sample_requests
from inference_lab.base import checks

__all__ = ["simulate", "simulate_requests", "SimResult", "KVMemory", "load_sweep", "MODES", "DEFAULT_CHUNK_TOKENS"]

MODES = ("colocated", "chunked", "disaggregated")

DEFAULT_CHUNK_TOKENS = 512
"""Tokens per chunked-prefill iteration: the budget vLLM first shipped chunked prefill with
(2024, tuned for inter-token latency on an A100; later versions default higher, for
throughput). On an H100 a dense bf16 model turns compute-bound near 300 tokens per pass (the
ridge point), so 512 keeps each iteration within about twice a pure decode step."""


@dataclasses.dataclass(frozen=True)
class KVMemory:
    """One worker's KV cache: ``tokens`` positions in all. ``layout``: ``"contiguous"`` (a
    request reserves ``reserve`` positions, the model's context, from its start) or ``"paged"``
    (blocks of ``block_size`` positions as its tokens come)."""

    tokens: int
    layout: str = "paged"
    block_size: int = 16
    reserve: int | None = None

    def __post_init__(self):
        checks.count("KVMemory.tokens", self.tokens)
        checks.count("KVMemory.block_size", self.block_size)
        if self.layout not in ("contiguous", "paged"):
            raise ValueError(f"KVMemory.layout={self.layout!r}: use 'contiguous' or 'paged'")
        if self.layout == "contiguous" and (self.reserve is None or checks.count("KVMemory.reserve", self.reserve)
                                            > self.tokens):
            raise ValueError("KVMemory.reserve: a contiguous cache needs the positions each request reserves "
                             "(the context), at most KVMemory.tokens")

    def blocks(self, n_tokens) -> int:
        return -(-int(n_tokens) // self.block_size)


@dataclasses.dataclass(kw_only=True, eq=False)
class SimResult(ServingTrace):
    """A simulated run: the :class:`ServingTrace` metrics plus what the servers did.

    ``tokens``: output tokens produced per request (equals ``output_len``);
    ``decode_tokens_total``: tokens produced by decode rows, counted iteration by iteration;
    ``utilisation``: pool -> busy fraction of (workers x makespan); ``iterations``: pool ->
    iterations run; ``mean_batch``: pool -> decode rows per decoding iteration, weighted by
    time (how full the busy decoder was: a worker is "busy" even with one sequence);
    ``phase_seconds``: GPU-seconds of iterations that only prefilled (``"prefill"``), only
    decoded (``"decode"``) or did both (``"mixed"``, chunked prefill's): the machine time each
    phase took, as against the share of each request's wait it took.
    """

    tokens: np.ndarray
    decode_tokens_total: int
    utilisation: dict
    iterations: dict
    mean_batch: dict = dataclasses.field(default_factory=dict)
    phase_seconds: dict = dataclasses.field(default_factory=dict)

    def summary(self) -> dict:
        row = super().summary()
        for pool, u in self.utilisation.items():
            row[f"util_{pool}"] = u
        for pool, b in self.mean_batch.items():
            row[f"mean_batch_{pool}"] = b
        return row


class _DecodeSet:
    """The running sequences of one worker, advanced one decode step at a time in O(log n).

    A sequence joining after step ``s0`` with ``r`` tokens to go and ``c`` cached tokens
    produces one token in each of steps ``s0+1 .. s0+r``; its context at step ``s`` is
    ``c + (s - s0 - 1)``. ``total_context`` is kept as a running sum.
    """

    def __init__(self):
        self.step = 0
        self.heap: list[tuple[int, int]] = []  # (finish step, request id)
        self.join: dict[int, tuple[int, int]] = {}  # rid -> (join step, cached tokens at join)
        self.total_context = 0

    def __len__(self):
        return len(self.heap)

    def add(self, rid: int, remaining: int, cached: int) -> None:
        heapq.heappush(self.heap, (self.step + remaining, rid))
        self.join[rid] = (self.step, cached)
        self.total_context += cached

    def blocks(self, kv: KVMemory) -> int:
        """Blocks the running sequences hold once each has its next position."""
        return sum(kv.blocks(cached + self.step - s0 + 1) for s0, cached in self.join.values())

    def advance(self) -> list[tuple[int, int, int]]:
        """After one step: every context grows by one; return (rid, join step, tokens) of the finished."""
        self.step += 1
        self.total_context += len(self.heap)
        done = []
        while self.heap and self.heap[0][0] == self.step:
            _, rid = heapq.heappop(self.heap)
            s0, cached = self.join.pop(rid)
            self.total_context -= cached + (self.step - s0)
            done.append((rid, s0, self.step - s0))
        return done


class _Worker:
    def __init__(self, pool: str, index: int, uid: int):
        self.pool, self.index, self.uid = pool, index, uid
        self.busy = False
        self.busy_time = 0.0
        self.iterations = 0
        self.decode_time = 0.0  # seconds of iterations that decoded
        self.phase_time = {"prefill": 0.0, "decode": 0.0, "mixed": 0.0}  # seconds by what the iteration did
        self.batch_time = 0.0  # sum of decode rows x seconds
        self.running = _DecodeSet()
        self.step_times: list[float] = []  # end of decode step k+1 at index k
        self.pending: collections.deque[int] = collections.deque()  # decode pool: KV arrived here
        self.prefilling: list[list[int]] = []  # chunked: [rid, prompt tokens done]
        self.link_free = 0.0  # prefill pool: when its outbound link is free


def _check_mode(mode, phases, requests):
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: use one of {', '.join(map(repr, MODES))}")
    if not isinstance(phases, PhaseModel):
        raise ValueError("phases must be a PhaseModel: use roofline_phases(cfg, spec) or measured_phases(records)")
    if not isinstance(requests, Requests) or len(requests) == 0:
        raise ValueError("requests must be a non-empty Requests (use sample_requests)")


def simulate_requests(requests: Requests, phases: PhaseModel, *, mode: str = "colocated",
                      gpus: int = 1, prefill_gpus: int = 1, decode_gpus: int = 1,
                      max_batch: int = 64, max_prefill_tokens: int = 8192,
                      chunk_tokens: int = DEFAULT_CHUNK_TOKENS, chunk_unit: int = 1,
                      interconnect_bandwidth: float | None = None,
                      transfer_latency_s: float = 0.0, slo: SLO | None = None, kv: KVMemory | None = None,
                      cached_prompt=None) -> SimResult:
    """Serve ``requests`` and time every token (the three modes: see the module docstring).

    ``gpus``: colocated or chunked workers (each a replica pulling from one queue).
    ``prefill_gpus``/``decode_gpus``: the disaggregated pools (x prefill, y decode: xPyD).
    ``max_batch``: sequences a worker holds at once (running, or being prefilled in chunks).
    ``max_prefill_tokens``: prompt tokens one prefill-only iteration takes (at least one
    prompt, however long). ``chunk_tokens``: the chunked mode's token budget per iteration.
    ``chunk_unit``: the budget is spent in whole units of this many prompt tokens (an engine
    whose compiled shapes hold prompt pieces of 16 tokens passes 16: the room beside the decode
    rows is rounded down to whole pieces, and a prompt's last, partial piece takes a whole one);
    1 is token by token, as the lab's engine and vLLM count their budgets.
    A disaggregated request moves ``prompt_len x kv_bytes_per_token`` bytes over
    ``interconnect_bandwidth`` (bytes/s one way) plus ``transfer_latency_s``. ``slo``: the
    targets goodput counts against (also settable later with ``result.with_slo``). ``kv``: each
    worker's KV memory (:class:`KVMemory`; colocated and chunked). ``cached_prompt``: an int or one
    per request, prompt tokens a prefix cache holds (each prefill skips them, at most all but one).
    """
    _check_mode(mode, phases, requests)
    max_batch = checks.count("max_batch", max_batch)
    max_prefill_tokens = checks.count("max_prefill_tokens", max_prefill_tokens)
    chunk_tokens = checks.count("chunk_tokens", chunk_tokens)
    unit = checks.count("chunk_unit", chunk_unit)
    transfer_latency_s = checks.finite("transfer_latency_s", transfer_latency_s, 0.0)
    if not isinstance(requests, Requests):
        raise ValueError(f"requests must be a workload.Requests, got {type(requests).__name__}")
    limit = getattr(phases, "max_seq_len", None)
    if limit is not None and len(requests) and int((requests.prompt_len + requests.output_len).max()) > limit:
        raise ValueError(f"a request of {int((requests.prompt_len + requests.output_len).max()):,} tokens (prompt + "
                         f"output) is past the model's max_seq_len={limit:,}: shorten the workload's lengths")
    if mode == "disaggregated":
        pre_pool = [_Worker("prefill", i, i) for i in range(checks.count("prefill_gpus", prefill_gpus))]
        dec_pool = [_Worker("decode", i, len(pre_pool) + i)
                    for i in range(checks.count("decode_gpus", decode_gpus))]
        interconnect_bandwidth = checks.positive("interconnect_bandwidth", interconnect_bandwidth)
        if phases.kv_bytes_per_token is None:
            raise ValueError("disaggregated mode needs phases.kv_bytes_per_token: pass cfg= to measured_phases")
    else:
        pre_pool = dec_pool = [_Worker(mode, i, i) for i in range(checks.count("gpus", gpus))]
    workers = pre_pool if pre_pool is dec_pool else pre_pool + dec_pool

    arrival, plen, olen = requests.arrival, requests.prompt_len, requests.output_len
    n = len(requests)
    if kv is not None and (mode == "disaggregated" or not isinstance(kv, KVMemory)):
        raise ValueError("kv must be a KVMemory, for the colocated and chunked modes")
    hit = np.zeros(n, np.int64) if cached_prompt is None else np.asarray(cached_prompt)
    if hit.dtype == bool or not np.issubdtype(hit.dtype, np.integer) or hit.shape not in ((), (n,)) or (hit < 0).any():
        raise ValueError(f"cached_prompt must be prompt tokens >= 0: one int, or one per request ({n})")
    hit = np.broadcast_to(hit, (n,))
    hit = np.minimum(hit.astype(np.int64), plen - 1)       # at least one prompt token is computed
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    tokens = np.zeros(n, dtype=np.int64)
    where = np.zeros((n, 2), dtype=np.int64)  # worker uid, join step: where its decode tokens are
    decode_tokens_total = 0
    waiting: collections.deque[int] = collections.deque()  # prompts not yet started
    events: list = []  # (time, tie-breaker, kind, payload): a deterministic total order
    counter = 0

    def push(t, kind, payload):
        nonlocal counter
        heapq.heappush(events, (t, counter, kind, payload))
        counter += 1

    for rid in range(n):
        push(float(arrival[rid]), "arrive", rid)

    def fits(worker, rid, starting=()):
        """Whether ``rid`` may start on ``worker`` beside what runs there (and ``starting``)."""
        if kv is None:
            return True
        held = [*(r for r, _ in worker.prefilling), *starting]
        others = len(worker.running) + len(held)
        if kv.layout == "contiguous":
            return (others + 1) * kv.reserve <= kv.tokens
        used = worker.running.blocks(kv) + sum(kv.blocks(plen[r]) for r in held)
        return kv.tokens // kv.block_size - used - kv.blocks(plen[rid]) >= max(1, others)

    def whole_prompts(room, worker):
        """FIFO whole prompts for one prefill pass, within the token budget, ``room`` slots and the memory."""
        batch, total = [], 0
        while waiting and len(batch) < room and fits(worker, waiting[0], batch):
            nxt = -(-int(plen[waiting[0]] - hit[waiting[0]]) // unit) * unit
            if batch and total + nxt > max_prefill_tokens:
                break
            batch.append(waiting.popleft())
            total += nxt
        return batch

    def plan(worker):
        """The worker's next iteration: (decode rows, [(rid, new, cached)] of prompt work)."""
        run = len(worker.running)
        if mode == "colocated":
            if waiting and run < max_batch:
                work = [(r, int(plen[r] - hit[r]), int(hit[r])) for r in whole_prompts(max_batch - run, worker)]
                if work:
                    return 0, work
            return run, []
        if mode == "chunked":
            budget, work = (chunk_tokens - run) // unit * unit, []
            for item in worker.prefilling:  # prompts already under way first, oldest first
                if budget <= 0:
                    break
                c = min(int(plen[item[0]]) - item[1], budget)
                work.append((item[0], c, item[1]))
                budget -= -(-c // unit) * unit
            while budget > 0 and waiting and run + len(worker.prefilling) < max_batch and fits(worker, waiting[0]):
                rid = waiting.popleft()
                worker.prefilling.append([rid, int(hit[rid])])
                c = min(int(plen[rid] - hit[rid]), budget)
                work.append((rid, c, int(hit[rid])))
                budget -= -(-c // unit) * unit
            return run, work
        if worker.pool == "prefill":
            return 0, [(r, int(plen[r]), 0) for r in whole_prompts(max_batch, worker)]
        while worker.pending and run < max_batch:  # decode pool: admit at the step boundary
            rid = worker.pending.popleft()
            worker.running.add(rid, int(olen[rid]) - 1, int(plen[rid]))
            run += 1
        return run, []

    def start(worker, now):
        """Begin the worker's next iteration if it has work; leave it idle otherwise."""
        if worker.busy:
            return
        rows, work = plan(worker)
        if not rows and not work:
            return
        if mode == "chunked":
            seconds = phases.iteration_seconds(rows, worker.running.total_context,
                                               [(c, cached) for _, c, cached in work])
        elif work:
            seconds = phases.prefill_seconds([c for _, c, _ in work])
        else:
            seconds = phases.decode_seconds(rows, worker.running.total_context)
        worker.busy = True
        worker.busy_time += seconds
        worker.iterations += 1
        if rows:
            worker.decode_time += seconds
            worker.batch_time += rows * seconds
        worker.phase_time["mixed" if rows and work else "decode" if rows else "prefill"] += seconds
        push(now + seconds, "done", (worker, rows, work))

    def prompt_done(worker, rid, now):
        first[rid] = now
        tokens[rid] = 1
        if olen[rid] == 1:
            finish[rid] = now
        elif mode != "disaggregated":
            where[rid] = (worker.uid, worker.running.step)
            worker.running.add(rid, int(olen[rid]) - 1, int(plen[rid]))
        else:  # ship the KV cache over this prefill worker's link, one transfer at a time
            t0 = max(now, worker.link_free)
            worker.link_free = t0 + plen[rid] * phases.kv_bytes_per_token / interconnect_bandwidth
            push(worker.link_free + transfer_latency_s, "kv", rid)

    while events:
        now, _, what, payload = heapq.heappop(events)
        if what == "arrive":
            waiting.append(payload)
            for w in pre_pool:
                start(w, now)
        elif what == "kv":
            target = min(dec_pool, key=lambda w: (len(w.running) + len(w.pending), w.index))
            where[payload] = (target.uid, -1)  # join step set when admitted
            target.pending.append(payload)
            start(target, now)
        else:
            worker, rows, work = payload
            worker.busy = False
            if rows:
                worker.step_times.append(now)
                decode_tokens_total += rows  # one token per running sequence this step
                for rid, s0, decoded in worker.running.advance():
                    tokens[rid] += decoded
                    finish[rid] = now
                    where[rid, 1] = s0
            for rid, c, cached in work:
                if mode == "chunked":
                    item = next(it for it in worker.prefilling if it[0] == rid)
                    item[1] += c
                    if item[1] < plen[rid]:
                        continue
                    worker.prefilling.remove(item)
                prompt_done(worker, rid, now)
            start(worker, now)
            if waiting and worker in pre_pool:
                for w in pre_pool:  # an idle replica may take what this one left waiting
                    start(w, now)
    return _result(mode, requests, first, finish, tokens, where, workers, decode_tokens_total,
                   pre_pool, dec_pool, slo)


def _result(mode, requests, first, finish, tokens, where, workers, decode_tokens_total,
            pre_pool, dec_pool, slo) -> SimResult:
    steps = {w.uid: np.asarray(w.step_times) for w in workers}
    olen = requests.output_len
    offsets = np.zeros(len(requests) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(olen - 1)
    values = np.empty(int(offsets[-1]))
    for rid in np.flatnonzero(olen > 1):
        uid, s0 = where[rid]
        times = steps[int(uid)][s0:s0 + olen[rid] - 1]
        seg = values[offsets[rid]:offsets[rid + 1]]
        seg[0] = times[0] - first[rid]
        seg[1:] = np.diff(times)
    pools = {mode: pre_pool} if pre_pool is dec_pool else {"prefill": pre_pool, "decode": dec_pool}
    span = float(np.nanmax(finish) - requests.arrival.min())
    util = {k: float(sum(w.busy_time for w in ws) / (len(ws) * span)) if span > 0 else 0.0
            for k, ws in pools.items()}
    iters = {k: sum(w.iterations for w in ws) for k, ws in pools.items()}
    batch = {}
    for k, ws in pools.items():
        t = sum(w.decode_time for w in ws)
        if t > 0:
            batch[k] = float(sum(w.batch_time for w in ws) / t)
    phase_seconds = {k: float(sum(w.phase_time[k] for w in workers)) for k in ("prefill", "decode", "mixed")}
    return SimResult(mode=mode, requests=requests, first_token=first, finish=finish, itl_values=values,
                     itl_offsets=offsets, slo=slo, tokens=tokens, decode_tokens_total=decode_tokens_total,
                     utilisation=util, iterations=iters, mean_batch=batch, phase_seconds=phase_seconds)


def simulate(phases: PhaseModel, *, rate: float, n_requests: int = 2000, prompt_len=512,
             output_len=(32, 128), ratio=None, seed: int = 0, mode: str = "colocated",
             **serving) -> SimResult:
    """:func:`sample_requests` then :func:`simulate_requests` (``serving``: its keywords)."""
    reqs = sample_requests(n_requests, rate, prompt_len=prompt_len, output_len=output_len,
                           ratio=ratio, seed=seed)
    return simulate_requests(reqs, phases, mode=mode, **serving)


def load_sweep(phases: PhaseModel, rates: Iterable[float], *, modes=("colocated", "disaggregated"),
               seed: int = 0, **kwargs) -> list[dict]:
    """:meth:`SimResult.summary` rows at each arrival rate and mode (same seed everywhere).

    For a fair comparison the colocated and chunked modes get as many GPUs as the two
    disaggregated pools together (``gpus = prefill_gpus + decode_gpus``) unless ``gpus`` is given.
    """
    kwargs.setdefault("gpus", kwargs.get("prefill_gpus", 1) + kwargs.get("decode_gpus", 1))
    rows = []
    for rate in rates:
        for mode in modes:
            row = simulate(phases, rate=rate, seed=seed, mode=mode, **kwargs).summary()
            row["rate"] = rate
            rows.append(row)
    return rows
