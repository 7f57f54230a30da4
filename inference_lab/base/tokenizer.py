"""A byte-level tokenizer: text in, text out, no vocabulary file and no downloads.

Ids 0..255 are the UTF-8 bytes of the text; three special ids follow them:
``BOS = 256`` (start of a prompt), ``EOS = 257`` and ``PAD = 258``. Every preset has
``vocab_size >= 259``; ids above 258 exist in the model's vocabulary (the presets round it
up to the shapes they mirror) but never come out of :func:`encode`. A randomly initialised
model can still *generate* them: :func:`decode` skips every id that is not a byte, and
replaces invalid UTF-8 sequences with U+FFFD, so decoding never fails.
"""

from __future__ import annotations

BYTES = 256   # ids 0..BYTES - 1 are bytes
BOS = 256
EOS = 257
PAD = 258
N_SPECIAL = 3
MIN_VOCAB = 256 + N_SPECIAL


def encode(text: str, *, bos: bool = True) -> list[int]:
    """``text`` -> its UTF-8 bytes as ids, preceded by ``BOS`` unless ``bos=False``."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}; decode bytes first")
    ids = list(text.encode("utf-8"))
    return [BOS] + ids if bos else ids


def decode(ids) -> str:
    """Ids -> text: byte ids (0..255) are joined and UTF-8 decoded; every other id is skipped."""
    data = bytes(int(i) for i in ids if 0 <= int(i) < BYTES)
    return data.decode("utf-8", errors="replace")


class ByteTokenizer:
    """The same two functions as an object, for code that expects ``tok.encode``/``tok.decode``."""

    bos_id, eos_id, pad_id = BOS, EOS, PAD
    vocab_size = MIN_VOCAB

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        return encode(text, bos=bos)

    def decode(self, ids) -> str:
        return decode(ids)
