"""Disaggregated serving: a prefill pool and a decode pool, each a process on hardware of its
own, the prompt's KV cache shipped between them (DistServe, Splitwise, vLLM's and SGLang's
xPyD, here 1P1D on one machine).

::

    front (the HTTP server, no jax)  --request, cancel-->  prefill worker  --first token-->  front
                                                              |  the cache: shared memory
                                                              v  (a message: which buffer)
                                                            decode worker  --every later token-->  front

Each worker runs the engine loop of :mod:`inference_lab.serving.engine` in its role
(``"prefill-only"``, ``"decode-only"``). On a CPU each is pinned to a core of its own
(:func:`inference_lab.serving.lifetime.one_core`), so a prompt being prefilled takes no time from
the decode step: prompt load raises time to first token, and time per output token barely moves.
The first token comes from the prefill worker; the transfer and the wait for a decode slot land
in the request's first gap.

**The transfer.** Both workers map one file in shared memory (``/dev/shm``): ``N`` buffers, each
a whole slot's K and V (``2 x layers x max_len x KV heads x head_dim``). The prefill worker copies
a finished prompt's cache from its device into a free buffer and sends a small message (the
request, its first token, the buffer, the padded width) down a pipe; the decode worker copies the
buffer onto its device and hands the buffer back. One copy out of the prefill device, one into the
decode device, no pickling of the arrays. A cache travels at a padded width (multiples of 16, a few
compiled widths: :func:`inference_lab.serving.slots.prefill_widths`). Every transfer is counted
(:meth:`TwoPoolEngine.stats`): its bytes, its seconds (the copy out, the message, the copy in) and,
apart, how long it then waited for a free decode slot (queueing, not transfer).

**Nothing lost.** The front orders each request's tokens by their index (the prefill worker's
first token can reach the front after the decode worker's second), ends every request it holds
with an error the moment a worker dies, refuses new ones from then on, and counts every request
it holds against the queue bound. A cancel goes to the prefill worker, which drops the request or,
if it has already handed the request on, forwards the cancel down the same pipe (so it arrives
after the request). Messages to the workers leave from a thread of their own: the HTTP server's
event loop never waits on a pipe.

Workers die with the server (:func:`inference_lab.serving.lifetime.die_with_parent`). Spawned, not
forked: a forked jax is not safe.
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing as mp
import multiprocessing.connection
import os
import queue
import tempfile
import threading
import traceback

import numpy as np

from inference_lab.base.config import ModelConfig
from inference_lab.serving.lifetime import die_with_parent, one_core
from inference_lab.serving.requests import QueueFull, Request, TokenEvent, check_request, now

READY_TIMEOUT_S = 600.0    # warm-up compiles every program of both roles; minutes on a slow CPU
RECENT_TRANSFERS = 256     # transfers kept for the median


def row_shape(cfg: ModelConfig) -> tuple:
    """One buffer: a slot's K and V, every layer and position: [2, layers, max_len, Hkv, Dh]."""
    return 2, cfg.n_layers, cfg.max_seq_len, cfg.n_kv_heads, cfg.head_dim


def _buffers(spec: dict) -> np.ndarray:
    """The shared buffers, [N, *row_shape] in the model's dtype, mapped from the file the front made
    (in a worker: jax has taught NumPy bfloat16 there)."""
    import jax.numpy as jnp

    shape = (spec["n_buffers"], *row_shape(ModelConfig(**spec["cfg"])))
    return np.memmap(spec["buffers"], dtype=jnp.dtype(spec["cfg"]["dtype"]), mode="r+", shape=shape)


# ----------------------------------------------------------------------------- in the workers
def _start(spec: dict, role: str):
    """A worker's first steps: die with the front, keep to its core, load the model."""
    die_with_parent(spec["parent"])
    one_core(spec["cores"][0 if role == "prefill" else 1])
    from inference_lab.serving.models import load_model

    return load_model(spec["preset"], spec.get("weights"), folder=spec.get("folder"),
                      max_model_len=spec.get("max_model_len"))


def _serve(engine, inbox, events, role: str, on_message, helpers=()) -> None:
    """A worker's main thread: the front's messages to ``on_message`` until it says stop (or
    goes away, or the engine fails: then the front hears why and the process ends).
    ``helpers(done)``: more loops to run in threads until the Event ``done`` is set.

    Every thread is joined before this returns, so the engine (and its device arrays) is freed by
    the main thread while the interpreter still runs: freed by a helper thread during the
    interpreter's exit, an array's destructor was cut short there and the process aborted."""
    done = threading.Event()

    def watch(done):
        while engine.error is None and engine.stopped is None and not done.wait(0.2):
            pass
        if engine.error is not None:
            events.put(("failed", role, engine.error))
            os._exit(1)

    threads = [threading.Thread(target=h, args=(done,), daemon=True) for h in (watch, *helpers)]
    for t in threads:
        t.start()
    while True:
        try:
            kind, item = inbox.recv()
        except (EOFError, OSError):   # the front is gone
            break
        if kind == "stop":
            break
        try:
            on_message(kind, item)
        except Exception as e:   # a request no engine could serve, sent straight here: refused, not fatal
            events.put(("token", TokenEvent(getattr(item, "rid", "?"), -1, 0, now(), "error", f"{e}")))
    engine.stop(reason="the server is stopping")
    done.set()
    for t in threads:
        t.join(5.0)


def prefill_worker(spec: dict, inbox, kv_out, free, events) -> None:
    """The prefill pool: requests from ``inbox``, first tokens to ``events``, caches into the
    shared buffers (a free one from ``free``) and a message per cache down ``kv_out``."""
    from inference_lab.serving.engine import Engine

    model = _start(spec, "prefill")
    buffers = _buffers(spec)

    def handoff(request: Request, token: int, copy) -> None:
        b = free.get()                         # waits while the decode pool holds every buffer
        t0 = now()
        width = copy(buffers[b])
        sent = now()
        kv_out.send(("arrive", (request, token, b, width, sent - t0, sent)))

    def emit(event):
        events.put(("token", event))

    # No overlap (async scheduling) on a pool's one core: host and device work cannot run side by
    # side there, and the hand-off's copy would wait behind the next step for the core.
    # As many slots as the decode pool (a prompt holds one only until it is handed on): its steps
    # are then a prefill-first engine's of the same size, compiled once for both.
    engine = Engine(model, policy="prefill-only", n_slots=spec["n_slots"], max_queue=1 << 20, handoff=handoff,
                    forward_cancel=lambda rid: kv_out.send(("cancel", rid)), async_scheduling=False)
    warmup = engine.warmup()
    costs = engine.slots.time_shapes(engine.scheduler.shapes(), context=0, repeats=3) if spec["time_steps"] else {}
    events.put(("ready", "prefill", warmup, costs))
    engine.start()
    _serve(engine, inbox, events, "prefill",
           lambda kind, item: engine.submit(item, emit) if kind == "submit" else engine.cancel(item))


def decode_worker(spec: dict, kv_in, control, free, events) -> None:
    """The decode pool: caches from the shared buffers into its slots, every later token to ``events``."""
    from inference_lab.serving.engine import Engine

    model = _start(spec, "decode")
    buffers = _buffers(spec)
    engine = Engine(model, policy="decode-only", n_slots=spec["n_slots"], max_queue=1 << 20,
                    speculative=spec.get("speculative"), async_scheduling=False)   # one core: as the prefill pool
    warmup = engine.warmup()
    costs = (engine.slots.time_shapes(engine.scheduler.shapes(), context=model.cfg.max_seq_len // 2)
             if spec["time_steps"] else {})
    events.put(("ready", "decode", warmup, costs))
    engine.start()

    def emit(event):
        events.put(("token", event))

    def arrive(request, token, b, width, extract_s, sent):
        received = now()

        def inserted(insert_s):
            free.put(b)
            if insert_s is not None:   # out of the prefill device, down the pipe, onto this one
                row = buffers[b, :, :, :width]
                events.put(("kv", request.rid, row.nbytes * len(request.prompt) // width, row.nbytes,
                            extract_s + (received - sent) + insert_s, now() - insert_s - received))
        try:
            engine.submit_prefilled(request, emit, buffers[b, :, :, :width], token, inserted=inserted)
        except Exception as e:
            free.put(b)
            emit(TokenEvent(request.rid, -1, 1, now(), "error", str(e)))

    def arrivals(done):
        while not done.is_set():
            try:
                if not kv_in.poll(0.2):
                    continue
                kind, item = kv_in.recv()
            except (EOFError, OSError):
                return
            if kind == "arrive":
                arrive(*item)
            else:
                engine.cancel(item)

    _serve(engine, control, events, "decode", lambda kind, item: None, helpers=(arrivals,))


# ----------------------------------------------------------------------------- in the front
@dataclasses.dataclass
class _Held:
    """A request the front holds: its callback, the index it sends next, what came early."""

    emit: object
    next: int = 0
    early: dict = dataclasses.field(default_factory=dict)


class TwoPoolEngine:
    """The two worker processes behind the interface of :class:`~inference_lab.serving.engine.Engine`
    (``submit``, ``cancel``, ``stats``, ``start``, ``stop``), for the server. ``preset`` and
    ``weights`` (or a Hugging Face ``folder`` of ``max_model_len`` positions) name the model
    (:func:`inference_lab.serving.models.load_model`), ``cfg`` its config
    (read from ``preset`` when not given); at most ``n_slots + max_queue`` requests are held at
    once, in both pools together; ``speculative``: the decode pool's, as the Engine takes it;
    ``time_steps``: each worker times its own steps on its core before it serves
    (:attr:`worker_costs`, what the serving lesson's simulator runs on)."""

    policy = "disaggregated"

    def __init__(self, preset: str, weights=None, *, folder=None, max_model_len: int | None = None,
                 cfg: ModelConfig | None = None, n_slots: int = 8, max_queue: int = 64,
                 speculative: tuple | None = None, time_steps: bool = False):
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [None]
        self.cores = (cores[0], cores[1] if len(cores) > 1 else cores[0])
        self.cfg = cfg if cfg is not None else ModelConfig.preset(preset)
        self.n_slots, self.max_queue = int(n_slots), int(max_queue)
        self.n_buffers = 2 * self.n_slots
        self.spec = {"preset": preset, "weights": None if weights is None else str(weights),
                     "folder": None if folder is None else str(folder), "max_model_len": max_model_len,
                     "cfg": dataclasses.asdict(self.cfg), "n_slots": self.n_slots, "cores": self.cores,
                     "parent": os.getpid(), "n_buffers": self.n_buffers, "speculative": speculative,
                     "time_steps": bool(time_steps)}
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._outbox = queue.SimpleQueue()            # (connection, message), sent by the sender thread
        self.transfers = 0
        self.transfer_bytes = 0        # the prompts' caches
        self.copied_bytes = 0          # what was copied: each cache at its padded width
        # (seconds of the transfer, seconds it then waited for a decode slot), the latest ones
        self._recent: collections.deque = collections.deque(maxlen=RECENT_TRANSFERS)
        self.warmup_s: dict[str, float] = {}
        # measured by each worker on its own core before it serves: its step costs by shape
        # (the simulator's costs for this pair of pools)
        self.worker_costs: dict[str, dict] = {}
        self.error: str | None = None
        self.stopped: str | None = None
        self._procs: list = []

    def start(self) -> "TwoPoolEngine":
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        fd, path = tempfile.mkstemp(prefix="inference-lab-kv-", dir=folder)
        os.close(fd)
        threading.Thread(target=self._send, name="inference-lab-send", daemon=True).start()
        try:
            size = self.n_buffers * int(np.prod(row_shape(self.cfg))) * self.cfg.dtype_bytes
            np.memmap(path, dtype=np.uint8, mode="w+", shape=(size,)).flush()
            self.spec["buffers"] = path
            self._start_workers()
        finally:
            os.unlink(path)   # both workers have it mapped (or failed): nothing is left behind, even on a crash
        for name in ("dispatch", "monitor"):
            threading.Thread(target=getattr(self, f"_{name}"), name=f"inference-lab-{name}", daemon=True).start()
        return self

    def _start_workers(self) -> None:
        ctx = mp.get_context("spawn")
        self._events = ctx.Queue()
        self._free = free = ctx.Queue()        # buffer numbers: the decode worker returns them
        for b in range(self.n_buffers):
            free.put(b)
        kv_in, kv_out = ctx.Pipe(duplex=False)
        prefill_in, self._to_prefill = ctx.Pipe(duplex=False)
        control_in, self._to_decode = ctx.Pipe(duplex=False)
        self._procs = [
            ctx.Process(target=prefill_worker, args=(self.spec, prefill_in, kv_out, free, self._events),
                        name="inference-lab-prefill", daemon=True),
            ctx.Process(target=decode_worker, args=(self.spec, kv_in, control_in, free, self._events),
                        name="inference-lab-decode", daemon=True),
        ]
        for p in self._procs:
            p.start()
        deadline = now() + READY_TIMEOUT_S
        while len(self.warmup_s) < 2:
            try:
                message = self._events.get(timeout=1.0)
            except queue.Empty:
                dead = [p.name for p in self._procs if not p.is_alive()]
                if dead or now() > deadline:
                    self.stop()
                    raise RuntimeError(f"the {' and '.join(dead) or 'worker'} process did not start "
                                       "(its error is in the log above)") from None
                continue
            if message[0] == "ready":
                _, role, seconds, costs = message
                self.warmup_s[role], self.worker_costs[role] = seconds, costs

    def warmup(self) -> float:
        """Both workers compiled at :meth:`start`; the longer of their two warm-ups."""
        return max(self.warmup_s.values(), default=0.0)

    def pids(self) -> list[int]:
        """The two workers' process ids (a test checks that none outlives the server)."""
        return [p.pid for p in self._procs]

    # -- requests
    def submit(self, request: Request, emit) -> None:
        check_request(request, vocab_size=self.cfg.vocab_size, max_len=self.cfg.max_seq_len)
        with self._lock:
            if self.error is not None or self.stopped is not None:
                raise RuntimeError(f"the engine stopped: {self.error or self.stopped}")
            if len(self._held) >= self.n_slots + self.max_queue:
                raise QueueFull(f"{len(self._held)} requests are already held by the two pools "
                                f"({self.n_slots} slots, max_queue={self.max_queue})")
            if request.rid in self._held:
                raise ValueError(f"request {request.rid} is already being served")
            self._held[request.rid] = _Held(emit)
        self._outbox.put((self._to_prefill, ("submit", request)))

    def cancel(self, rid: str) -> None:
        self._outbox.put((self._to_prefill, ("cancel", rid)))

    def _send(self) -> None:
        """The sender thread: pipe writes block when a pipe is full, never the caller's thread."""
        while True:
            conn, message = self._outbox.get()
            if conn is None:
                return
            try:
                conn.send(message)
            except (OSError, ValueError):   # a worker is gone: the monitor ends its requests
                pass

    def _dispatch(self) -> None:
        """Workers' events to the callbacks, each request's tokens in index order."""
        while True:
            try:
                message = self._events.get()
            except (EOFError, OSError, ValueError, TypeError):   # the queue closed under us at exit
                return
            if message is None:
                return
            kind = message[0]
            if kind == "kv":
                _, _, cache, copied, seconds, waited = message
                self.transfers += 1
                self.transfer_bytes += cache
                self.copied_bytes += copied
                self._recent.append((seconds, waited))
            elif kind == "failed":
                self._fail(f"the {message[1]} worker failed: {message[2]}")
            elif kind == "token":
                self._arrived(message[1])

    def _arrived(self, event: TokenEvent) -> None:
        with self._lock:
            held = self._held.get(event.rid)
            if held is None:          # already ended (a failure ended it, or it was never ours)
                return
            held.early[event.index] = event
            out = []
            while held.next in held.early:
                e = held.early.pop(held.next)
                out.append(e)
                held.next += 1
                if e.finish is not None:
                    del self._held[event.rid]
                    break
        for e in out:
            self._call(held.emit, e)

    def _call(self, emit, event: TokenEvent) -> None:
        try:
            emit(event)
        except Exception:
            traceback.print_exc()

    def _monitor(self) -> None:
        """Wait for a worker to end; if it ends while serving, every held request ends with why."""
        ended = multiprocessing.connection.wait([p.sentinel for p in self._procs])
        if self.stopped is None:
            dead = [p for p in self._procs if p.sentinel in ended]
            self._fail(", ".join(f"worker process {p.name} exited (code {p.exitcode})" for p in dead))

    def _fail(self, reason: str) -> None:
        with self._lock:
            if self.error is None:
                self.error = reason
        self._end_all("error", self.error)

    def _end_all(self, finish: str, reason: str) -> None:
        with self._lock:
            held, self._held = self._held, {}
        for rid, h in held.items():
            self._call(h.emit, TokenEvent(rid, -1, h.next, now(), finish, reason))

    def stats(self) -> dict:
        with self._lock:
            held = len(self._held)
            waiting = sum(1 for h in self._held.values() if h.next == 0)
        recent = np.array(self._recent, np.float64).reshape(-1, 2)
        return {"policy": self.policy, "slots": self.n_slots, "active": held - waiting, "waiting": waiting,
                "held": held, "error": self.error, "cores": list(self.cores), "worker_pids": self.pids(),
                "kv_transfers": self.transfers, "kv_buffers": self.n_buffers,
                "kv_buffers_free": self._free.qsize() if hasattr(self, "_free") else None,
                "kv_bytes_mean": self.transfer_bytes / self.transfers if self.transfers else None,
                "kv_copied_bytes_mean": self.copied_bytes / self.transfers if self.transfers else None,
                "kv_seconds_median": float(np.median(recent[:, 0])) if len(recent) else None,
                "kv_slot_wait_seconds_median": float(np.median(recent[:, 1])) if len(recent) else None}

    def stop(self, timeout: float = 10.0, reason: str = "the server is stopping") -> None:
        with self._lock:
            self.stopped = self.stopped or reason
        self._end_all("abort", reason)
        for conn in (getattr(self, "_to_prefill", None), getattr(self, "_to_decode", None)):
            if conn is not None:   # through the sender thread: a full pipe cannot hold up the stop
                self._outbox.put((conn, ("stop", None)))
        self._outbox.put((None, None))
        for p in self._procs:
            p.join(timeout)
            if p.is_alive():
                p.terminate()
                p.join(timeout)
        if getattr(self, "_events", None) is not None:
            self._events.put(None)
