"""Notebook 09: a real serving engine, driven the way a benchmark drives vLLM.

Part one starts the lab's server (:mod:`inference_lab.serving.server`) and streams one request
from it. Part two sends the same two traces (a light one, and one heavy with prompts) through
the engine under each policy and through the simulator configured with this machine's measured
step costs, and checks the two claims the simulator made in notebook 07 on the real thing:

* :func:`chunking_bounds_the_stall`: under prompt load, chunked prefill's worst inter-token
  gaps (ITL p99) are shorter than prefill-first's;
* :func:`two_pools_hold_tpot`: under the same load, the two-pool server's time per output token
  stays near its unloaded value while the colocated server's does not.

Both are decided against a margin, and both can say CANNOT DECIDE HERE: the noise allowance
is the unloaded run's own jitter (its ITL p90 over p50), so a busy laptop widens the band
instead of failing.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from inference_lab.analytic.phases import PhaseModel
from inference_lab.analytic.serving_metrics import ServingTrace
from inference_lab.analytic.simulator import simulate_requests
from inference_lab.analytic.workload import Requests, sample_requests
from inference_lab.base.progress import bar as progress_bar
from inference_lab.lessons.claims import Verdict, all_hold, decide, log_midpoint
from inference_lab.serving.load import drive_engine

PRESET = "shakespeare_large"
N_SLOTS = 8
CHUNK_TOKENS = 64         # chunked's token budget per iteration (max_num_batched_tokens)
PREFILL_TOKENS = 256      # prefill-first's: the model's context, so any prompt fits whole


def _p(trace: ServingTrace, metric: str, q: int) -> float:
    return trace.percentiles()[metric][q]


def jitter(light: ServingTrace) -> float:
    """The noise allowance of a comparison: the unloaded run's ITL p90 over p50 (>= 1), square-rooted
    (a percentile of a run is trusted to about half that spread either way, in log terms)."""
    p50, p90 = _p(light, "itl", 50), _p(light, "itl", 90)
    return math.sqrt(max(p90 / p50, 1.0)) if p50 > 0 else 1.0


def chunking_bounds_the_stall(prefill_first: ServingTrace, chunked: ServingTrace, *, predicted: float,
                              u: float = 1.0) -> Verdict:
    """Under the same prompt-heavy trace, prefill-first's ITL p99 is at least the log midpoint
    of 1 and ``predicted`` (the stall ratio the step costs predict) times chunked prefill's."""
    a, b = _p(prefill_first, "itl", 99), _p(chunked, "itl", 99)
    need = log_midpoint(predicted)
    ratio = a / b
    holds = decide(ratio, need, u)
    return Verdict("chunked prefill keeps the worst inter-token gaps shorter than prefill-first under prompt load",
                   holds, f"ITL p99 prefill-first {1e3 * a:.1f} ms vs chunked {1e3 * b:.1f} ms: x{ratio:.2f} "
                          f"(predicted x{predicted:.2f}, needed x{need:.2f}; noise x{u:.2f})")


def two_pools_hold_tpot(colocated_light: ServingTrace, colocated_heavy: ServingTrace,
                        pools_light: ServingTrace, pools_heavy: ServingTrace, *, factor: float = 1.5,
                        u: float = 1.0) -> Verdict:
    """Prompt load raises the two-pool server's TPOT p50 by less than ``factor`` and the colocated
    server's by more."""
    rc = _p(colocated_heavy, "tpot", 50) / _p(colocated_light, "tpot", 50)
    rd = _p(pools_heavy, "tpot", 50) / _p(pools_light, "tpot", 50)
    holds = all_hold(decide(rd, factor, u, at_least=False), decide(rc, factor, u))
    return Verdict(f"two pools hold time per output token under prompt load (within x{factor:g}); one pool does not",
                   holds, f"TPOT p50 heavy/light: two pools x{rd:.2f}, colocated x{rc:.2f} "
                          f"(two pools {1e3 * _p(pools_light, 'tpot', 50):.1f} -> "
                          f"{1e3 * _p(pools_heavy, 'tpot', 50):.1f} ms, colocated "
                          f"{1e3 * _p(colocated_light, 'tpot', 50):.1f} -> "
                          f"{1e3 * _p(colocated_heavy, 'tpot', 50):.1f} ms; noise x{u:.2f})")


# ----------------------------------------------------------------------------- the traces
HEAVY_PROMPTS = (160, 220)   # the heavy trace's prompt lengths (tokens)
HEAVY_PREFILL_SHARE = 0.5    # of the engine's time its prompts' prefills take, alone: the load, on any machine


def traces(seed: int = 0, costs: "StepCosts | None" = None) -> dict[str, Requests]:
    """The two traces: ``light`` (four short prompts at once: decode alone) and ``heavy`` (long
    prompts arriving faster than one pool prefills them while it also decodes). Given this
    machine's step costs, the heavy trace's arrival rate is set so that its prompts' prefills alone
    would take :data:`HEAVY_PREFILL_SHARE` of the engine's time: the same load on a fast machine
    as on a slow one (8 requests a second without them)."""
    light = sample_requests(4, 1000.0, prompt_len=16, output_len=40, seed=seed)
    rate = 8.0
    if costs is not None:
        prompt = int(sum(HEAVY_PROMPTS) / 2)
        rate = HEAVY_PREFILL_SHARE / costs.tokens(costs.prefill, prompt)
    heavy = sample_requests(24, rate, prompt_len=HEAVY_PROMPTS, output_len=(24, 40), seed=seed + 1)
    return {"light": light, "heavy": heavy}


def trace_label(requests: Requests) -> str:
    """A trace's inputs, for every line and figure that uses it: how many prompts, their lengths,
    the arrival rate, the answers' lengths."""
    last = float(requests.arrival[-1])
    rate = f"at {len(requests) / last:.1f} req/s" if last > 0 and len(requests) / last < 100 else "all at once"
    return (f"{len(requests)} prompts of {_span(requests.prompt_len)} tokens {rate}, answers of "
            f"{_span(requests.output_len)} tokens")


def _span(values) -> str:
    lo, hi = int(np.min(values)), int(np.max(values))
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def ratio_in_words(ratio: float) -> str:
    """A ratio of two costs in words, chosen by its size."""
    if ratio < 1.2:
        return "about the same as"
    if ratio < 2.0:
        return "more than, but under twice,"
    if ratio < 5.0:
        return "a few times"
    return "many times"


@dataclasses.dataclass
class StepCosts:
    """This machine's measured engine step costs (seconds), by what one forward holds: a decode
    step per compiled batch width (``decode``); prompt chunks alone, per compiled count of chunk
    tokens (``prefill``: prefill-first's prompt iterations, the prefill pool's); every slot's decode
    row and prompt chunks together, per count of chunk tokens (``mixed``: chunked prefill's
    iterations)."""

    decode: dict
    prefill: dict
    mixed: dict

    def step(self, batch: int) -> float:
        """A decode step of ``batch`` running requests: the smallest compiled width that holds them."""
        return self.decode[next((w for w in sorted(self.decode) if w >= batch), max(self.decode))]

    @staticmethod
    def tokens(table: dict, n: int) -> float:
        """A step of ``n`` prompt tokens: the smallest compiled count of chunk tokens that holds
        them (past the largest, in proportion)."""
        fits = [c for c in sorted(table) if c >= n]
        return table[fits[0]] if fits else table[max(table)] * n / max(table)

    def phases(self, kv_bytes_per_token: float) -> PhaseModel:
        """A :class:`PhaseModel` for the simulator from these costs (prompts counted in tokens, as
        the engine's budget counts them)."""
        def prefill_seconds(prompt_lens):
            return self.tokens(self.prefill, int(sum(prompt_lens)))

        def mixed_seconds(batch, total_context, chunks=()):
            if not chunks:
                return self.step(batch)
            return self.tokens(self.mixed, int(sum(c for c, _ in chunks)))

        return PhaseModel(prefill_seconds=prefill_seconds, decode_seconds=lambda b, c: self.step(b),
                          kv_bytes_per_token=kv_bytes_per_token, mixed_seconds=mixed_seconds,
                          description="measured engine step costs")


def step_costs(timed: dict, n_slots: int = N_SLOTS) -> StepCosts:
    """:class:`StepCosts` from step times by shape (``DecodeSlots.time_shapes``: {(decode rows,
    chunk tokens): seconds}, from one engine or several)."""
    return StepCosts(decode={w: t for (w, p), t in timed.items() if p == 0},
                     prefill={p: t for (w, p), t in timed.items() if w == 0 and p},
                     mixed={p: t for (w, p), t in timed.items() if w == n_slots and p})


def measure_step_costs(engines: dict, repeats: int = 5, context: int = 128) -> StepCosts:
    """Time each engine's own compiled steps (after its warm-up, before it serves), as when its
    decode rows hold ``context`` tokens: every shape of prefill-first's (decode widths, chunks
    alone) and chunked's mixed steps."""
    timed = engines["prefill-first"].slots.time_shapes(engines["prefill-first"].scheduler.shapes(),
                                                       context=context, repeats=repeats)
    chunked = engines["chunked"]
    timed |= chunked.slots.time_shapes([s for s in chunked.scheduler.shapes() if s[1]], context=context,
                                       repeats=repeats)
    return step_costs(timed)


def pool_costs(two_pools, costs: StepCosts) -> StepCosts:
    """The two-pool engine's own costs: each worker timed its steps on its one core before serving."""
    own = step_costs(two_pools.worker_costs["decode"] | two_pools.worker_costs["prefill"])
    return StepCosts(decode=own.decode, prefill=own.prefill, mixed=costs.mixed)


def simulated(requests: Requests, costs: StepCosts, mode: str, *, kv_bytes_per_token: float,
              transfer_bytes_per_s: float | None = None, n_slots: int = N_SLOTS) -> ServingTrace:
    """The simulator's run of ``requests`` on step costs measured here (``mode`` as there; for
    ``"disaggregated"`` pass :func:`pool_costs`), the budgets spent in tokens as the engine's
    are. ``n_slots`` past the engine's own: decode steps wider than it cost what its widest does
    (a floor: the what-if of an engine with more slots)."""
    phases = costs.phases(kv_bytes_per_token)
    kw = {"chunk_tokens": CHUNK_TOKENS} if mode == "chunked" else {"max_prefill_tokens": PREFILL_TOKENS}
    if mode == "disaggregated":
        kw |= {"prefill_gpus": 1, "decode_gpus": 1, "interconnect_bandwidth": transfer_bytes_per_s or 1e9}
    return simulate_requests(requests, phases, mode=mode, max_batch=n_slots, **kw)


def run_policies(engines: dict, trace_set: dict) -> dict:
    """{(policy, trace name): ServingTrace} for each engine on each trace (in-process, no HTTP)."""
    runs = [(policy, name) for policy in engines for name in trace_set]
    traces = {}
    with progress_bar(total=len(runs), desc="serving the traces", unit="trace", transient=True) as bar:
        for policy, name in runs:   # the bar moves between runs, never during one
            bar.set_postfix_str(f"{policy} ({name})", refresh=False)
            traces[(policy, name)] = drive_engine(engines[policy], trace_set[name], label=f"{policy} ({name})")
            bar.update()
    return traces


# ----------------------------------------------------------------------------- more users than slots
CLASS_SIZE, CLASS_PROMPT, CLASS_ANSWER = 30, 64, 32   # a class pressing enter together: prompt and answer tokens


def class_requests(n: int = CLASS_SIZE) -> Requests:
    """``n`` requests that arrive together (a class pressing enter at once)."""
    return Requests(np.zeros(n), np.full(n, CLASS_PROMPT), np.full(n, CLASS_ANSWER))


def class_at_once(base_url: str, requests: Requests) -> ServingTrace:
    """The class's requests sent to the server at ``base_url`` by the lab's load generator
    (``bench-serve``), every token timed as it arrives."""
    from inference_lab.serving.load import bench_serve

    return bench_serve(base_url, requests, model=PRESET, label=f"{len(requests)} at once").trace()


def wave_jump(trace: ServingTrace, n_slots: int = N_SLOTS) -> tuple[float, float]:
    """(median TTFT jump from the last of one wave of ``n_slots`` users to the first of the next,
    median TTFT step between neighbours inside a wave), users ranked by TTFT: all arrived at once,
    so the rank is the order the engine took them. With more users than slots, user ``n_slots + 1``
    waits for a slot, so for a whole answer of the first wave; inside a wave each waits only for
    its neighbour's prefill chunks. A uniform slowdown (a busy machine, HTTP) scales both alike."""
    ttft = np.sort(trace.ttft)
    steps = np.diff(ttft)
    at_boundary = np.arange(1, len(ttft)) % n_slots == 0      # step i goes from rank i - 1 to rank i
    if not at_boundary.any() or at_boundary.all():
        raise ValueError(f"wave_jump needs more users than {n_slots} slots and at least two in a wave")
    return float(np.median(steps[at_boundary])), float(np.median(steps[~at_boundary]))


def slots_queue_the_class(measured: ServingTrace, *, predicted: float, u: float = 1.0,
                          n_slots: int = N_SLOTS) -> Verdict:
    """With more users than slots, the wait comes in waves: the TTFT jump between one wave of
    ``n_slots`` users and the next is at least the log-midpoint of ``predicted`` (the simulator's
    jump over its step inside a wave) times the step inside a wave. An engine that admitted every
    user at once would show no jump (a ratio near 1): the claim fails there. ``u``: the noise."""
    jump, step = wave_jump(measured, n_slots)
    ratio = jump / max(step, 1e-6)
    need = log_midpoint(predicted)
    return Verdict(f"{len(measured.ttft)} users on {n_slots} slots wait in waves: the TTFT jump to the next wave is "
                   f"at least x{need:.1f} the step inside a wave (half the simulator's x{predicted:.1f}, on a log scale)",
                   decide(ratio, need, u),
                   f"jump {1e3 * jump:.0f} ms, step inside a wave {1e3 * step:.1f} ms: x{ratio:.1f} (noise x{u:.2f})")


def class_lines(measured: ServingTrace, simulated_runs: dict, n_slots: int = N_SLOTS) -> str:
    """The measured class beside the simulator's runs of it (``{label: trace}``): TTFT median of
    each wave, and the jump between waves over the step inside one."""
    def row(label, t):
        ttft = np.sort(t.ttft)
        waves = [1e3 * float(np.median(ttft[i:i + n_slots])) for i in range(0, len(ttft), n_slots)]
        jump, step = wave_jump(t, n_slots)
        return (f"{label:<34}" + "".join(f"{w:>9.0f}" for w in waves)
                + f"{1e3 * jump:>9.0f}{1e3 * step:>8.1f}{jump / max(step, 1e-6):>8.1f}")
    n = len(measured.ttft)
    head = (f"{n} requests at once ({CLASS_PROMPT}-token prompts, {CLASS_ANSWER}-token answers), TTFT median per wave "
            f"of {n_slots} users (ms), the jump to the next wave and the step inside one (ms)")
    cols = (f"{'':<34}" + "".join(f"{f'wave {i + 1}':>9}" for i in range(-(-n // n_slots)))
            + f"{'jump':>9}{'step':>8}{'ratio':>8}")
    lines = [head, cols, row("measured (the server, over HTTP)", measured)]
    lines += [row(label, t) for label, t in simulated_runs.items()]
    label, first = next(iter(simulated_runs.items()))
    offset = float(np.min(measured.ttft) - np.min(first.ttft))
    if offset > 0:
        lines.append(f"the first measured token comes {1e3 * offset:.0f} ms after the first one {label}: what "
                     f"happens before the engine's first step (the client opening {n} connections, the server "
                     "parsing and queueing the requests; not measured apart here), which the simulator, a model of "
                     "the engine's steps, leaves out. It shifts every wave alike and leaves the jumps between them, "
                     "which the verdict reads, to the engine")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the notebook's steps
def start_server(policy: str = "chunked"):
    """The lab's server as a child process on a free port (stopped with ``server.stop()``, or with
    this kernel), with the in-process engines' slots, token budget and contiguous KV cache (this
    lesson's layout; the server's default is paged, notebook 10), so the simulator configured for
    those describes it too."""
    from inference_lab.serving.server import ServerProcess

    budget = CHUNK_TOKENS if policy == "chunked" else PREFILL_TOKENS
    return ServerProcess("--max-num-seqs", str(N_SLOTS), "--max-num-batched-tokens", str(budget),
                         "--kv-cache-layout", "contiguous", policy=policy, preset=PRESET)


def stream_once(base_url: str, prompt: str, max_tokens: int = 48) -> ServingTrace:
    """One streamed request, printed as it arrives; returns its timings (a one-request trace)."""
    from inference_lab.serving.load import bench_serve

    requests = Requests(np.zeros(1), np.array([len(prompt.encode()) + 1]), np.array([max_tokens]))
    result = bench_serve(base_url, requests, model=PRESET, label="one request", prompts=[prompt])
    r = result.results[0]
    print(prompt + r.text)
    return result.trace()


def start_engines(seed: int = 0):
    """The three engines, warmed up (every program compiled), and this machine's step costs
    measured on the chunked one before any of them serves: ``(engines, costs)``."""
    from inference_lab.serving.disaggregated import TwoPoolEngine
    from inference_lab.serving.engine import Engine
    from inference_lab.serving.models import load_model

    model = load_model(PRESET)
    engines = {p: Engine(model, policy=p, n_slots=N_SLOTS, max_num_batched_tokens=b)
               for p, b in (("prefill-first", PREFILL_TOKENS), ("chunked", CHUNK_TOKENS))}
    with progress_bar(total=4, desc="starting the engines", unit="step", transient=True) as bar:
        for policy, e in engines.items():
            bar.set_postfix_str(f"compiling {policy}", refresh=False)
            e.warmup()
            bar.update()
        bar.set_postfix_str("timing the steps", refresh=False)
        costs = measure_step_costs(engines)
        bar.update()
        for e in engines.values():
            e.start()
        bar.set_postfix_str("two pools: starting the workers", refresh=False)
        engines["disaggregated"] = TwoPoolEngine(PRESET, n_slots=N_SLOTS, time_steps=True).start()
        bar.update()
    return engines, costs


def predicted_stall(costs: StepCosts, requests: Requests) -> float:
    """How much longer prefill-first's worst gap should be than chunked prefill's: a decode step
    plus the longest prompt's whole prefill, against one chunked iteration with every slot
    decoding and the prompt tokens that fit beside them."""
    whole = costs.tokens(costs.prefill, int(requests.prompt_len.max()))
    return (costs.step(N_SLOTS) + whole) / costs.tokens(costs.mixed, CHUNK_TOKENS - N_SLOTS)


def step_cost_line(costs: StepCosts) -> str:
    """What a wider decode step, and prompt tokens beside a full one, cost on this machine, each
    comparison worded from the measured ratio (on a GPU both are close to free at these sizes)."""
    one, full = costs.step(1), costs.step(N_SLOTS)
    beside = CHUNK_TOKENS - N_SLOTS
    mixed = costs.tokens(costs.mixed, beside)
    return (f"here a decode step of {N_SLOTS} rows costs {ratio_in_words(full / one)} a step of one "
            f"(x{full / one:.2f}: {1e3 * full:.1f} vs {1e3 * one:.1f} ms), and {N_SLOTS} decode rows with {beside} "
            f"prompt tokens beside them cost {ratio_in_words(mixed / full)} the {N_SLOTS} rows alone "
            f"(x{mixed / full:.2f}: {1e3 * mixed:.1f} ms)")


def _order(values: dict, what: str, unit: str = "ms") -> str:
    """``values`` ({policy: number}) from the largest down, the largest named as such."""
    ranked = sorted(values.items(), key=lambda kv: kv[1], reverse=True)
    head, *rest = ranked
    return (f"{what}: longest under {head[0]} ({head[1]:.0f} {unit})"
            + "".join(f", then {p} ({v:.0f} {unit})" for p, v in rest))


def _against(measured: float, simulated: float, lower_is_better: bool = True) -> str:
    """A measured number against the simulator's, in words chosen by their ratio."""
    r = measured / simulated
    if abs(r - 1) < 0.1:
        return f"about the simulator's (x{r:.2f})"
    better = (r < 1) == lower_is_better
    return f"{'better' if better else 'worse'} than the simulator's (x{r:.2f})"


def reading_lines(measured: dict, simulated_runs: dict, trace: str = "heavy") -> str:
    """The table's comparisons under ``trace``, generated from its numbers: which policy has the
    longest TTFT p50 and ITL p99, how far each policy's TPOT p50 rose from the light trace, and each
    measured TTFT p50, TPOT p50 and ITL p99 against the simulator's run of the same requests (the
    simulator prices each step at its cost timed alone; a worst gap is the one step that cost more)."""
    policies = [p for p, t in measured if t == trace]
    s = {p: measured[(p, trace)].summary() for p in policies}
    lines = [_order({p: s[p]["ttft_p50_ms"] for p in policies}, f"{trace} trace, TTFT p50"),
             _order({p: s[p]["itl_p99_ms"] for p in policies}, f"{trace} trace, ITL p99")]
    if all((p, "light") in measured for p in policies):
        rise = {p: s[p]["tpot_p50_ms"] / measured[(p, "light")].summary()["tpot_p50_ms"] for p in policies}
        steady = min(rise, key=lambda p: abs(math.log(rise[p])))
        lines.append(f"TPOT p50, {trace} over light: " + ", ".join(f"{p} x{r:.2f}" for p, r in rise.items())
                     + f"; nearest its light-load value: {steady}")
    for p in policies:
        sim = simulated_runs.get((p, trace))
        if sim is None:
            continue
        m = sim.summary()
        lines.append(f"{p}, measured against simulated: TTFT p50 {s[p]['ttft_p50_ms']:.0f} vs {m['ttft_p50_ms']:.0f} ms, "
                     f"{_against(s[p]['ttft_p50_ms'], m['ttft_p50_ms'])}; TPOT p50 {s[p]['tpot_p50_ms']:.1f} vs "
                     f"{m['tpot_p50_ms']:.1f} ms, {_against(s[p]['tpot_p50_ms'], m['tpot_p50_ms'])}; ITL p99 "
                     f"{s[p]['itl_p99_ms']:.1f} vs {m['itl_p99_ms']:.1f} ms, {_against(s[p]['itl_p99_ms'], m['itl_p99_ms'])}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the two pools' TTFT, taken apart
@dataclasses.dataclass
class TtftParts:
    """A two-pool run's TTFT split, request by request, at its one prefill worker (seconds, one
    entry per completed request): ``wait``, from arrival until the worker was free for it (it
    serves whole prompts first come, first served); ``alone``, its prompt's prefill as the worker
    timed it alone before serving; ``extra``, the rest of the time from that start to its first
    token (what serving added to the prefill). ``ttft = wait + alone + extra``, exactly."""

    wait: np.ndarray
    alone: np.ndarray
    extra: np.ndarray

    @property
    def ttft(self) -> np.ndarray:
        return self.wait + self.alone + self.extra

    @property
    def in_service(self) -> float:
        """How many times its alone cost a prefill took while serving (the median request)."""
        return float(np.median((self.alone + self.extra) / self.alone))


def ttft_parts(trace: ServingTrace, prefill_costs: StepCosts) -> TtftParts:
    """:class:`TtftParts` of a two-pool trace, read from its arrivals and first tokens alone. The
    prefill worker takes prompts in arrival order (FIFO), so request ``i`` starts when it arrives
    or when the requests before it have their first tokens, whichever is later; what follows until
    its own first token is its prefill as served. (Prompts that share one prefill pass show the
    pass on the first of them and no time on the rest: the sums still add up.)"""
    ok = np.asarray(trace.ok, bool)
    order = np.argsort(trace.requests.arrival[ok], kind="stable")
    arrival = trace.requests.arrival[ok][order]
    first = trace.first_token[ok][order]
    plen = trace.requests.prompt_len[ok][order]
    free = np.concatenate([[-np.inf], np.maximum.accumulate(first)[:-1]])   # worker free from
    start = np.maximum(arrival, free)
    alone = np.array([prefill_costs.tokens(prefill_costs.prefill, int(n)) for n in plen])
    return TtftParts(wait=start - arrival, alone=alone, extra=first - start - alone)


def in_service_costs(pools: StepCosts, slowdown: float) -> StepCosts:
    """The pools' costs with every prefill ``slowdown`` times its alone cost, as measured while
    serving (:attr:`TtftParts.in_service`): the simulator can then model the queue that builds."""
    return StepCosts(decode=pools.decode, prefill={p: t * slowdown for p, t in pools.prefill.items()},
                     mixed=pools.mixed)


def ttft_breakdown(measured: ServingTrace, simulated_run: ServingTrace, requests: Requests, pools: StepCosts, *,
                   kv_bytes_per_token: float, transfer_bytes_per_s: float | None,
                   transfer_s: float | None = None) -> str:
    """The two pools' measured TTFT beside the simulator's, each split by :func:`ttft_parts` (means,
    which add up), what the difference is made of, and the simulator run again with the prefill at
    its measured in-service cost: does the queue that builds then explain the rest?"""
    m, s = ttft_parts(measured, pools), ttft_parts(simulated_run, pools)

    def split(parts, name):
        ms = [round(1e3 * float(x.mean())) for x in (parts.ttft, parts.wait, parts.alone, parts.extra)]
        return (f"{name} TTFT mean {ms[0]} ms = waiting for the prefill worker {ms[1]} + the prompt's prefill as "
                f"timed alone {ms[2]} + more while serving {ms[3]} ms")

    gap = m.ttft.mean() - s.ttft.mean()
    queue, extra = m.wait.mean() - s.wait.mean(), m.extra.mean() - s.extra.mean()
    lines = [f"two pools, {trace_label(requests)}:", "  " + split(m, "measured: "), "  " + split(s, "simulated:")]
    if gap > 0:
        lines.append(f"  of the {1e3 * gap:.0f} ms the measured mean exceeds the simulated: {extra / gap:.0%} is each "
                     f"prefill running slower while serving (the median prompt's took x{m.in_service:.2f} its alone "
                     f"time), {queue / gap:.0%} the longer queue those slower prefills build")
    else:
        lines.append(f"  the measured mean is {1e3 * -gap:.0f} ms under the simulated")
    if transfer_s is not None:
        lines.append(f"  the KV transfer is not in TTFT (the first token leaves the prefill worker before its cache); "
                     f"its copy out of the prefill device runs on that worker's core before the next prompt, so at "
                     f"most the whole transfer's median, {1e3 * transfer_s:.1f} ms, of each prompt's 'more while "
                     f"serving' is that copy; the rest is host time between steps and the cores this worker "
                     f"shares with the decode worker, the front and this notebook (not measured apart here)")
    again = simulated(requests, in_service_costs(pools, m.in_service), "disaggregated",
                      kv_bytes_per_token=kv_bytes_per_token, transfer_bytes_per_s=transfer_bytes_per_s)
    a, mm, ss = (float(np.median(t.ttft)) * 1e3 for t in (again, measured, simulated_run))
    verdict = ("matches the measured within 10%" if abs(a - mm) <= 0.1 * mm else
               "comes closer to the measured than the alone costs do" if abs(a - mm) < abs(ss - mm) else
               "comes no closer to the measured than the alone costs do")
    lines.append(f"  the simulator with each prefill at x{m.in_service:.2f} its alone cost (its queue then modelled): "
                 f"TTFT p50 {a:.0f} ms, against {mm:.0f} measured and {ss:.0f} simulated on the alone costs: it "
                 f"{verdict}; what it still leaves out is the slowdown itself, which it is given, not told the cause of")
    return "\n".join(lines)


def table(measured: dict, simulated_runs: dict) -> str:
    """Measured beside simulated, one row per (policy, trace): TTFT and ITL p50/p99, TPOT p50 (ms)."""
    head = ("| policy | trace | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | TPOT p50 | out tok/s |\n"
            "|---|---|---|---|---|---|---|---|")
    rows = [head]
    for key, trace in measured.items():
        for source, t in (("measured", trace), ("simulated", simulated_runs.get(key))):
            if t is None:
                continue
            s = t.summary()
            rows.append(f"| {key[0]} ({source}) | {key[1]} | {s['ttft_p50_ms']:.0f} | {s['ttft_p99_ms']:.0f} | "
                        f"{s['itl_p50_ms']:.1f} | {s['itl_p99_ms']:.1f} | {s['tpot_p50_ms']:.1f} | "
                        f"{s['output_tokens_per_s']:.0f} |")
    return "\n".join(rows)


LOAD_REQUESTS, LOAD_OUTPUT = 200, 32   # the dashboard's simulated trace at each rate: prompts, answer tokens


def load_view(costs: StepCosts, kv_bytes_per_token: float, transfer_bytes_per_s: float):
    """The dashboard: the simulator on this machine's step costs, the three policies against the
    arrival rate of prompts of one length (the slider). Returns (figure, readout)."""
    from inference_lab.plots.serving import serving_plot

    def view(prompt_len: int):
        rows = []
        for mode in ("colocated", "chunked", "disaggregated"):
            for rate in (1.0, 2.0, 3.0, 4.0, 6.0, 8.0):
                reqs = sample_requests(LOAD_REQUESTS, rate, prompt_len=prompt_len, output_len=LOAD_OUTPUT, seed=0)
                s = simulated(reqs, costs, mode, kv_bytes_per_token=kv_bytes_per_token,
                              transfer_bytes_per_s=transfer_bytes_per_s).summary()
                rows.append({**s, "rate": rate, "mode": mode})
        fig = serving_plot(rows, title=f"Simulated on this machine's step costs: {LOAD_REQUESTS} prompts of "
                                       f"{prompt_len} tokens per rate, answers of {LOAD_OUTPUT}")
        worst = max((r for r in rows if r["mode"] == "colocated"), key=lambda r: r["rate"])
        text = (f"{prompt_len}-token prompts at {worst['rate']:g} req/s: colocated ITL p99 "
                f"{worst['itl_p99_ms']:.0f} ms, TPOT p50 {worst['tpot_p50_ms']:.1f} ms")
        return fig, text

    return view
