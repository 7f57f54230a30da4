"""Progress bars for the lab's long loops (sweeps, the probe), with a time estimate.

``tqdm.auto`` draws them: a widget bar in JupyterLab, a text bar on stderr in a terminal, each
with the elapsed and remaining time (``[00:12<00:30, 2.1s/point]``). A bar is shown only where
someone is watching, decided in this order:

1. ``INFERENCE_LAB_PROGRESS=1`` or ``=0`` in the environment: always or never;
2. ``CI`` set, or ``PYTEST_CURRENT_TEST`` set (a test, or a kernel or program a test started:
   nbval's kernel, the CLI tests' subprocesses): never. ``make notebook-test`` and
   ``make notebooks`` also set ``INFERENCE_LAB_PROGRESS=0``, so nbval compares no bar and the
   stored notebooks carry none;
3. otherwise: in a Jupyter kernel (JupyterLab, a notebook), and in a terminal when stderr is
   one; not when stderr goes to a file or a pipe.

A caller can also turn a bar off: ``measure.sweep(..., progress=False)``. Where tqdm is not
installed (the GPU image's bare Python) there is no bar, and nothing fails.

Every measurement the lessons make draws one (the measuring core,
:func:`inference_lab.measure.timing.measure_points`, and the loops that do not go through it),
so no lesson cell sits at ``[*]`` for seconds without saying how long is left. A bar appears
only after :data:`DELAY_S` (a measurement done sooner shows none) and ``transient=True``
removes it when the loop ends, so the cell keeps its results and not a full bar.
"""

from __future__ import annotations

import os
import sys

ENV_VAR = "INFERENCE_LAB_PROGRESS"
DELAY_S = 1.0   # no bar for a loop that ends sooner: a bar that flashes and goes says nothing


def _in_jupyter_kernel() -> bool:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def enabled(stream=None) -> bool:
    """Whether a progress bar should be drawn here (the rules in the module docstring)."""
    forced = os.environ.get(ENV_VAR, "").strip().lower()
    if forced in ("1", "true", "yes", "on"):
        return True
    if forced in ("0", "false", "no", "off"):
        return False
    if os.environ.get("CI") or os.environ.get("PYTEST_CURRENT_TEST"):
        return False
    if _in_jupyter_kernel():
        return True
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class _Silent:
    """What :func:`bar` returns without tqdm: the same calls, no output."""

    def __init__(self, iterable=None):
        self._iterable = iterable

    def __iter__(self):
        return iter(self._iterable or ())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        pass

    def set_postfix_str(self, s="", refresh=True):
        pass

    def close(self):
        pass


def bar(iterable=None, *, total: int | None = None, desc: str | None = None, unit: str = "it",
        show: bool = True, transient: bool = False, file=None, **kwargs):
    """A ``tqdm.auto`` bar, or a silent one where :func:`enabled` says no.

    ``show=False`` silences it whatever the environment says; ``show=True`` (the default) leaves
    the decision to :func:`enabled`, so a caller cannot make a CI log noisy. ``transient``: the
    bar is removed when it closes (a lesson cell keeps its results, not the bar). It is drawn
    only after :data:`DELAY_S`. Use it like tqdm: as an iterable, or as a context manager with
    ``update()`` and ``set_postfix_str(..., refresh=False)`` (a refresh would draw the bar
    before its delay).
    """
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Silent(iterable)
    stream = sys.stderr if file is None else file
    gone = stream is None or getattr(stream, "closed", False)   # a closed stderr: nowhere to draw, even if forced
    kwargs.setdefault("delay", DELAY_S)
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=gone or not (show and enabled(file)),
                file=file, dynamic_ncols=True, leave=not transient, **kwargs)


def note(message: str) -> None:
    """Print a line (to stdout) without breaking a text bar that is being drawn."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        print(message)
        return
    tqdm.write(message, file=sys.stdout)
