"""Result files written safely: the benchmark's and the lab's.

Two rules, shared by ``python -m pallas_kernels.bench --json`` and every file the lab saves
(records, probe results, caches):

- :func:`atomic_write` never leaves a half-written file where a good one was: it writes a
  temporary file in the same folder, flushes it to disk, then ``os.replace``-s it over the
  target (one rename, which either happens whole or not at all). A full disk or an interrupt
  leaves the previous file as it was. ``exclusive=True`` creates a file that must not exist
  yet (a hard link, which fails if another run made it first): two runs given one new name do
  not silently replace each other's result.
- :func:`check_output_path` refuses a path the program could not write *before* any
  measurement runs (a missing or unwritable folder, an empty name, a name the file system
  refuses, such as one too long, an existing file without ``--force``), so a long run never
  ends in a traceback that loses its results.
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


def _temporary(path: Path) -> tuple[int, str]:
    """A temporary file beside ``path``, its name short whatever the length of ``path``'s (a
    long target name must not make the temporary one too long for the file system)."""
    return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:40]}.", suffix=".tmp")


def atomic_write(path, write, *, binary: bool = False, exclusive: bool = False) -> Path:
    """Create or replace ``path`` with what ``write(fh)`` writes into an open file.

    The data goes to a temporary file next to ``path`` (same folder, so the final rename
    never crosses file systems), is flushed and synced, and only then renamed over ``path``.
    If anything fails on the way (``OSError`` such as a full disk, ``KeyboardInterrupt``, a
    bug in ``write``), the temporary file is removed, the exception propagates, and whatever
    was at ``path`` before is untouched. A replaced file keeps its permission bits; a new one
    gets the usual ``0o666 & ~umask``.

    ``exclusive``: ``path`` must not exist; it is created whole, and if another process created
    it in the meantime (two runs given the same new name) a one-line ``ValueError`` says so and
    that file is left alone.
    """
    path = Path(path)
    fd, tmp = _temporary(path)
    try:
        kwargs = {} if binary else {"encoding": "utf-8", "newline": ""}
        with os.fdopen(fd, "wb" if binary else "w", **kwargs) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        _replace(tmp, path, exclusive=exclusive)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _replace(tmp: str, path: Path, *, exclusive: bool = False) -> None:
    try:
        mode = path.stat().st_mode & 0o7777
    except OSError:
        mode = 0o666 & ~_umask()
    os.chmod(tmp, mode)
    if not exclusive:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)      # fails if path exists: created whole, and by one process only
    except FileExistsError:
        raise ValueError(f"{path} was created by another run while this one was measuring; it is left as "
                         "it is. Choose another name, or pass --force to replace it") from None
    except OSError:             # a file system without hard links: the closest we can do
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)   # FileExistsError likewise
        os.close(fd)
        os.replace(tmp, path)
        return
    os.unlink(tmp)


@contextlib.contextmanager
def replacing(path):
    """For a writer that wants a file *name* (``safetensors.save_file``): yields a temporary
    path next to ``path``; when the block ends without an exception, the file there is
    synced and replaces ``path``; otherwise it is removed and ``path`` is untouched."""
    path = Path(path)
    fd, tmp = _temporary(path)
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
    try:
        path.lstat()      # a name too long for the file system fails here, before any is_dir() below
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as err:
        raise ValueError(f"{flag} {text[:80]}{'...' if len(text) > 80 else ''}: cannot create a file of this "
                         f"name ({err.strerror}); choose a shorter or plainer name") from None
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
        fd, probe = _temporary(path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(f"{flag} {text}: cannot create files in {str(folder)!r} ({err.strerror}); "
                         "choose a folder you can write to") from None
    if not path.exists():     # and the name itself, which a long or odd one can fail where a short one would not
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)
            os.unlink(path)
        except FileExistsError:
            pass              # created meanwhile: an exclusive write will say so
        except OSError as err:
            raise ValueError(f"{flag} {text[:80]}{'...' if len(text) > 80 else ''}: cannot create a file of "
                             f"this name ({err.strerror}); choose a shorter or plainer name") from None
    return path
