"""From a request's tokens to the text a client reads: UTF-8 decoding as the bytes come, stop
strings, and each token's text for its log-probabilities. Host logic only (no jax).

The byte-level tokenizer makes one token a byte, so a character may take several tokens: the
text grows through an incremental UTF-8 decoder. A **stop string** ends the request where it
first appears (OpenAI's semantics: the stop string itself is not part of the text, and the
finish reason is ``"stop"``). A streamed answer may not send text that could turn out to be the
beginning of a stop string, so :class:`TextStream` holds back the longest ending of the text that
begins one, and sends it on once it cannot (or when the request ends).
"""

from __future__ import annotations

import codecs

from inference_lab.base import tokenizer


class TextStream:
    """One choice's text, token by token: ``feed(token, last)`` returns the text that may be sent
    now; ``stopped`` is True once a stop string appeared (the text ends before it; feed nothing
    more). ``skip``: tokens whose text is not shown (the request's stop tokens: they end it as
    end-of-sequence does, unseen); ``min_chars``: no stop string is looked for before this many
    characters of text have come (``min_tokens``: with one byte a token, a lower bound in characters)."""

    def __init__(self, stops=(), skip=(), min_tokens: int = 0):
        self.stops = tuple(stops)
        self.skip = set(skip)
        self.min_tokens = int(min_tokens)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.held = ""          # text not sent yet: it could be the start of a stop string
        self.tokens = 0
        self.stopped = False

    def feed(self, token: int, last: bool = False) -> str:
        """The text to send after ``token`` (``last``: the request's last token: flush everything)."""
        self.tokens += 1
        shown = token not in self.skip and 0 <= token < tokenizer.BYTES
        self.held += self.decoder.decode(bytes([token]) if shown else b"", final=last)
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


def token_text(token: int) -> str:
    """One token's own text, as a log-probability entry names it: its byte decoded alone (a byte
    of a longer character shows as U+FFFD), "" for the special tokens."""
    return bytes([token]).decode("utf-8", errors="replace") if 0 <= token < tokenizer.BYTES else ""


def token_bytes(token: int) -> list:
    """A token's bytes (OpenAI's ``bytes`` field): one byte, or none for a special token."""
    return [token] if 0 <= token < tokenizer.BYTES else []
