"""Where the lab keeps what it computes once per machine: compiled programs, ceilings, and
this machine's identity (a short random id that probe files carry, so a classroom's files
from thirty laptops stay thirty machines)."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import secrets
import sys
from pathlib import Path

from pallas_kernels.files import atomic_write_text

PROJECT_ROOT = Path(__file__).resolve().parents[2]


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

    Without importing jax: if jax is not imported yet, the settings go into the environment
    variables jax reads when it is (``JAX_COMPILATION_CACHE_DIR`` and friends; the lab's child
    processes inherit them); if it is, into ``jax.config``. So ``import inference_lab`` stays
    free of jax, and a file-only module (records, the roofline) imports in milliseconds.
    """
    chosen = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    jax = sys.modules.get("jax")
    if chosen or (jax is not None and jax.config.jax_compilation_cache_dir):
        return
    settings = {"jax_compilation_cache_dir": str(cache_dir("jax")),
                "jax_persistent_cache_min_compile_time_secs": 0.0,
                "jax_persistent_cache_min_entry_size_bytes": 0}
    for name, value in settings.items():
        if jax is not None:
            jax.config.update(name, value)
        else:
            os.environ.setdefault(name.upper(), str(value))


MACHINE_ID = re.compile(r"[0-9a-f]{8}")


def _id_file() -> Path:
    # One id per host under one cache folder: machines that share a home folder (a JupyterHub
    # image, an NFS checkout) keep separate ids. Only a hash of the host name names the file;
    # the id itself is random and says nothing about the host or its user.
    host = hashlib.sha256(platform.node().encode()).hexdigest()[:12]
    return cache_dir("machine") / f"id-{host}"


def machine_id() -> str:
    """This machine's id: 8 random hex digits, made on first use and kept in the cache folder.

    A damaged id file (empty, truncated, anything but 8 hex digits) is replaced by a new id,
    with a one-line message naming the file.
    """
    path = _id_file()
    if str(path) in _UNKEPT:
        return _UNKEPT[str(path)]
    try:
        with path.open("rb") as fh:
            text = fh.read(64).decode("ascii", errors="replace").strip()
    except FileNotFoundError:
        text = None
    except OSError as err:
        text = f"<unreadable: {err.strerror}>"
    if text is not None and MACHINE_ID.fullmatch(text):
        return text
    if text is not None:
        print(f"inference_lab: machine id file {path} is damaged ({text[:20]!r}); making a new id",
              file=sys.stderr)
    new = secrets.token_hex(4)
    try:
        if text is None:
            _create_exclusive(path, new + "\n")
            # two processes starting at once: whoever linked first wins, both use its id
            won = path.read_text(encoding="ascii", errors="replace").strip()
            return won if MACHINE_ID.fullmatch(won) else new
        atomic_write_text(path, new + "\n")
    except OSError as err:  # a read-only or full cache: the id lasts for this process only, said once
        print(f"inference_lab: cannot keep the machine id in {path} ({err.strerror or err}); this process "
              f"is {new}, the next one will make another", file=sys.stderr)
        _UNKEPT[str(path)] = new
    return new


_UNKEPT: dict = {}   # id file -> the id this process made when the file could not be written


def _create_exclusive(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` only if it does not exist yet (a hard link never replaces)."""
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(text)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links
            atomic_write_text(path, text)
    finally:
        os.unlink(tmp)
