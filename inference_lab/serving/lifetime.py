"""How the serving processes live and die: a child goes when its parent goes, and a pool worker
keeps to its core.

A server started from a notebook must not outlive the kernel (a restarted kernel would leave it
holding its port and its memory), and the two pools' workers must not outlive the server. So each
child asks the Linux kernel to send it SIGTERM when its parent dies (``PR_SET_PDEATHSIG``) and,
where that is not available or the signal is lost, a thread watches the parent's pid once a second.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int, on_death=None) -> None:
    """Go when process ``parent`` goes: SIGTERM from the kernel (Linux), and a watching thread that
    calls ``on_death()`` (default: exit at once) when this process's parent is no longer ``parent``."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

    def watch():
        while os.getppid() == parent:
            threading.Event().wait(1.0)
        (on_death or (lambda: os._exit(0)))()

    threading.Thread(target=watch, name="inference-lab-parent-watch", daemon=True).start()


def one_core(core: int | None) -> None:
    """This process on one core, so that two pools on two cores do not take time from each other.
    Only the affinity: XLA's threads then share that core (a step took the same time as with XLA's
    single-thread flags, measured on the 2-core CPU), and without flags of its own the process
    compiles exactly the programs an engine in the parent compiles, so it finds them in the
    compile cache instead of compiling them again."""
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
