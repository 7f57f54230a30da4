"""The step timeline: every iteration the engine ran, what it held and what it cost.

A latency spike in a trace is one step that took long. Which step, and why? Each
:class:`StepRecord` says what the iteration computed (decode rows, prompt tokens in how many
chunks, the compiled shape that padded them), the memory it held (KV blocks in use, requests
waiting), the cost the engine's measured step costs predicted for its shape, and the time it
took on this machine. Put beside a trace's inter-token gaps (notebook 09), the gap a client saw
is the step that made it, and its record names the cause: a big prefill chunk beside the decode
rows, a verify step, a host stall the prediction did not expect.

Off by default (``Engine(step_timeline=N)``, the server's ``--step-timeline N``): the engine then
keeps the last ``N`` records, ``GET /debug/steps`` serves them, and :meth:`Timeline.save` writes
them as JSON lines.

The measured time of a step is how long after the step before it its tokens reached the host
(``end - max(start, previous end)``): with async scheduling the device runs the steps back to
back, so this is the device's time for it, plus whatever the host added when it was late.
"""

from __future__ import annotations

import collections
import dataclasses
import json


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One iteration. ``start``/``end``: when it was dispatched and when its tokens reached the host
    (:func:`~inference_lab.serving.requests.now`, the clock of every token event);
    ``kind``: ``"step"`` (the forward of decode rows and prompt chunks) or ``"verify"`` (speculative
    decoding's check); ``shape``: the compiled program (decode width, chunk tokens); ``budget``:
    the token budget the scheduler had for it; ``predicted_s``: the measured cost of its shape
    (None when the engine did not measure its steps); ``seconds``: what it took here."""

    iteration: int
    start: float
    end: float
    seconds: float
    kind: str
    decode_rows: int
    prompt_tokens: int
    chunks: int
    shape: tuple
    budget: int
    blocks_used: int | None
    waiting: int
    predicted_s: float | None

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["shape"] = list(self.shape)
        return out


class Timeline:
    """The last ``size`` :class:`StepRecord` s (a bounded deque: memory stays flat however long the
    server runs). Written by the engine's thread, read by any: a read copies under the GIL."""

    def __init__(self, size: int):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"step_timeline={size!r} must be a positive number of steps to keep")
        self._records: collections.deque[StepRecord] = collections.deque(maxlen=size)
        self._last_end = None

    def add(self, iteration: int, start: float, end: float, **fields) -> StepRecord:
        """Record an iteration that ran from ``start`` (dispatch) to ``end`` (its tokens on the host)."""
        began = start if self._last_end is None else max(start, self._last_end)
        self._last_end = end
        record = StepRecord(iteration, start, end, end - began, **fields)
        self._records.append(record)
        return record

    def records(self) -> list[StepRecord]:
        return list(self._records)

    def as_json(self) -> list[dict]:
        return [r.as_dict() for r in self.records()]

    def save(self, path) -> int:
        """The records as JSON lines into ``path``; returns how many."""
        records = self.as_json()
        with open(path, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        return len(records)
