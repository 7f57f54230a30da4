"""Result files written safely: the benchmark's and the lab's.

Two rules, shared by ``python -m pallas_kernels.bench --json`` and every file the lab saves
(records, probe results, caches):

- :func:`atomic_write` never leaves a half-written file where a good one was: it writes a
  temporary file in the same folder, flushes it to disk, then ``os.replace``-s it over the
  target (one rename, which either happens whole or not at all). A full disk or an interrupt
  leaves the previous file as it was.
- :func:`check_output_path` refuses a path the program could not write *before* any
  measurement runs (a missing or unwritable folder, an empty name, an existing file without
  ``--force``), so a long run never ends in a traceback that loses its results.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path, write, *, binary: bool = False) -> Path:
    """Create or replace ``path`` with what ``write(fh)`` writes into an open file.

    The data goes to a temporary file next to ``path`` (same folder, so the final rename
    never crosses file systems), is flushed and synced, and only then renamed over ``path``.
    If anything fails on the way (``OSError`` such as a full disk, ``KeyboardInterrupt``, a
    bug in ``write``), the temporary file is removed, the exception propagates, and whatever
    was at ``path`` before is untouched. A replaced file keeps its permission bits; a new one
    gets the usual ``0o666 & ~umask``.
    """
    path = Path(path)
    folder = path.parent
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        kwargs = {} if binary else {"encoding": "utf-8", "newline": ""}
        with os.fdopen(fd, "wb" if binary else "w", **kwargs) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        _replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _replace(tmp: str, path: Path) -> None:
    try:
        mode = path.stat().st_mode & 0o7777
    except OSError:
        mode = 0o666 & ~_umask()
    os.chmod(tmp, mode)
    os.replace(tmp, path)


@contextlib.contextmanager
def replacing(path):
    """For a writer that wants a file *name* (``safetensors.save_file``): yields a temporary
    path next to ``path``; when the block ends without an exception, the file there is
    synced and replaces ``path``; otherwise it is removed and ``path`` is untouched."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        _replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path, text: str) -> Path:
    """:func:`atomic_write` of one string (UTF-8)."""
    return atomic_write(path, lambda fh: fh.write(text))


def check_output_path(path, *, force: bool = False, flag: str = "--json") -> Path:
    """``path`` as a :class:`~pathlib.Path` if a result file can be written there, else a
    one-line ``ValueError`` naming ``flag`` and the fix.

    Refused: an empty name; a folder (give a file name); a parent folder that does not exist
    or is not a folder; a folder this process cannot create files in (tried for real, so a
    read-only file system is caught even for root); an existing file unless ``force``.
    """
    text = "" if path is None else str(path)
    if not text.strip():
        raise ValueError(f"{flag} {text!r}: give a file name, e.g. {flag} results.json")
    path = Path(text).expanduser()
    if text.endswith(("/", os.sep)) and not path.is_dir():  # meant as a folder
        raise ValueError(f"{flag} {text}: the folder {str(path)!r} does not exist; create it first "
                         f"(mkdir -p {path}) or choose another path")
    if path.is_dir():
        raise ValueError(f"{flag} {text}: is a folder; give a file name inside it, e.g. {flag} {path / 'results.json'}")
    folder = path.parent
    if not folder.exists():
        raise ValueError(f"{flag} {text}: the folder {str(folder)!r} does not exist; create it first "
                         f"(mkdir -p {folder}) or choose another path")
    if not folder.is_dir():
        raise ValueError(f"{flag} {text}: {str(folder)!r} is not a folder; choose another path")
    if path.exists() or path.is_symlink():
        if not path.is_file():
            raise ValueError(f"{flag} {text}: exists and is not a regular file; choose another path")
        if not force:
            raise ValueError(f"{flag} {text}: the file already exists; pass --force to replace it, "
                             "or choose another name")
    try:  # the one honest test of "can I write here": do it (root ignores permission bits)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-test.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(f"{flag} {text}: cannot create files in {str(folder)!r} ({err.strerror}); "
                         "choose a folder you can write to") from None
    return path
