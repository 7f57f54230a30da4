"""``python -m inference_lab env | probe | train | serve | bench-serve``: the lab's command line.

``env`` says what this machine is and how the kernels will run on it; ``probe`` measures
prefill and decode tokens/s on it (see :mod:`inference_lab.measure.probe`); ``train`` trains the
model on a text file (see :mod:`inference_lab.train`); ``serve`` serves it behind an
OpenAI-compatible API (:mod:`inference_lab.serving.server`) and ``bench-serve`` times any such
server with a trace of requests (:mod:`inference_lab.serving.load`).
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import shutil
import subprocess
import sys


def _version(module: str) -> str:
    if importlib.util.find_spec(module) is None:
        return "not installed"
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # a broken install should be reported, not crash `env`
        return f"fails to import ({type(e).__name__}: {e})"
    return getattr(mod, "__version__", "installed")


def _nvidia_gpus() -> list[str]:
    """GPU names nvidia-smi reports (empty where there is no NVIDIA driver)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def env_report() -> tuple[list[tuple[str, str]], list[str]]:
    """(rows of the env table, warnings). A ``PALLAS_KERNELS_MODE`` that would make every
    kernel call fail shows as the kernels row; :func:`cmd_env` then reports it as an error."""
    import jax

    from pallas_kernels import mode

    devices = jax.devices()
    try:
        kernels = mode.describe()
    except ValueError as err:
        kernels = f"none can run: {err}"
    rows = [
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("jax", _version("jax")),
        ("jaxlib", _version("jaxlib")),
        ("flax", _version("flax")),
        ("backend", jax.default_backend()),
        ("devices", ", ".join(f"{d.device_kind} ({d.platform})" for d in devices)),
        ("kernels", kernels),
        ("matplotlib", _version("matplotlib")),
        ("ipywidgets", _version("ipywidgets")),
    ]
    warnings = []
    gpus = _nvidia_gpus()
    if gpus and all(d.platform == "cpu" for d in devices):
        warnings.append(
            f"an NVIDIA GPU is present ({', '.join(gpus)}) but jax sees only the CPU: install "
            "jax's CUDA plugin (`make setup ACCEL=cuda12`, or cuda13 with a driver >= 580)"
        )
    return rows, warnings


def cmd_env(args) -> int:
    rows, warnings = env_report()
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    for w in warnings:
        print(f"WARNING: {w}")
    from inference_lab.measure.probe_args import mode_error

    error = mode_error("env")
    if error:
        print(error, file=sys.stderr)
        return 2
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m inference_lab", description="Inference Lab: what this machine is (env), how fast it reads and writes tokens (probe), "
                                     "training the model on a text file (train), serving it (serve) and timing a "
                                     "server (bench-serve).")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("env", help="what this machine is and how the kernels run here")
    sub.add_parser("probe", help="measure prefill and decode tok/s here (probe --help)", add_help=False)
    sub.add_parser("train", help="train the model on a text file (train --help)", add_help=False)
    sub.add_parser("serve", help="serve the model with an OpenAI-compatible API (serve --help)", add_help=False)
    sub.add_parser("bench-serve", help="send a trace to an OpenAI-compatible server and time it (bench-serve --help)",
                   add_help=False)
    if argv[:1] == ["probe"]:
        from inference_lab.measure import probe

        return probe.main(argv[1:])
    if argv[:1] == ["train"]:
        from inference_lab import train  # lazy: optax and tqdm load only for training

        return train.main(argv[1:])
    if argv[:1] == ["serve"]:
        from inference_lab.serving import server

        return server.main(argv[1:])
    if argv[:1] == ["bench-serve"]:
        from inference_lab.serving import load

        return load.main(argv[1:])
    args = parser.parse_args(argv)
    return cmd_env(args)


if __name__ == "__main__":
    sys.exit(main())
