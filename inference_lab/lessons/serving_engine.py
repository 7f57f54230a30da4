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
from inference_lab.serving.scheduler import PIECE, pieces_of

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
def traces(seed: int = 0) -> dict[str, Requests]:
    """The two traces: ``light`` (four short prompts at once: decode alone) and ``heavy`` (long
    prompts arriving faster than one pool prefills them while it also decodes)."""
    light = sample_requests(4, 1000.0, prompt_len=16, output_len=40, seed=seed)
    heavy = sample_requests(24, 8.0, prompt_len=(160, 220), output_len=(24, 40), seed=seed + 1)
    return {"light": light, "heavy": heavy}


@dataclasses.dataclass
class StepCosts:
    """This machine's measured engine step costs (seconds), by what one forward holds: a decode
    step per compiled batch width (``decode``); prompt pieces alone, per piece count (``prefill``:
    prefill-first's prompt iterations, the prefill pool's); every slot's decode row and prompt
    pieces together, per piece count (``mixed``: chunked prefill's iterations)."""

    decode: dict
    prefill: dict
    mixed: dict

    def step(self, batch: int) -> float:
        """A decode step of ``batch`` running requests: the smallest compiled width that holds them."""
        return self.decode[next((w for w in sorted(self.decode) if w >= batch), max(self.decode))]

    @staticmethod
    def pieces(table: dict, n: int) -> float:
        """A step of ``n`` pieces: the smallest compiled count that holds them (past the largest,
        in proportion)."""
        fits = [c for c in sorted(table) if c >= n]
        return table[fits[0]] if fits else table[max(table)] * n / max(table)

    def phases(self, kv_bytes_per_token: float) -> PhaseModel:
        """A :class:`PhaseModel` for the simulator from these costs (prompts counted in pieces)."""
        def prefill_seconds(prompt_lens):
            return self.pieces(self.prefill, sum(pieces_of(n) for n in prompt_lens))

        def mixed_seconds(batch, total_context, chunks=()):
            if not chunks:
                return self.step(batch)
            return self.pieces(self.mixed, sum(pieces_of(c) for c, _ in chunks))

        return PhaseModel(prefill_seconds=prefill_seconds, decode_seconds=lambda b, c: self.step(b),
                          kv_bytes_per_token=kv_bytes_per_token, mixed_seconds=mixed_seconds,
                          description="measured engine step costs")


def step_costs(timed: dict, n_slots: int = N_SLOTS) -> StepCosts:
    """:class:`StepCosts` from step times by shape (``DecodeSlots.time_shapes``: {(decode rows,
    pieces): seconds}, from one engine or several)."""
    return StepCosts(decode={w: t for (w, p), t in timed.items() if p == 0},
                     prefill={p: t for (w, p), t in timed.items() if w == 0 and p},
                     mixed={p: t for (w, p), t in timed.items() if w == n_slots and p})


def measure_step_costs(engines: dict, repeats: int = 5, context: int = 128) -> StepCosts:
    """Time each engine's own compiled steps (after its warm-up, before it serves), as when its
    decode rows hold ``context`` tokens: every shape of prefill-first's (decode widths, pieces
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
              transfer_bytes_per_s: float | None = None) -> ServingTrace:
    """The simulator's run of ``requests`` on step costs measured here (``mode`` as there; for
    ``"disaggregated"`` pass :func:`pool_costs`), the budgets spent in whole pieces as the engine's are."""
    phases = costs.phases(kv_bytes_per_token)
    kw = {"chunk_tokens": CHUNK_TOKENS} if mode == "chunked" else {"max_prefill_tokens": PREFILL_TOKENS}
    if mode == "disaggregated":
        kw |= {"prefill_gpus": 1, "decode_gpus": 1, "interconnect_bandwidth": transfer_bytes_per_s or 1e9}
    return simulate_requests(requests, phases, mode=mode, max_batch=N_SLOTS, chunk_unit=PIECE, **kw)


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


# ----------------------------------------------------------------------------- the notebook's steps
def start_server(policy: str = "chunked"):
    """The lab's server as a child process on a free port (stopped with ``server.stop()``, or with
    this kernel)."""
    from inference_lab.serving.server import ServerProcess

    return ServerProcess(policy=policy, preset=PRESET)


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
    decoding and the most pieces that fit beside them."""
    whole = costs.pieces(costs.prefill, pieces_of(int(requests.prompt_len.max())))
    beside_full_slots = (CHUNK_TOKENS - N_SLOTS) // PIECE
    return (costs.step(N_SLOTS) + whole) / costs.pieces(costs.mixed, beside_full_slots)


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


def load_view(costs: StepCosts, kv_bytes_per_token: float, transfer_bytes_per_s: float):
    """The dashboard: the simulator on this machine's step costs, the three policies against the
    arrival rate of prompts of one length (the slider). Returns (figure, readout)."""
    from inference_lab.plots.serving import serving_plot

    def view(prompt_len: int):
        rows = []
        for mode in ("colocated", "chunked", "disaggregated"):
            for rate in (1.0, 2.0, 3.0, 4.0, 6.0, 8.0):
                reqs = sample_requests(200, rate, prompt_len=prompt_len, output_len=32, seed=0)
                s = simulated(reqs, costs, mode, kv_bytes_per_token=kv_bytes_per_token,
                              transfer_bytes_per_s=transfer_bytes_per_s).summary()
                rows.append({**s, "rate": rate, "mode": mode})
        fig = serving_plot(rows, title=f"Simulated on this machine's step costs: prompts of {prompt_len} tokens")
        worst = max((r for r in rows if r["mode"] == "colocated"), key=lambda r: r["rate"])
        text = (f"{prompt_len}-token prompts at {worst['rate']:g} req/s: colocated ITL p99 "
                f"{worst['itl_p99_ms']:.0f} ms, TPOT p50 {worst['tpot_p50_ms']:.1f} ms")
        return fig, text

    return view
