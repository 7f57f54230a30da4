"""From a request's tokens to the text a client reads: the tokenizer's incremental decoding, and
stop strings. Host logic only (no jax).

A character may take several tokens (the byte-level tokenizer makes one token a byte; a BPE
vocabulary splits the characters its merges never saw): the text grows through the tokenizer's
``stream()``, which gives only whole characters. A **stop string** ends the request where it
first appears (OpenAI's semantics: the stop string itself is not part of the text, and the
finish reason is ``"stop"``). A streamed answer may not send text that could turn out to be the
beginning of a stop string, so :class:`TextStream` holds back the longest ending of the text that
begins one, and sends it on once it cannot (or when the request ends).
"""

from __future__ import annotations


class TextStream:
    """One choice's text, token by token: ``feed(token, last)`` returns the text that may be sent
    now; ``stopped`` is True once a stop string appeared (the text ends before it; feed nothing
    more). ``skip``: tokens whose text is not shown (the tokens that end the request: end-of-sequence
    and its stop tokens); ``min_tokens``: no stop string is looked for before this many
    tokens have come. ``tokenizer``: the served model's (its ``stream()`` gives the text)."""

    def __init__(self, tokenizer, stops=(), skip=(), min_tokens: int = 0):
        self.stops = tuple(stops)
        self.skip = set(skip)
        self.min_tokens = int(min_tokens)
        self.decoder = tokenizer.stream()
        self.held = ""          # text not sent yet: it could be the start of a stop string
        self.tokens = 0
        self.stopped = False

    def feed(self, token: int, last: bool = False) -> str:
        """The text to send after ``token`` (``last``: the request's last token: flush everything)."""
        self.tokens += 1
        if token not in self.skip:
            self.held += self.decoder.step(token)
        if last:
            self.held += self.decoder.flush()
        if self.stops and self.tokens >= self.min_tokens:
            found = [(self.held.find(s), s) for s in self.stops if s in self.held]
            if found:
                at = min(found)[0]
                out, self.held, self.stopped = self.held[:at], "", True
                return out
        if last:
            out, self.held = self.held, ""
            return out
        keep = self._hold_back()
        out, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        return out

    def _hold_back(self) -> int:
        """Characters at the end of the held text that begin some stop string (they may not go yet)."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.held)), best, -1):
                if s.startswith(self.held[-n:]):
                    best = n
                    break
        return best
