"""Serving workloads: when requests arrive and how long their prompts and answers are.

Seeded Poisson arrivals; prompt and output lengths as constants, ranges or any distribution
(a callable). RAG traffic reads far more than it writes: :data:`RAG_RATIO`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from inference_lab.base import checks


__all__ = ["Requests", "sample_requests", "RAG_RATIO"]

MAX_TOKENS = 1 << 20   # a prompt or an answer this long is a typo: the simulator would run for hours

RAG_RATIO = (19, 47)
"""Prompt:generation token ratios of RAG traffic measured on a 27B model served on 4xH100
(the course's reference node)."""


@dataclasses.dataclass(frozen=True)
class Requests:
    """A workload: per-request arrival time (s), prompt length and output length (tokens)."""

    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray

    def __post_init__(self):
        """Hand-made workloads are checked as drawn ones are: one entry per request in each
        array, finite arrivals >= 0, lengths that are whole numbers in 1..MAX_TOKENS."""
        arrays = {}
        for name in ("arrival", "prompt_len", "output_len"):
            a = np.asarray(getattr(self, name))
            if a.ndim != 1 or not np.issubdtype(a.dtype, np.number) or a.dtype == bool:
                raise ValueError(f"Requests.{name} must be a 1-D array of numbers, got {a.dtype} of shape {a.shape}")
            arrays[name] = a
        n = {len(a) for a in arrays.values()}
        if len(n) != 1:
            raise ValueError(f"Requests: arrival, prompt_len and output_len have "
                             f"{', '.join(str(len(a)) for a in arrays.values())} entries; give one per request")
        if not np.isfinite(arrays["arrival"]).all() or (arrays["arrival"] < 0).any():
            raise ValueError("Requests.arrival must be finite times >= 0 (seconds)")
        for name in ("prompt_len", "output_len"):
            a = arrays[name]
            if not np.isfinite(a).all() or (a != np.round(a)).any() or (a < 1).any() or (a > MAX_TOKENS).any():
                raise ValueError(f"Requests.{name} must be whole numbers of tokens in 1..{MAX_TOKENS:,}")
        for name, a in arrays.items():
            object.__setattr__(self, name, a if name == "arrival" else a.astype(np.int64))

    def __len__(self):
        return len(self.arrival)


def _draw(name, spec, rng, n):
    """int -> constant; (lo, hi) -> uniform integers in [lo, hi]; callable(rng, n) -> array."""
    if callable(spec):
        out = np.asarray(spec(rng, n))
    elif isinstance(spec, tuple) and len(spec) == 2:
        lo, hi = spec
        if not (isinstance(lo, (int, np.integer)) and isinstance(hi, (int, np.integer)) and 1 <= lo <= hi):
            raise ValueError(f"{name}={spec!r}: a range must be two integers 1 <= lo <= hi")
        out = rng.integers(lo, hi + 1, size=n)
    elif isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        out = np.full(n, spec)
    else:
        raise ValueError(f"{name}={spec!r}: pass an int, a (lo, hi) range or a callable(rng, n)")
    out = np.rint(out).astype(np.int64)
    if out.shape != (n,) or (out < 1).any():
        raise ValueError(f"{name} must give {n} integers >= 1")
    return out


def sample_requests(n_requests: int, rate: float, *, prompt_len=512, output_len=(32, 128),
                    ratio: tuple[float, float] | None = None, seed: int = 0) -> Requests:
    """Poisson arrivals at ``rate`` requests/s with drawn lengths.

    ``prompt_len``/``output_len``: an int (every request the same), a ``(lo, hi)`` range
    (uniform integers, both ends included) or a ``callable(rng, n)`` returning ``n`` lengths.

    ``ratio=(lo, hi)``: prompt length = output length x a uniform ratio in ``[lo, hi]``
    (``RAG_RATIO`` = 19:1 to 47:1), replacing ``prompt_len``. Same seed, same workload.
    """
    n = checks.count("n_requests", n_requests)
    rate = checks.positive("rate", rate)
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate, size=n))
    out = _draw("output_len", output_len, rng, n)
    if ratio is not None:
        lo, hi = ratio
        if not 0 < lo <= hi:
            raise ValueError(f"ratio={ratio!r} must be (lo, hi) with 0 < lo <= hi, e.g. {RAG_RATIO}")
        prompt = np.maximum(1, np.rint(out * rng.uniform(lo, hi, size=n))).astype(np.int64)
    else:
        prompt = _draw("prompt_len", prompt_len, rng, n)
    return Requests(arrival, prompt, out)
