"""The one place that decides how the kernels execute.

Every kernel takes ``mode=`` and hands it to :func:`resolve_mode`, which turns it into one of
these concrete modes:

- ``"pallas"``: compiled Pallas on an NVIDIA GPU of compute capability 8.0 or newer, the best
  tier the chip has (:func:`compiled_tier`): on Hopper (9.x) the Mosaic GPU tier
  (``pallas_kernels.mosaic``: TMA, wgmma, warp specialisation) wherever a call's shape and
  dtype fit it, the Triton tier for the rest; on Ampere and Ada (8.x), and on chips newer than
  Hopper (whose tensor cores have no ``wgmma``), the Triton tier.
- ``"triton"``: the Triton-style kernels compiled, on any GPU of compute capability >= 8.0.
- ``"mosaic"``: the Mosaic GPU kernels compiled, on compute capability 9.x only; a call
  whose shape or dtype that tier cannot take is an error (``"pallas"`` would fall back).
- ``"interpret"``: the Triton-style kernels under the Pallas interpreter, on any machine.
  Correct but slow: it times the interpreter, never the hardware.
- ``"mosaic_interpret"``: the Mosaic GPU kernels under GPU interpret mode (shared memory,
  barriers, TMA and wgmma simulated), on any machine. For correctness only.
- ``"reference"``: the plain-``jnp`` twins in :mod:`pallas_kernels.reference`, compiled by XLA.

``"auto"`` picks the fastest correct choice here: ``"pallas"`` where it compiles, otherwise
``"reference"``. The environment variable ``PALLAS_KERNELS_MODE`` overrides what ``"auto"``
means (for example ``PALLAS_KERNELS_MODE=interpret`` runs a whole notebook on the Pallas
kernels under the interpreter).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import os

MODES = ("auto", "pallas", "triton", "mosaic", "interpret", "mosaic_interpret", "reference")
ENV_VAR = "PALLAS_KERNELS_MODE"
MIN_COMPUTE_CAPABILITY = (8, 0)      # Pallas' Triton lowering: Ampere and newer
MOSAIC_COMPUTE_CAPABILITY = (9, 0)   # Mosaic GPU tier (wgmma, TMA): Hopper, 9.x only


def _check_name(mode: str, where: str) -> str:
    if not isinstance(mode, str) or mode.strip().lower() not in MODES:
        fix = " (or unset it)" if where == ENV_VAR else ""
        raise ValueError(
            f"{where}={mode!r} is not a kernel mode; use one of {', '.join(MODES)}{fix}"
        )
    return mode.strip().lower()


_ASSUMED: list = []   # (compute capability, description) pushed by assume_gpu()


@contextlib.contextmanager
def assume_gpu(device_kind: str = "NVIDIA H200", compute_capability: tuple[int, int] = (9, 0)):
    """Inside the block, the kernels act as if the default device were this GPU: for lowering
    them for CUDA on a machine without one (an abstract device and
    ``lowering_platforms=("cuda",)``; nothing can run). Used by the CUDA lowering tests and
    :mod:`pallas_kernels.triton_compile`."""
    major, minor = compute_capability
    _ASSUMED.append(((int(major), int(minor)), f"{device_kind} (compute capability {major}.{minor}, "
                                               "assumed for lowering: nothing runs)"))
    try:
        yield
    finally:
        _ASSUMED.pop()


def _gpu() -> tuple[tuple[int, int] | None, str]:
    """(compute capability of the default device or None, its description)."""
    return _ASSUMED[-1] if _ASSUMED else _real_gpu()


@functools.lru_cache(maxsize=1)
def _real_gpu() -> tuple[tuple[int, int] | None, str]:
    import jax

    try:
        devices = jax.devices()
    except RuntimeError as e:  # no backend at all: treat as no GPU
        return None, f"jax found no devices ({e})"
    dev = devices[0]
    if dev.platform != "gpu":
        return None, f"the default jax device is {dev.platform.upper()} ({dev.device_kind}), not an NVIDIA GPU"
    kind = getattr(dev, "device_kind", "GPU")
    cc = getattr(dev, "compute_capability", None)
    if cc is None:
        return None, f"{kind} reports no CUDA compute capability (not an NVIDIA GPU?)"
    major, minor = (int(x) for x in str(cc).split(".")[:2])
    return (major, minor), f"{kind} (compute capability {major}.{minor})"


def _gpu_support() -> tuple[bool, str]:
    """(can compiled Pallas run here, why) for the default jax backend."""
    cc, what = _gpu()
    if cc is None:
        return False, what
    if cc < MIN_COMPUTE_CAPABILITY:
        return False, (f"{what}: Pallas' Triton lowering needs compute capability "
                       f"{MIN_COMPUTE_CAPABILITY[0]}.{MIN_COMPUTE_CAPABILITY[1]} or newer")
    return True, f"{what} compiles Pallas"


def pallas_supported() -> bool:
    """True where compiled Pallas kernels can run on the default device."""
    return _gpu_support()[0]


def mosaic_supported() -> bool:
    """True where the Mosaic GPU tier compiles: Hopper, compute capability 9.x (its kernels use
    ``wgmma``, which exists on sm_90a only; newer chips run the Triton tier)."""
    cc = _gpu()[0]
    return pallas_supported() and cc is not None and cc[0] == MOSAIC_COMPUTE_CAPABILITY[0]


def compiled_tier() -> str | None:
    """The tier ``"pallas"`` prefers here: ``"mosaic"`` on Hopper, ``"triton"`` on other GPUs of
    compute capability >= 8.0, None where nothing compiles."""
    if not pallas_supported():
        return None
    return "mosaic" if mosaic_supported() else "triton"


def check_environment() -> None:
    """Raise the one-line ``ValueError`` that every kernel call would raise because of
    ``PALLAS_KERNELS_MODE``: a name that is not a mode, or ``pallas`` where it cannot compile.
    The command line runs this first, so ``env`` and ``probe`` report it the same way."""
    _auto()


def _auto() -> tuple[str, str]:
    override = os.environ.get(ENV_VAR)
    if override:
        chosen = _check_name(override, ENV_VAR)
        if chosen in ("pallas", "triton", "mosaic"):
            ok, why = _gpu_support()
            if chosen == "mosaic" and ok and not mosaic_supported():
                ok, why = False, f"{_gpu()[1]} is not a Hopper GPU (compute capability 9.x)"
            if not ok:
                raise ValueError(f"{ENV_VAR}={override} cannot run here: {why}; unset it, or set it to "
                                 "interpret to run the Pallas kernels under the interpreter")
        if chosen != "auto":
            return chosen, f"{ENV_VAR}={override} overrides the automatic choice"
    ok, why = _gpu_support()
    if ok:
        tier = ("the Mosaic GPU tier where a call's shape fits it, the Triton tier elsewhere"
                if compiled_tier() == "mosaic" else "the Triton tier")
        return "pallas", f"{why}: {tier}"
    return "reference", why + "; so XLA runs the plain-jnp reference kernels"


def resolve_mode(mode: str = "auto") -> str:
    """Turn a mode string into one of ``"pallas"``, ``"triton"``, ``"mosaic"``,
    ``"interpret"``, ``"mosaic_interpret"`` or ``"reference"``.

    Raises ``ValueError`` for an unknown name, or for a compiled mode this device cannot run.
    """
    mode = _check_name(mode, "mode")
    if mode == "auto":
        mode = _auto()[0]
    if mode in ("pallas", "triton"):
        ok, why = _gpu_support()
        if not ok:
            raise ValueError(f"mode={mode!r} cannot run here: {why}; use mode='interpret' to run the "
                             "Pallas kernels under the interpreter, or mode='auto'")
    if mode == "mosaic" and not mosaic_supported():
        raise ValueError(f"mode='mosaic' cannot run here: {_gpu()[1]} is not a Hopper GPU (compute "
                         "capability 9.x); use mode='mosaic_interpret' to run the Mosaic GPU kernels "
                         "under GPU interpret mode, or mode='pallas'")
    return mode


_TIER_LOGS: list = []   # sets filled by record_tiers() blocks


@contextlib.contextmanager
def record_tiers():
    """Collect the tiers that kernel calls traced inside the block chose: ``"triton"``,
    ``"mosaic"`` or ``"reference"`` (what ran, per call, fallbacks included). The probe uses it
    to report the tier of the programs it timed."""
    seen: set = set()
    _TIER_LOGS.append(seen)
    try:
        yield seen
    finally:
        _TIER_LOGS.remove(seen)


def tier(mode: str) -> str:
    """Which kernels a mode prefers here: ``"mosaic"``, ``"triton"`` or ``"reference"`` (for
    ``"pallas"``, the tier this device prefers; a call whose shape or dtype the Mosaic tier cannot
    take falls back to Triton: :func:`record_tiers` tells what ran)."""
    mode = _check_name(mode, "mode")
    if mode == "auto":
        mode = _auto()[0]
    if mode == "pallas":
        return compiled_tier() or "triton"
    return {"mosaic": "mosaic", "mosaic_interpret": "mosaic", "reference": "reference"}.get(mode, "triton")


@dataclasses.dataclass(frozen=True)
class Tier:
    """Which kernels one call runs: ``name`` is ``"reference"``, ``"triton"`` or ``"mosaic"``;
    ``interpret`` says whether under an interpreter; ``module`` is the Mosaic GPU kernel's module
    when ``name == "mosaic"`` (imported only then)."""

    name: str
    interpret: bool = False
    module: object = None


def choose_tier(mode: str, config, *, triton_config, mosaic: tuple, mosaic_problem) -> Tier:
    """The one place a kernel call's tier is decided (every public kernel function asks it).

    ``mode`` as the caller gave it; ``config``: None, a ``triton_config``, or the Mosaic tier's
    config (which picks that tier); ``mosaic``: ``(module name under pallas_kernels.mosaic, its
    config class's name)``, or None for a kernel with no Mosaic tier (the Mosaic modes refuse it); ``mosaic_problem(module, allow_copies)``: why the Mosaic tier cannot take
    this call (a one-line reason) or None; with ``allow_copies=False`` also a call it would run only
    by copying a weight or a cache to pad it to whole TMA tiles. The Mosaic module is imported, and ``mosaic_problem`` asked, only
    where the Mosaic tier is a candidate: modes ``"mosaic"``/``"mosaic_interpret"``, ``"pallas"``
    on a Hopper GPU, or a Mosaic config. ``"mosaic"``/``"mosaic_interpret"`` refuse a call the tier
    cannot take; ``"pallas"`` falls back to the Triton tier. Records the tier (:func:`record_tiers`).
    """
    mode = resolve_mode(mode)
    interpret = mode in ("interpret", "mosaic_interpret")
    if mosaic is None:   # a kernel with a Triton tier only: "pallas" runs it on every GPU
        if mode in ("mosaic", "mosaic_interpret"):
            other = "'interpret'" if mode == "mosaic_interpret" else "'pallas' or 'triton'"
            raise ValueError(f"mode={mode!r}: this kernel has no Mosaic GPU tier; use mode={other}")
        if config is not None and not isinstance(config, triton_config):
            raise ValueError(f"config must be a {triton_config.__name__} or None; got {type(config).__name__}")
        return _noted(Tier("reference") if mode == "reference" else Tier("triton", interpret))
    candidate = mode in ("mosaic", "mosaic_interpret") or (mode == "pallas" and compiled_tier() == "mosaic")
    module_name, config_name = mosaic
    if config is not None and not isinstance(config, triton_config):
        module = importlib.import_module(f"pallas_kernels.mosaic.{module_name}")
        if not isinstance(config, getattr(module, config_name)):
            raise ValueError(f"config must be a {triton_config.__name__} or a {config_name} (or None); "
                             f"got {type(config).__name__}")
        if mode != "reference":
            if not candidate:
                raise ValueError(f"config is a {config_name} but mode={mode!r} runs the Triton tier here; pass a "
                                 f"{triton_config.__name__}, or use mode='mosaic' on a Hopper-class GPU "
                                 "(or 'mosaic_interpret')")
            why = mosaic_problem(module, True)
            if why:
                raise ValueError(f"config is a {config_name} but {why}")
            return _noted(Tier("mosaic", interpret, module))
    if mode == "reference":
        return _noted(Tier("reference"))
    if isinstance(config, triton_config):
        if mode in ("mosaic", "mosaic_interpret"):
            raise ValueError(f"config is a {triton_config.__name__} but mode={mode!r} runs the Mosaic GPU tier; "
                             f"pass a {config_name} or None")
        return _noted(Tier("triton", interpret))
    if candidate:
        module = importlib.import_module(f"pallas_kernels.mosaic.{module_name}")
        # "pallas" prefers the Triton tier over a Mosaic run that must copy a weight or a cache
        why = mosaic_problem(module, mode != "pallas")
        if why is None:
            return _noted(Tier("mosaic", interpret, module))
        if mode in ("mosaic", "mosaic_interpret"):
            other = ("mode='interpret' (the Triton-style kernels, interpreted)" if mode == "mosaic_interpret"
                     else "mode='pallas' (falls back to the Triton tier) or mode='triton'")
            raise ValueError(f"mode={mode!r} cannot run this call: {why}; use {other}")
    return _noted(Tier("triton", interpret))


def _noted(tier: Tier) -> Tier:
    for seen in _TIER_LOGS:
        seen.add(tier.name)
    return tier


def describe() -> str:
    """One line: what ``"auto"`` resolves to on this machine, and why (a ValueError, as
    :func:`check_environment`, when ``PALLAS_KERNELS_MODE`` makes every call fail)."""
    chosen, why = _auto()
    return f'"auto" runs "{chosen}" kernels here: {why}'
