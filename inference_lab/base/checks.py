"""The argument checks every public entry point of the lab runs, in one place.

Each raises a one-line ``ValueError`` that names the argument and says what would be accepted,
before any work starts. They are deliberately strict: a bool is not a count (``True`` would
pass as 1), a float is not a count (a batch of 2.5 is a bug), NaN and infinity are not numbers.

The tensor-parallel rule lives here too, once: the roofline that predicts a split and the
mechanism that performs it (``inference_lab.model.parallel``) accept the same degrees.
"""

from __future__ import annotations

import math
import numbers


def count(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``: ints and NumPy integers pass; bools, floats and
    strings do not."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")
    value = value.__index__()
    if value < minimum:
        raise ValueError(f"{name}={value} must be an integer >= {minimum}")
    return value


def positive(name: str, value) -> float:
    """``value`` as a finite float > 0 (not a bool, not NaN, not infinity)."""
    if not is_positive(value):
        raise ValueError(f"{name}={value!r} must be a positive finite number")
    return float(value)


def finite(name: str, value, low: float = -math.inf, high: float = math.inf) -> float:
    """``value`` as a finite float in ``low..high`` (not a bool, not a string, not NaN)."""
    if (not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value)
            or not low <= value <= high):
        bounds = "" if (low, high) == (-math.inf, math.inf) else f" in {low:g}..{high:g}"
        raise ValueError(f"{name}={value!r} must be a finite number{bounds}")
    return float(value)


def flag(name: str, value) -> bool:
    """``value`` as a bool: only True or False (``"no"`` is truthy, ``1`` is ambiguous)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be True or False")
    return value


MAX_SEED = 2**64 - 1


def seed(name: str, value) -> int:
    """A random seed: an integer in 0..2**64 - 1, every bit of which counts (``generation.seed_key``)."""
    if isinstance(value, bool) or not hasattr(value, "__index__") or not 0 <= value.__index__() <= MAX_SEED:
        raise ValueError(f"{name}={value!r} must be an integer in 0..2**64 - 1")
    return value.__index__()


def is_positive(value) -> bool:
    """True for a finite real number > 0 that is not a bool."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
            and value > 0)


def model_config(cfg) -> None:
    """``cfg`` must be a ModelConfig (or have its fields): the analytic layer reads only these."""
    for field in ("n_layers", "n_heads", "n_kv_heads", "head_dim", "d_model", "vocab_size", "d_ff",
                  "matmul_params", "dtype_bytes"):
        if not hasattr(cfg, field):
            raise ValueError(f"cfg={cfg!r} is not a ModelConfig (it lacks {field!r}); "
                             "pass inference_lab.base.config.ModelConfig.preset(name)")


def hardware_spec(spec) -> None:
    """``spec`` must be a HardwareSpec (or have ``peak_flops`` and ``bandwidth``)."""
    if not (hasattr(spec, "peak_flops") and hasattr(spec, "bandwidth")):
        raise ValueError(f"spec={spec!r} is not a HardwareSpec; pass hardware.PRESETS[name] or "
                         "hardware.measure_ceilings()")


# ----------------------------------------------------------------------------- tensor parallelism
# What the Megatron split cuts (inference_lab.model.parallel.PARTITION): each device needs whole KV
# heads (with their query heads), an equal slice of the vocabulary (embedding rows, head columns)
# and of the MLP's hidden size.
_TP_SPLITS = ("n_kv_heads", "n_heads", "vocab_size", "d_ff")


def tp_degrees(cfg) -> list:
    """Every tensor-parallel degree that splits ``cfg`` into whole heads and equal slices."""
    model_config(cfg)
    n = min(getattr(cfg, f) for f in _TP_SPLITS)
    return [t for t in range(1, n + 1) if not any(getattr(cfg, f) % t for f in _TP_SPLITS)]


def tensor_parallel(cfg, tp, n_devices: int | None = None) -> int:
    """``tp`` as an int, or a one-line ValueError saying why it cannot split ``cfg``: it must
    divide ``n_kv_heads`` (each device holds whole KV heads; fewer KV heads than devices is an
    error, not a silent replication), ``n_heads``, ``vocab_size`` and ``d_ff``, and not exceed
    ``n_devices`` when given. The roofline and the mechanism both ask this function."""
    model_config(cfg)
    tp = count("tp", tp)
    bad = [f"{f}={getattr(cfg, f)}" for f in _TP_SPLITS if getattr(cfg, f) % tp]
    if bad:
        raise ValueError(f"tp={tp} does not divide {', '.join(bad)} of preset {getattr(cfg, 'name', '?')!r} "
                         f"(each device needs whole KV heads and equal slices); choose tp in {tp_degrees(cfg)}")
    if n_devices is not None and tp > n_devices:
        raise ValueError(too_few_devices(tp, n_devices))
    return tp


def too_few_devices(tp: int, n: int, backend: str = "jax") -> str:
    """The message for a tensor-parallel degree larger than the devices there are."""
    return (f"tp={tp} needs {tp} devices but {backend} sees {n}; on a CPU simulate them by setting "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={tp} before jax is imported (or "
            "jax.config.update('jax_num_cpu_devices', N) before any jax operation)")


def sampling(temperature, top_k, vocab: int):
    """``top_k`` as an int or None, after checking both sampling arguments: a temperature >= 0
    (0 is greedy) and a top-k of None (every token) or 1..``vocab``."""
    if (isinstance(temperature, bool) or not isinstance(temperature, numbers.Real)
            or not math.isfinite(temperature) or temperature < 0):
        raise ValueError(f"temperature={temperature!r} must be a number >= 0 (0 means greedy)")
    if top_k is not None:
        if isinstance(top_k, bool) or not hasattr(top_k, "__index__") or not 1 <= top_k.__index__() <= vocab:
            raise ValueError(f"top_k={top_k!r} must be None or an integer in 1..{vocab}")
        top_k = top_k.__index__()
    return top_k


def probability_cuts(top_p, min_p) -> tuple:
    """``(top_p, min_p)`` after their checks: None (off), or ``top_p`` in (0, 1] and ``min_p`` in
    [0, 1) (1 and 0 mean off as well)."""
    for name, value, ok, bounds in (("top_p", top_p, lambda v: 0 < v <= 1, "in (0, 1]"),
                                    ("min_p", min_p, lambda v: 0 <= v < 1, "in [0, 1)")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)
                                  or not math.isfinite(value) or not ok(value)):
            raise ValueError(f"{name}={value!r} must be None or a number {bounds}")
    return (None if top_p is None or top_p == 1 else float(top_p),
            None if min_p is None or min_p == 0 else float(min_p))


MAX_LOGPROBS = 20   # alternatives a token may carry (OpenAI's top_logprobs bound); a step computes this many


def logprobs(value) -> int | None:
    """None (no log-probabilities), or how many alternatives beside the chosen token: 0..MAX_LOGPROBS."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS):
        raise ValueError(f"logprobs={value!r} must be None or an integer in 0..{MAX_LOGPROBS}")
    return value


def token_ids(name: str, ids, vocab: int) -> list[int]:
    """``ids`` as a list of ints: a non-empty list, tuple or 1-D array of integer token ids (no
    bools, no strings) inside the vocabulary 0..``vocab - 1``."""
    if isinstance(ids, str) or not isinstance(ids, (list, tuple)) and not hasattr(ids, "tolist"):
        raise ValueError(f"{name} is {type(ids).__name__}; give a list of token ids (tokenizer.encode(text))")
    values = list(ids.tolist() if hasattr(ids, "tolist") else ids)
    if not values:
        raise ValueError(f"{name} is empty; give at least one token id")
    if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in values):
        raise ValueError(f"{name} holds a value that is not an integer token id: {values[:8]}")
    bad = [t for t in values if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"{name} holds ids such as {bad[0]} outside the vocabulary 0..{vocab - 1}")
    return [int(t) for t in values]
