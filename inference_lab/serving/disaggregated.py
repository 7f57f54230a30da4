"""Disaggregated serving: a prefill pool and a decode pool, each a process on hardware of its
own, the prompt's KV cache shipped between them (DistServe, Splitwise, vLLM's and SGLang's
xPyD, here 1P1D on one machine).

::

    front (the HTTP server)  --request-->  prefill worker  --first token-->  front
                                             |  KV cache over a pipe
                                             v
                                           decode worker   --every later token-->  front

Each worker runs the scheduler loop of :mod:`inference_lab.serving.scheduler` in its role
(``"prefill-only"``, ``"decode-only"``). On a CPU each is pinned to a core of its own
(``sched_setaffinity``) and given one XLA thread, so a prompt being prefilled takes no time
from the decode step: prompt load raises time to first token, and time per output token
barely moves. The first token comes from the prefill worker; the transfer and the wait for a
decode slot land in the request's first gap.

The KV cache travels as NumPy arrays through a ``multiprocessing`` pipe (pickled, copied
twice: into the pipe and out of it). Each transfer's bytes (``2 x layers x prompt tokens x
KV heads x head_dim x 4`` for float32) and seconds (the prefill's send to the decode worker
holding it on its device) are counted: :meth:`TwoPoolEngine.stats` reports them.

Workers die with the server: they are daemonic children, ask the kernel for SIGTERM when
their parent dies (Linux), and watch their parent's pid (elsewhere). Spawned, not forked:
a forked jax is not safe.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading

import numpy as np

from inference_lab.serving.models import load_model
from inference_lab.serving.scheduler import Engine, QueueFull, Request, TokenEvent, now

READY_TIMEOUT_S = 600.0    # warm-up compiles every program of both roles; minutes on a slow CPU


# ----------------------------------------------------------------------------- in the workers
def _die_with_parent(parent: int) -> None:
    """Exit when the process that started this one goes away (a killed server or notebook kernel)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    def watch():
        while True:
            if os.getppid() != parent:
                os._exit(0)
            threading.Event().wait(1.0)

    threading.Thread(target=watch, daemon=True).start()


def _one_core(core: int | None) -> None:
    """This process on one core with one XLA thread (XLA reads its flags when its CPU backend
    starts, at the first array, not when jax is imported)."""
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1".strip()
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})


def _row_arrays(row, n: int):
    """A one-row cache's first ``n`` positions as host arrays (what travels)."""
    return [np.asarray(k[:, :n]) for k in row.k], [np.asarray(v[:, :n]) for v in row.v]


def _prefill_costs(engine: Engine) -> dict:
    """The prefill worker's own prefill time per padded width, on its one core (median of 3)."""
    from inference_lab.base import tokenizer
    from inference_lab.serving.slots import prefill_widths
    from pallas_kernels.timing import round_robin, timed

    widths = prefill_widths(engine.max_len)
    runs = [lambda w=w: timed(lambda: engine.slots.prefill([tokenizer.BOS] * w)[0]) for w in widths]
    return {w: s.median for w, s in zip(widths, round_robin(runs, repeats=3))}


def prefill_worker(spec: dict, inbox, kv_out, events) -> None:
    """The prefill pool: prompts from ``inbox``, first tokens to ``events``, caches to ``kv_out``."""
    _die_with_parent(spec["parent"])
    _one_core(spec["cores"][0])
    model = load_model(spec["preset"], spec.get("weights"))

    def handoff(request: Request, token: int, row) -> None:
        n = len(request.prompt)
        k, v = _row_arrays(row, n)
        kv_out.send((request, token, k, v, now()))

    engine = Engine(model, policy="prefill-only", n_slots=1, max_queue=1 << 20, handoff=handoff)
    warmup = engine.warmup()
    events.put(("ready", "prefill", warmup, _prefill_costs(engine)))
    engine.start()
    _serve_inbox(engine, inbox, events)


def decode_worker(spec: dict, kv_in, control, events) -> None:
    """The decode pool: caches from ``kv_in`` into its slots, every later token to ``events``."""
    _die_with_parent(spec["parent"])
    _one_core(spec["cores"][1])
    model = load_model(spec["preset"], spec.get("weights"))
    import jax.numpy as jnp

    from inference_lab.model.kv_cache import KVCache
    from inference_lab.serving.slots import prefill_width

    engine = Engine(model, policy="decode-only", n_slots=spec["n_slots"], max_queue=1 << 20)
    warmup = engine.warmup()
    from pallas_kernels.timing import round_robin, timed

    widths = engine.slots.step_widths()
    runs = [lambda w=w: timed(lambda: engine.slots.busy_step(w)) for w in widths]
    step = {w: s.median for w, s in zip(widths, round_robin(runs, repeats=5))}
    events.put(("ready", "decode", warmup, step))
    engine.start()
    stop, lock = threading.Event(), threading.Lock()
    cancelled: set[str] = set()    # cancels that may overtake their cache on the other pipe

    def cancel(rid: str) -> None:
        with lock:
            cancelled.add(rid)
            engine.cancel(rid)

    def emit(event):
        events.put(("token", event))

    def arrivals():
        while not stop.is_set():
            if not kv_in.poll(0.2):
                continue
            request, token, k, v, sent = kv_in.recv()
            n = len(request.prompt)
            width = prefill_width(n, engine.max_len)
            pad = ((0, 0), (0, width - n), (0, 0), (0, 0))
            row = KVCache([jnp.asarray(np.pad(a, pad)) for a in k], [jnp.asarray(np.pad(a, pad)) for a in v],
                          np.array([n], np.int32))
            held = now()
            events.put(("kv", request.rid, int(sum(a.nbytes for a in k + v)), held - sent))
            with lock:
                if request.rid in cancelled:
                    emit(TokenEvent(request.rid, -1, 1, now(), "abort"))
                else:
                    engine.submit_prefilled(request, emit, row, token)

    threading.Thread(target=arrivals, daemon=True).start()
    _serve_inbox(engine, control, events, on_cancel=cancel)
    stop.set()


def _serve_inbox(engine: Engine, inbox, events, on_cancel=None) -> None:
    """A worker's main thread: submit and cancel what the front sends, until it says stop."""
    def emit(event):
        events.put(("token", event))

    while True:
        try:
            kind, item = inbox.recv()
        except (EOFError, OSError):   # the front is gone
            break
        if kind == "stop":
            break
        if kind == "cancel":
            (on_cancel or engine.cancel)(item)
        else:
            engine.submit(item, emit)
    engine.stop()


# ----------------------------------------------------------------------------- in the front
class TwoPoolEngine:
    """The two worker processes behind the interface of :class:`~inference_lab.serving.scheduler.Engine`
    (``submit``, ``cancel``, ``stats``, ``start``, ``stop``), for the server. ``preset`` and
    ``weights`` name the model (:func:`inference_lab.serving.models.load_model`); at most
    ``max_queue`` requests wait for the prefill worker."""

    policy = "disaggregated"

    def __init__(self, preset: str, weights=None, *, n_slots: int = 8, max_queue: int = 64):
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [None]
        self.cores = (cores[0], cores[1] if len(cores) > 1 else cores[0])
        self.spec = {"preset": preset, "weights": None if weights is None else str(weights),
                     "n_slots": int(n_slots), "cores": self.cores, "parent": os.getpid()}
        self.n_slots, self.max_queue = int(n_slots), int(max_queue)
        self._emit: dict[str, object] = {}        # rid -> callback, until the request ends
        self._waiting_first: set[str] = set()     # submitted, first token not yet out
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self.transfers: list[tuple[int, float]] = []   # (bytes, seconds) per shipped cache
        self.warmup_s: dict[str, float] = {}
        # measured by each worker on its own core before it serves: the prefill seconds per padded
        # width, and a decode step per batch width (the simulator's costs for this pair of pools)
        self.worker_costs: dict[str, object] = {}
        self.error: str | None = None
        self._procs: list = []

    def start(self) -> "TwoPoolEngine":
        ctx = mp.get_context("spawn")
        self._events = ctx.Queue()
        kv_in, kv_out = ctx.Pipe(duplex=False)
        prefill_in, self._to_prefill = ctx.Pipe(duplex=False)
        control_in, self._to_decode = ctx.Pipe(duplex=False)
        self._procs = [
            ctx.Process(target=prefill_worker, args=(self.spec, prefill_in, kv_out, self._events),
                        name="inference-lab-prefill", daemon=True),
            ctx.Process(target=decode_worker, args=(self.spec, kv_in, control_in, self._events),
                        name="inference-lab-decode", daemon=True),
        ]
        for p in self._procs:
            p.start()
        deadline = now() + READY_TIMEOUT_S
        while len(self.warmup_s) < 2:
            try:
                kind, role, seconds, costs = self._events.get(timeout=1.0)
            except queue.Empty:
                dead = [p.name for p in self._procs if not p.is_alive()]
                if dead or now() > deadline:
                    self.stop()
                    raise RuntimeError(f"the {' and '.join(dead) or 'worker'} process did not start "
                                       "(its error is in the log above)")
                continue
            self.warmup_s[role] = seconds
            self.worker_costs[role] = costs
        self._dispatcher = threading.Thread(target=self._dispatch, name="inference-lab-events", daemon=True)
        self._dispatcher.start()
        return self

    def warmup(self) -> float:
        """Both workers compiled at :meth:`start`; the longer of their two warm-ups."""
        return max(self.warmup_s.values(), default=0.0)

    def pids(self) -> list[int]:
        """The two workers' process ids (a test checks that none outlives the server)."""
        return [p.pid for p in self._procs]

    def submit(self, request: Request, emit) -> None:
        with self._lock:
            if self.error is not None:
                raise RuntimeError(f"the engine stopped: {self.error}")
            if len(self._waiting_first) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting_first)} requests are already waiting "
                                f"(max_queue={self.max_queue})")
            self._waiting_first.add(request.rid)
            self._emit[request.rid] = emit
        self._send(self._to_prefill, ("submit", request))

    def cancel(self, rid: str) -> None:
        self._send(self._to_prefill, ("cancel", rid))
        self._send(self._to_decode, ("cancel", rid))

    def _send(self, conn, message) -> None:
        with self._send_lock:
            try:
                conn.send(message)
            except (OSError, ValueError):   # a worker is gone: stats() says so
                pass

    def _dispatch(self) -> None:
        while True:
            try:
                message = self._events.get()
            except (EOFError, OSError, ValueError, TypeError):   # the queue closed under us at exit
                return
            if message is None:
                return
            if message[0] == "kv":
                self.transfers.append((message[2], message[3]))
                continue
            event: TokenEvent = message[1]
            with self._lock:
                self._waiting_first.discard(event.rid)
                emit = self._emit.get(event.rid)
                if event.finish is not None:
                    self._emit.pop(event.rid, None)
            if emit is not None:
                emit(event)

    def stats(self) -> dict:
        dead = [p.name for p in self._procs if not p.is_alive()]
        if dead and self.error is None:
            self.error = f"worker process {', '.join(dead)} exited"
        with self._lock:
            waiting, active = len(self._waiting_first), len(self._emit) - len(self._waiting_first)
        sent = np.array(self.transfers, dtype=np.float64).reshape(-1, 2)
        return {"policy": self.policy, "slots": self.n_slots, "active": active, "waiting": waiting,
                "error": self.error, "cores": list(self.cores), "worker_pids": self.pids(), "kv_transfers": len(sent),
                "kv_bytes_mean": float(sent[:, 0].mean()) if len(sent) else None,
                "kv_seconds_median": float(np.median(sent[:, 1])) if len(sent) else None}

    def stop(self, timeout: float = 10.0) -> None:
        for conn in (getattr(self, "_to_prefill", None), getattr(self, "_to_decode", None)):
            if conn is not None:
                self._send(conn, ("stop", None))
        for p in self._procs:
            p.join(timeout)
            if p.is_alive():
                p.terminate()
                p.join(timeout)
        if getattr(self, "_events", None) is not None:
            self._events.put(None)
            dispatcher = getattr(self, "_dispatcher", None)
            if dispatcher is not None:
                dispatcher.join(timeout)
