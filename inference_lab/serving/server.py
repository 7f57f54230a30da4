"""``python -m inference_lab serve``: the engine behind the OpenAI-compatible API, on uvicorn.

    python -m inference_lab serve                        # shakespeare_large, chunked, 127.0.0.1:8000
    python -m inference_lab serve --model models/SmolLM2-135M --max-model-len 2048   # a Hugging Face folder
    python -m inference_lab serve --policy disaggregated --max-num-seqs 8
    python -m inference_lab serve --speculative-config '{"method": "ngram", "num_speculative_tokens": 3}'
    python -m inference_lab serve --kv-cache-memory 8MiB --max-num-seqs 32   # paged, prefix caching: the default
    python -m inference_lab serve --target-itl-ms 25 --step-timeline 2000    # a latency target; GET /debug/steps
    python -m inference_lab serve --host 0.0.0.0 --api-key "$KEY"    # a classroom server

Loopback by default. Any other address needs ``--api-key`` (or ``INFERENCE_LAB_API_KEY``),
checked on every request: a server reachable from a network answers only who has the key.
The programs are compiled before the port opens (``warm-up``), so the first request waits for
no compiler. SIGINT or SIGTERM stops it cleanly: the engine thread or both worker processes
with it.

From Python (a notebook, a test) :class:`ServerProcess` runs the same command as a child
process on a free port and stops it with the notebook: the child exits when its parent goes
away, whether the parent exits, is killed, or is a notebook kernel being restarted.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading

from inference_lab.serving.lifetime import die_with_parent
from inference_lab.serving.models import DEFAULT_PRESET
from inference_lab.serving.scheduler import DEFAULT_BUDGET, PIECE, POLICIES
from inference_lab.serving.slo import SLO_BUDGET

LOOPBACK = "127.0.0.1"
READY_LINE = "inference-lab serving on "


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_args(argv=None) -> argparse.Namespace:
    from inference_lab.base.config import PRESETS

    p = argparse.ArgumentParser(prog="python -m inference_lab serve",
                                description="Serve the lab's model with an OpenAI-compatible API "
                                            "(/v1/completions, /v1/chat/completions, /v1/models, /health).")
    p.add_argument("--preset", default=None, choices=list(PRESETS),
                   help="the model: the trained shakespeare / shakespeare_large, or any preset with "
                        f"random weights (default: {DEFAULT_PRESET})")
    p.add_argument("--weights", default=None, help="a .safetensors file to serve instead of the shipped weights")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="a local Hugging Face model folder instead of a preset (Llama, Qwen2, Mistral: config.json, "
                        "safetensors, tokenizer.json; its chat template serves /v1/chat/completions)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="with --model: positions per sequence (vLLM's flag; default: the checkpoint's, at most "
                        "2048)")
    p.add_argument("--policy", default="chunked", choices=POLICIES, help="the scheduler (default: %(default)s)")
    p.add_argument("--max-num-seqs", "--slots", dest="slots", type=int, default=8,
                   help="requests running at once: the largest decode batch (vLLM's flag; --slots is the lab's "
                        "older name; default: 8)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens per iteration, decode rows and prompt chunks together (vLLM's flag; default: "
                        f"{DEFAULT_BUDGET} for chunked ({SLO_BUDGET}, the most it may choose, with --target-itl-ms), "
                        "the model's context for prefill-first)")
    p.add_argument("--target-itl-ms", type=float, default=None,
                   help="chunked: choose each iteration's token budget so its step is predicted to hold this "
                        "inter-token latency, from the steps timed at start-up (default: a fixed budget)")
    p.add_argument("--step-timeline", type=int, default=0, metavar="N",
                   help="keep a record of the last N iterations (rows, tokens, blocks, predicted and measured "
                        "time) and serve it at GET /debug/steps (default: off)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait beyond the slots; more are answered 429 (default: %(default)s)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                   help="dispatch each step before reading the last one's tokens (default: on)")
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help='speculative decoding, as vLLM takes it: \'{"method": "ngram", "num_speculative_tokens": 3}\' '
                        "(prompt-lookup guesses checked in one step)")
    p.add_argument("--speculative", choices=("ngram",), default=None,
                   help="the lab's older spelling of --speculative-config's method")
    p.add_argument("--num-speculative-tokens", type=int, default=None,
                   help=f"... and of its guesses per step, 1..{PIECE - 1} (default: 3)")
    p.add_argument("--kv-cache-layout", choices=("paged", "contiguous"), default="paged",
                   help="paged (vLLM's: blocks from a pool, prefix caching) or contiguous slots of the whole "
                        "context each, notebook 09's contrast (default: paged; the two pools of --policy "
                        "disaggregated hand on contiguous caches)")
    p.add_argument("--block-size", type=int, default=None,
                   help="the paged KV cache's blocks, in tokens (vLLM's flag: a power of two >= 16 that divides "
                        "the context; default: 16)")
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="the paged cache's blocks, the null block included (default: the memory --slots contiguous "
                        "slots would take)")
    p.add_argument("--kv-cache-memory", default=None,
                   help="the paged cache's size as memory instead: bytes, or 64MiB, 2GiB, 1.5GB")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="share the cached blocks of common prompt prefixes between requests (vLLM's flag; "
                        "paged cache; default: on)")
    p.add_argument("--quantization", "--quantize", choices=("none", "int8", "int4"), default="none",
                   help="store the weights in fewer bytes: int8 (a scale per column) or int4 (a scale per "
                        "group of --quantize-group-size rows); default: %(default)s")
    p.add_argument("--quantize-group-size", type=int, default=None,
                   help="int4's group size: 32, 64 or 128 (default 32)")
    p.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds a non-streamed request may take before it is cancelled and answered 504 "
                        "(default: %(default)s)")
    p.add_argument("--host", default=LOOPBACK, help="address to bind (default: %(default)s, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default: %(default)s; 0 picks a free one)")
    p.add_argument("--api-key", default=os.environ.get("INFERENCE_LAB_API_KEY"),
                   help="required on every request as `Authorization: Bearer KEY`; needed to bind a "
                        "non-loopback address (default: $INFERENCE_LAB_API_KEY)")
    p.add_argument("--served-model-name", default=None,
                   help="the model's name in the API (default: the preset, or the --model folder's name)")
    args = p.parse_args(argv)
    _check_model(p, args)
    for name in ("slots", "max_queue"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be at least 1")
    if not 0 <= args.port <= 65535:
        p.error(f"--port={args.port} must be in 0..65535")
    budget = args.max_num_batched_tokens
    if args.policy == "chunked" and budget is not None and budget < args.slots + PIECE:
        p.error(f"--max-num-batched-tokens={budget} must be at least --slots + {PIECE} = {args.slots + PIECE} "
                f"(the budget holds a token per decode row and at least {PIECE} prompt tokens)")
    if budget is not None and budget < PIECE:
        p.error(f"--max-num-batched-tokens={budget} must be at least {PIECE} (the smallest prompt chunk compiled)")
    _check_paged(p, args)
    _check_quantization(p, args)
    _check_speculative(p, args)
    if args.target_itl_ms is not None:
        if args.policy != "chunked":
            p.error(f"--target-itl-ms applies to --policy chunked (it sizes the prompt chunks beside the decode "
                    f"rows), not {args.policy}")
        if not (args.target_itl_ms > 0 and math.isfinite(args.target_itl_ms)):
            p.error(f"--target-itl-ms={args.target_itl_ms} must be a positive number of milliseconds")
    if args.step_timeline < 0:
        p.error(f"--step-timeline={args.step_timeline} must be 0 (off) or a number of steps to keep")
    if args.step_timeline and args.policy == "disaggregated":
        p.error("--step-timeline records the one engine of --policy chunked or prefill-first, not the two pools")
    if not args.request_timeout > 0:
        p.error(f"--request-timeout={args.request_timeout} must be a positive number of seconds")
    if args.api_key is not None and not args.api_key.strip():
        p.error("--api-key is empty: give a real key, or none on loopback")
    if not _is_loopback(args.host) and not args.api_key:
        p.error(f"--host={args.host} is reachable from other machines: give --api-key KEY (or set "
                "INFERENCE_LAB_API_KEY) so only the class can use it, or serve on 127.0.0.1")
    return args


def _check_model(p: argparse.ArgumentParser, args) -> None:
    """--preset, --weights or --model: which model, its config into ``args.cfg`` (a folder's from
    its config.json alone, a --weights file's once it is read: None until then)."""
    from inference_lab.base.config import ModelConfig

    if args.model is None:
        if args.max_model_len is not None:
            p.error("--max-model-len applies to --model only; a preset's context is its max_seq_len")
        args.preset = args.preset or DEFAULT_PRESET
        args.cfg = None if args.weights else ModelConfig.preset(args.preset)
        return
    if args.preset or args.weights:
        p.error("--model serves a Hugging Face folder: drop --preset/--weights (or drop --model)")
    from inference_lab.model import huggingface   # (read_config refuses a --max-model-len past the checkpoint's)

    try:
        args.cfg = huggingface.read_config(args.model, max_model_len=args.max_model_len)
    except ValueError as e:
        p.error(f"--model {args.model}: {e}")


def _check_speculative(p: argparse.ArgumentParser, args) -> None:
    """--speculative-config (vLLM's JSON), or the older --speculative / --num-speculative-tokens, into
    ``args.speculative_config``: (method, guesses) or None."""
    args.speculative_config, config = None, args.speculative_config
    if config is not None and (args.speculative or args.num_speculative_tokens is not None):
        p.error("give --speculative-config or --speculative/--num-speculative-tokens, not both")
    if config is not None:
        try:
            spec = json.loads(config)
        except json.JSONDecodeError as e:
            p.error(f"--speculative-config is not JSON ({e.msg}): write it as "
                    '\'{"method": "ngram", "num_speculative_tokens": 3}\'')
        if not isinstance(spec, dict) or set(spec) - {"method", "num_speculative_tokens"} or "method" not in spec:
            p.error('--speculative-config takes {"method": "ngram", "num_speculative_tokens": k}; got ' + config)
        method, k = spec["method"], spec.get("num_speculative_tokens", 3)
    elif args.speculative or args.num_speculative_tokens is not None:
        if not args.speculative:
            p.error("--num-speculative-tokens needs --speculative ngram (or use --speculative-config)")
        method, k = args.speculative, 3 if args.num_speculative_tokens is None else args.num_speculative_tokens
    else:
        return
    if method != "ngram":
        p.error(f'--speculative-config method {method!r}: this server runs "ngram" (prompt lookup)')
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < PIECE:
        p.error(f"num_speculative_tokens={k!r} must be an integer in 1..{PIECE - 1}")
    args.speculative_config = (method, k)


def _check_paged(p: argparse.ArgumentParser, args) -> None:
    """The paged-cache flags, checked before anything loads against the preset's (or folder's)
    context (a ``--weights`` file's own context is known once it is read: the engine checks them
    then, and ``serve`` exits with the same one line)."""
    from inference_lab.serving.blocks import paged_kv

    if args.kv_cache_layout == "contiguous":
        given = [f for f, v in (("--block-size", args.block_size), ("--num-kv-blocks", args.num_kv_blocks),
                                ("--kv-cache-memory", args.kv_cache_memory),
                                ("--enable-prefix-caching", args.enable_prefix_caching)) if v]
        if given:
            p.error(f"--kv-cache-layout contiguous has no blocks: drop {', '.join(given)} (or serve paged)")
    if args.cfg is None:
        return
    try:
        paged_kv(args.cfg, policy=args.policy, n_slots=args.slots, **_paged_flags(args),
                 piece=PIECE)
    except ValueError as e:
        p.error(str(e).replace("num_kv_blocks", "--num-kv-blocks").replace("kv_cache_memory", "--kv-cache-memory")
                .replace("block_size", "--block-size").replace("enable_prefix_caching", "--enable-prefix-caching"))


def _check_quantization(p: argparse.ArgumentParser, args) -> None:
    """--quantization and --quantize-group-size, checked against the preset (or folder) before anything loads."""
    from inference_lab.model import quantize

    if args.quantization == "none":
        if args.quantize_group_size is not None:
            p.error("--quantize-group-size applies to --quantization int4 only")
        return
    if args.policy == "disaggregated":
        p.error("--quantization is not supported with --policy disaggregated (its pools load float weights); "
                "use --policy chunked or static")
    if args.quantization == "int8" and args.quantize_group_size is not None:
        p.error("--quantize-group-size applies to --quantization int4 only (int8 has a scale per column)")
    group_size = quantize.group_size_for(args.quantization, args.quantize_group_size)
    try:
        if args.cfg is not None:   # a file's own shapes are known once it is read: load_model checks them then
            args.cfg.replace(quantization=args.quantization, group_size=group_size)
        else:
            quantize.check_scheme(args.quantization, group_size)
    except ValueError as e:
        p.error(f"--quantization {args.quantization}: " + str(e).replace("group_size", "--quantize-group-size"))


def _paged_flags(args) -> dict:
    """The engine's KV-cache settings: paged with prefix caching unless the flags say otherwise (the
    two pools and --kv-cache-layout contiguous: contiguous slots, any paged flag then an error)."""
    given = dict(block_size=args.block_size, num_kv_blocks=args.num_kv_blocks, kv_cache_memory=args.kv_cache_memory,
                 prefix_caching=args.enable_prefix_caching)
    if args.kv_cache_layout == "contiguous" or args.policy == "disaggregated":
        return {**given, "prefix_caching": bool(args.enable_prefix_caching)}   # any paged flag: paged_kv refuses
    return {**given, "block_size": args.block_size or 16,
            "prefix_caching": True if args.enable_prefix_caching is None else args.enable_prefix_caching}


def build_backend(args):
    """The engine ``args`` ask for, warmed up: (backend, model config)."""
    from inference_lab.serving.models import load_model

    speculative = args.speculative_config
    if args.policy == "disaggregated":
        from inference_lab.serving.disaggregated import TwoPoolEngine

        cfg = args.cfg or load_model(args.preset, args.weights).cfg
        return TwoPoolEngine(args.preset, args.weights, folder=args.model, max_model_len=args.max_model_len, cfg=cfg,
                             n_slots=args.slots, max_queue=args.max_queue, speculative=speculative).start(), cfg
    from inference_lab.serving.engine import Engine

    model = load_model(args.preset, args.weights, quantization=args.quantization, group_size=args.quantize_group_size,
                       folder=args.model, max_model_len=args.max_model_len)
    flags = _paged_flags(args)
    engine = Engine(model, policy=args.policy, n_slots=args.slots, max_num_batched_tokens=args.max_num_batched_tokens,
                    max_queue=args.max_queue, async_scheduling=args.async_scheduling, speculative=speculative,
                    enable_prefix_caching=flags.pop("prefix_caching"), target_itl_ms=args.target_itl_ms,
                    step_timeline=args.step_timeline, **flags)
    engine.warmup()
    return engine.start(), model.cfg


def load_tokenizer(args):
    """The served model's tokenizer: the --model folder's (refused here, before the weights load,
    when it is missing or damaged), else the byte-level one every preset uses."""
    from inference_lab.base import folder_tokenizer
    from inference_lab.base.tokenizer import ByteTokenizer

    if args.model is None:
        return ByteTokenizer()
    try:
        return folder_tokenizer.load(args.model, args.cfg)
    except ValueError as e:
        raise ValueError(f"--model {args.model}: {e}") from None


def main(argv=None) -> int:
    args = parse_args(argv)
    import uvicorn

    from inference_lab.serving.api import Served, create_app

    parent = os.environ.get("INFERENCE_LAB_PARENT_PID")   # set by ServerProcess: stop when it goes
    if parent:
        die_with_parent(int(parent), on_death=lambda: os.kill(os.getpid(), signal.SIGTERM))
    try:
        tokenizer = load_tokenizer(args)
        backend, cfg = build_backend(args)
    except (ValueError, RuntimeError) as e:
        print(f"serve: {e}", file=sys.stderr)
        return 2

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        backend.stop(reason="the server is stopping")

    served = Served(backend, model_name=args.served_model_name or cfg.name, max_seq_len=cfg.max_seq_len,
                    vocab_size=cfg.vocab_size, tokenizer=tokenizer, api_key=args.api_key,
                    request_timeout=args.request_timeout)
    app = create_app(served, lifespan=lifespan)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as e:
        backend.stop()
        print(f"serve: cannot bind {args.host}:{args.port} ({e.strerror}); choose another --port", file=sys.stderr)
        return 2
    # Listen before the ready line: a client that connects as soon as it reads the line (ServerProcess)
    # then waits in the backlog until uvicorn accepts, instead of being refused while a busy machine
    # is still starting the event loop (a bound socket that does not listen refuses connections).
    sock.listen(2048)
    host, port = sock.getsockname()[:2]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    handle_exit = server.handle_exit

    def stop_first(sig, frame):
        # End every request in flight at once, with the reason (their streams then close), rather
        # than let uvicorn wait for them and then cut the connections.
        threading.Thread(target=backend.stop, kwargs={"reason": "the server is stopping"}, daemon=True).start()
        handle_exit(sig, frame)

    server.handle_exit = stop_first
    print(f"{READY_LINE}http://{'[' + host + ']' if family == socket.AF_INET6 else host}:{port} "
          f"(model {served.model_name}, policy {args.policy}, {args.slots} slots, {_kv_line(backend)})", flush=True)
    try:
        server.run(sockets=[sock])   # uvicorn stops on SIGINT/SIGTERM, then raises the signal again
    except KeyboardInterrupt:
        pass
    finally:
        backend.stop(reason="the server is stopping")
    print("inference-lab server stopped", flush=True)
    return 0


def _kv_line(backend) -> str:
    kv = backend.stats().get("kv_cache") or {}
    if kv.get("layout") != "paged":
        return "contiguous KV slots"
    return (f"paged KV cache: {kv['blocks_usable']} blocks of {kv['block_size']} tokens"
            f"{', prefix caching' if kv['prefix_caching'] else ''}")


class ServerProcess:
    """``python -m inference_lab serve`` as a child process on a free loopback port.

    ``with ServerProcess(policy="chunked") as server: server.url`` (``.../v1`` is the
    OpenAI base URL). :meth:`stop` sends SIGINT and waits; the child also stops by itself
    when this process goes away. ``model``: a Hugging Face folder to serve instead of ``preset``;
    ``args`` are more ``serve`` flags."""

    def __init__(self, *args: str, policy: str = "chunked", preset: str = DEFAULT_PRESET, model=None,
                 start_timeout: float = 600.0):
        which = ["--preset", preset] if model is None else ["--model", str(model)]
        cmd = [sys.executable, "-m", "inference_lab", "serve", "--port", "0", "--policy", policy, *which, *args]
        env = {**os.environ, "INFERENCE_LAB_PARENT_PID": str(os.getpid()), "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.log: list[str] = []
        self.url = self._wait_ready(start_timeout)
        threading.Thread(target=self._drain, daemon=True).start()

    def _wait_ready(self, timeout: float) -> str:
        timer = threading.Timer(timeout, self.process.kill)
        timer.start()
        try:
            for line in self.process.stdout:
                self.log.append(line.rstrip())
                if line.startswith(READY_LINE):
                    return line[len(READY_LINE):].split()[0]
        finally:
            timer.cancel()
        self.process.wait()
        raise RuntimeError(f"the server did not start (exit code {self.process.returncode}):\n"
                           + "\n".join(self.log[-20:]))

    def _drain(self) -> None:
        for line in self.process.stdout:
            self.log.append(line.rstrip())

    @property
    def base_url(self) -> str:
        """The OpenAI client's ``base_url``."""
        return self.url + "/v1"

    def stop(self, timeout: float = 30.0) -> int:
        """SIGINT, as Ctrl-C would; SIGKILL if it has not stopped within ``timeout``. Returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

