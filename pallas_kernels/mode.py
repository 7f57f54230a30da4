"""The one place that decides how the kernels execute.

Every kernel takes ``mode=`` and hands it to :func:`resolve_mode`, which turns it into one
of three concrete modes:

- ``"pallas"``: compiled Pallas, lowered through Triton, on an NVIDIA GPU of compute
  capability 8.0 or newer (Ampere, Ada, Hopper, ...). Anywhere else it is an error.
- ``"interpret"``: the same Pallas kernels run by the Pallas interpreter, on any machine.
  Correct but slow: it times the interpreter, never the hardware.
- ``"reference"``: the plain-``jnp`` twins in :mod:`pallas_kernels.reference`, compiled
  by XLA.

``"auto"`` picks the fastest correct choice here: ``"pallas"`` where it compiles, otherwise
``"reference"``. The environment variable ``PALLAS_KERNELS_MODE`` overrides what ``"auto"``
means (for example ``PALLAS_KERNELS_MODE=interpret`` runs a whole notebook on the Pallas
kernels under the interpreter).
"""

from __future__ import annotations

import functools
import os

MODES = ("auto", "pallas", "interpret", "reference")
ENV_VAR = "PALLAS_KERNELS_MODE"
MIN_COMPUTE_CAPABILITY = (8, 0)


def _check_name(mode: str, where: str) -> str:
    if not isinstance(mode, str) or mode.strip().lower() not in MODES:
        fix = " (or unset it)" if where == ENV_VAR else ""
        raise ValueError(
            f"{where}={mode!r} is not a kernel mode; use one of {', '.join(MODES)}{fix}"
        )
    return mode.strip().lower()


@functools.lru_cache(maxsize=1)
def _gpu_support() -> tuple[bool, str]:
    """(can compiled Pallas run here, why) for the default jax backend."""
    import jax

    try:
        devices = jax.devices()
    except RuntimeError as e:  # no backend at all: treat as no GPU
        return False, f"jax found no devices ({e})"
    dev = devices[0]
    if dev.platform != "gpu":
        return False, f"the default jax device is {dev.platform.upper()} ({dev.device_kind}), not an NVIDIA GPU"
    kind = getattr(dev, "device_kind", "GPU")
    cc = getattr(dev, "compute_capability", None)
    if cc is None:
        return False, f"{kind} reports no CUDA compute capability (not an NVIDIA GPU?)"
    major, minor = (int(x) for x in str(cc).split(".")[:2])
    if (major, minor) < MIN_COMPUTE_CAPABILITY:
        return False, (
            f"{kind} has compute capability {major}.{minor}; Pallas' Triton lowering needs "
            f"{MIN_COMPUTE_CAPABILITY[0]}.{MIN_COMPUTE_CAPABILITY[1]} or newer"
        )
    return True, f"{kind} (compute capability {major}.{minor}) compiles Pallas through Triton"


def pallas_supported() -> bool:
    """True where compiled Pallas kernels can run on the default device."""
    return _gpu_support()[0]


def check_environment() -> None:
    """Raise the one-line ``ValueError`` that every kernel call would raise because of
    ``PALLAS_KERNELS_MODE``: a name that is not a mode, or ``pallas`` where it cannot compile.
    The command line runs this first, so ``env`` and ``probe`` report it the same way."""
    _auto()


def _auto() -> tuple[str, str]:
    override = os.environ.get(ENV_VAR)
    if override:
        chosen = _check_name(override, ENV_VAR)
        if chosen == "pallas":
            ok, why = _gpu_support()
            if not ok:
                raise ValueError(f"{ENV_VAR}={override} cannot run here: {why}; unset it, or set it to "
                                 "interpret to run the Pallas kernels under the interpreter")
        if chosen != "auto":
            return chosen, f"{ENV_VAR}={override} overrides the automatic choice"
    ok, why = _gpu_support()
    if ok:
        return "pallas", why
    return "reference", why + "; so XLA runs the plain-jnp reference kernels"


def resolve_mode(mode: str = "auto") -> str:
    """Turn a mode string into ``"pallas"``, ``"interpret"`` or ``"reference"``.

    Raises ``ValueError`` for an unknown name, or for ``"pallas"`` where it cannot compile.
    """
    mode = _check_name(mode, "mode")
    if mode == "auto":
        mode = _auto()[0]
    if mode == "pallas":
        ok, why = _gpu_support()
        if not ok:
            raise ValueError(
                f"mode='pallas' cannot run here: {why}; use mode='interpret' to run the "
                "Pallas kernels under the interpreter, or mode='auto'"
            )
    return mode


def describe() -> str:
    """One line: what ``"auto"`` resolves to on this machine, and why (a ValueError, as
    :func:`check_environment`, when ``PALLAS_KERNELS_MODE`` makes every call fail)."""
    chosen, why = _auto()
    return f'"auto" runs "{chosen}" kernels here: {why}'
