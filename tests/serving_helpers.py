"""What the serving tests share (tests/test_engine_loop.py, test_serving_engine.py,
test_serving_faults.py): the model they serve, the prompts whose greedy text generate() writes,
and a listener that collects an engine's events."""

from __future__ import annotations

import threading

from inference_lab.base import tokenizer

PRESET = "shakespeare"   # the trained 1.7M-parameter model: quick to compile, the same code as the larger one
PROMPTS = ["MENENIUS:\n", "ROMEO:\nBut soft, what light", "First Citizen:\nBefore we proceed any further, hear me speak.\n"]
LENGTHS = [30, 12, 45]


def load():
    from inference_lab.model import pretrained
    return pretrained.load(preset=PRESET)


def generated(model) -> list[str]:
    """What generate() writes, greedy, for each of PROMPTS."""
    from inference_lab.runtime import generation
    return [generation.generate(model, p, max_new_tokens=n) for p, n in zip(PROMPTS, LENGTHS)]


class Listener:
    """Collects every event by request; ``wait(n)`` until ``n`` requests have ended."""

    def __init__(self):
        self.events, self.ended = {}, threading.Semaphore(0)

    def __call__(self, e):
        self.events.setdefault(e.rid, []).append(e)
        if e.finish:
            self.ended.release()

    def wait(self, n, timeout=60):
        assert all(self.ended.acquire(timeout=timeout) for _ in range(n)), f"ended: {self.finishes()}"

    def text(self, rid):
        return tokenizer.decode([e.token for e in self.events[rid] if e.token >= 0])

    def finishes(self):
        return {rid: ev[-1].finish for rid, ev in self.events.items() if ev[-1].finish}
