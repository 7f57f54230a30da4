"""Where the lab keeps what it computes once per machine: compiled programs and ceilings."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cache_dir(*parts: str) -> Path:
    """``<project>/.cache/<parts>``, created on demand (``INFERENCE_LAB_CACHE`` moves it)."""
    root = Path(os.environ.get("INFERENCE_LAB_CACHE", PROJECT_ROOT / ".cache"))
    path = root.joinpath(*parts)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:  # read-only checkout: fall back to the user's cache folder
        path = Path.home().joinpath(".cache", "inference_lab", *parts)
        path.mkdir(parents=True, exist_ok=True)
    return path


def enable_compilation_cache() -> None:
    """Turn on JAX's persistent compilation cache in ``.cache/jax`` unless the user chose one.

    Every notebook and every sweep compiles the same decode step; with the cache the second
    notebook loads it from disk instead of compiling it again (minimum compile time 0 so the
    many small CPU programs are kept too).
    """
    import jax

    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir:
        return
    jax.config.update("jax_compilation_cache_dir", str(cache_dir("jax")))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
