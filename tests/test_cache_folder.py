"""Where the lab keeps its caches (issue 25, root cause 5): a read-only or odd location, an unset
home, an empty INFERENCE_LAB_CACHE or a FIFO as the id file never break `import inference_lab`
or mint a new machine id on every run without a word."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from inference_lab.base import disk_cache

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=full,
                          timeout=120)


def test_import_never_fails_for_want_of_a_cache(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = _python("import inference_lab\nfrom inference_lab.base import disk_cache\nprint(disk_cache.cache_dir('x'))",
                   INFERENCE_LAB_CACHE=str(blocker / "cache"), HOME="")
    assert done.returncode == 0, done.stderr
    where = Path(done.stdout.strip())
    assert where.is_dir() and not str(where).startswith(str(blocker)) and "inference_lab-" in str(where)
    lines = [line for line in done.stderr.splitlines() if "cannot keep caches" in line]
    assert len(lines) == 1 and str(blocker / "cache") in lines[0]


def test_an_empty_cache_variable_means_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv("INFERENCE_LAB_CACHE", "")
    monkeypatch.chdir(tmp_path)
    assert disk_cache.cache_dir("x") == disk_cache.PROJECT_ROOT / ".cache" / "x"
    assert not list(tmp_path.iterdir())                        # nothing written into the current folder


def test_a_read_only_cache_keeps_the_machine_id_elsewhere(monkeypatch, tmp_path, capsys):
    read_only = tmp_path / "ro"
    (read_only / "machine").mkdir(parents=True)               # its machine/ exists, but cannot be written
    monkeypatch.setenv("INFERENCE_LAB_CACHE", str(read_only))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m: False if str(p).startswith(str(read_only)) else real(p, m))
    monkeypatch.setattr(disk_cache, "_UNKEPT", {})
    monkeypatch.setattr(disk_cache, "_SAID", set())
    first = disk_cache.machine_id()
    monkeypatch.setattr(disk_cache, "_UNKEPT", {})            # as the next process would
    assert disk_cache.machine_id() == first                   # kept: the class counts this laptop once
    assert (tmp_path / "home" / ".cache" / "inference_lab" / "machine" / disk_cache._id_name()).read_text().strip() == first
    err = capsys.readouterr().err
    assert err.count("cannot keep caches in") == 1 and "cannot keep the machine id" not in err


def test_a_fifo_as_the_id_file_does_not_hang(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("INFERENCE_LAB_CACHE", str(tmp_path))
    monkeypatch.setattr(disk_cache, "_UNKEPT", {})
    path = disk_cache._id_file()
    os.mkfifo(path)
    new = disk_cache.machine_id()
    assert disk_cache.MACHINE_ID.fullmatch(new) and path.read_text().strip() == new
    assert "not a regular file" in capsys.readouterr().err
