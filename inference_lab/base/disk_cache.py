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
import tempfile
from pathlib import Path

from pallas_kernels.files import atomic_write_text

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _roots() -> list[Path]:
    """Where caches may live, in order: ``INFERENCE_LAB_CACHE`` (when set and not empty) or the
    project's ``.cache``; the user's ``~/.cache/inference_lab``; a per-user folder in the system's
    temporary folder (a read-only checkout with no usable home still runs)."""
    chosen = os.environ.get("INFERENCE_LAB_CACHE", "").strip()
    roots = [Path(chosen).expanduser() if chosen else PROJECT_ROOT / ".cache"]
    try:
        home = Path.home()
        if str(home) not in ("", "/", "."):
            roots.append(home / ".cache" / "inference_lab")
    except (RuntimeError, KeyError, OSError):   # no HOME and no user database entry
        pass
    user = os.getuid() if hasattr(os, "getuid") else "user"
    roots.append(Path(tempfile.gettempdir()) / f"inference_lab-{user}")
    return roots


def _usable(path: Path) -> str | None:
    """Why ``path`` cannot hold caches (None when it can): created if missing, and writable."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return err.strerror or str(err)
    if not path.is_dir():
        return "not a folder"
    if not os.access(path, os.W_OK):   # a read-only file system says so even to root
        return "not writable"
    return None


_SAID: set = set()


def _say_once(text: str) -> None:
    if text not in _SAID:
        _SAID.add(text)
        print(text, file=sys.stderr)


def cache_dir(*parts: str) -> Path:
    """``<cache root>/<parts>``, created on demand: the first usable of :func:`_roots`, with one
    line (once per process) when the first choice could not be used. ``OSError`` only if none
    of them can be."""
    roots = _roots()
    first = None
    for root in roots:
        path = root.joinpath(*parts)
        why = _usable(path)
        if why is None and root == roots[-1] and hasattr(os, "getuid") and root.stat().st_uid != os.getuid():
            why = "made by another user"   # the shared temporary folder: never use someone else's
        if why is None:
            if first is not None:
                _say_once(f"inference_lab: cannot keep caches in {first[0]} ({first[1]}); using {root} instead")
            return path
        first = first or (root, why)
    raise OSError(f"no folder can hold the lab's caches (tried {', '.join(str(r) for r in roots)})")


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
    try:
        folder = cache_dir("jax")
    except OSError as err:   # `import inference_lab` never fails for want of a cache
        _say_once(f"inference_lab: {err}; compiled programs are not kept between runs")
        return
    settings = {"jax_compilation_cache_dir": str(folder),
                "jax_persistent_cache_min_compile_time_secs": 0.0,
                "jax_persistent_cache_min_entry_size_bytes": 0}
    for name, value in settings.items():
        if jax is not None:
            jax.config.update(name, value)
        else:
            os.environ.setdefault(name.upper(), str(value))


MACHINE_ID = re.compile(r"[0-9a-f]{8}")


def _id_name() -> str:
    # One id per host under one cache folder: machines that share a home folder (a JupyterHub
    # image, an NFS checkout) keep separate ids. Only a hash of the host name names the file;
    # the id itself is random and says nothing about the host or its user.
    return f"id-{hashlib.sha256(platform.node().encode()).hexdigest()[:12]}"


def _id_file() -> Path:
    """Where this machine's id is kept: the first cache location that can be written."""
    return cache_dir("machine") / _id_name()


def _read_id(path: Path) -> str | None:
    """The id in ``path``; None if there is no file; a ``<...>`` text saying why when it is damaged
    (a FIFO or a folder is not opened: reading one would hang or fail)."""
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_file():
        return "<not a regular file>"
    try:
        with path.open("rb") as fh:
            return fh.read(64).decode("ascii", errors="replace").strip()
    except OSError as err:
        return f"<unreadable: {err.strerror}>"


def machine_id() -> str:
    """This machine's id: 8 random hex digits, made on first use and kept in the cache folder.

    The id is looked for in every cache location (:func:`_roots`: a read-only checkout may hold
    one made before) and made in the first where it can be kept. A damaged id file (empty,
    truncated, not a regular file, anything but 8 hex digits) is replaced by a new id, with a
    one-line message naming the file. Where no location can keep it, the id lasts for this
    process only, and that is said once.
    """
    name = _id_name()
    if name in _UNKEPT:
        return _UNKEPT[name]
    try:
        path = _id_file()
    except OSError:
        path = None
    damaged = None
    # the first choice (a read-only checkout may hold an id made before), then where it can be kept
    for where in dict.fromkeys([_roots()[0] / "machine" / name] + ([path] if path else [])):
        text = _read_id(where)
        if text is not None and MACHINE_ID.fullmatch(text):
            return text
        if text is not None and damaged is None:
            damaged = (where, text)
    if damaged is not None:
        print(f"inference_lab: machine id file {damaged[0]} is damaged ({damaged[1][:20]!r}); making a new id",
              file=sys.stderr)
    new = secrets.token_hex(4)
    try:
        if path is None:
            raise OSError("no cache folder can be written")
        if _read_id(path) is None:
            _create_exclusive(path, new + "\n")
            # two processes starting at once: whoever linked first wins, both use its id
            won = _read_id(path) or ""
            return won if MACHINE_ID.fullmatch(won) else new
        atomic_write_text(path, new + "\n")
    except OSError as err:  # no cache location can keep it: this process only, said once
        print(f"inference_lab: cannot keep the machine id ({err.strerror or err}); this process is {new}, "
              "the next one will make another, so a class would count this machine more than once",
              file=sys.stderr)
        _UNKEPT[name] = new
    return new


_UNKEPT: dict = {}   # id file -> the id this process made when the file could not be written


def _create_exclusive(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` only if it does not exist yet (a hard link never replaces)."""
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
