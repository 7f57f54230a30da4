"""A byte-level tokenizer: text in, text out, no vocabulary file and no downloads.

Ids 0..255 are the UTF-8 bytes of the text; three special ids follow them:
``BOS = 256`` (start of a prompt), ``EOS = 257`` and ``PAD = 258``. Every preset has
``vocab_size >= 259``; ids above 258 exist in the model's vocabulary (the presets round it
up to the shapes they mirror) but never come out of :func:`encode`. A randomly initialised
model can still *generate* them: :func:`decode` skips every id that is not a byte, and
replaces invalid UTF-8 sequences with U+FFFD, so decoding never fails.
"""

from __future__ import annotations

import codecs

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
    """The byte-level tokenizer as an object, with the interface every tokenizer the server uses
    has (a Hugging Face folder's too: ``base.folder_tokenizer.FolderTokenizer``): ``encode``/``decode``,
    ``eos_ids`` (what ends an answer), ``stream()`` (text as tokens come), ``token_text``/
    ``token_bytes`` (a token's own text and bytes, as a log-probability entry names it) and
    ``apply_chat_template`` (the Shakespeare models' dialogue format)."""

    bos_id, eos_id, pad_id = BOS, EOS, PAD
    eos_ids = (EOS,)
    vocab_size = MIN_VOCAB

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        return encode(text, bos=bos)

    def decode(self, ids) -> str:
        return decode(ids)

    def stream(self) -> "ByteStream":
        return ByteStream()

    def token_bytes(self, token: int) -> list[int]:
        """OpenAI's ``bytes`` field: the one byte, or none for a special id."""
        return [token] if 0 <= token < BYTES else []

    def token_text(self, token: int) -> str:
        """Its byte decoded alone (a byte of a longer character shows as U+FFFD); "" for a special id."""
        return bytes(self.token_bytes(token)).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        """Messages (``{"role", "content"}`` dicts, checked by the caller) as the Shakespeare models
        know dialogue, ``ROLE:\ncontent\n\n`` each, then the assistant's turn opened; BOS first."""
        text = "".join(f"{m['role'].upper()}:\n{m['content']}\n\n" for m in messages)
        return encode(text + "ASSISTANT:\n")


class ByteStream:
    """Text as byte ids come: ``step(token)`` returns the characters it completes (a character
    may take several bytes), ``flush()`` what is left at the end (U+FFFD for a cut character)."""

    def __init__(self):
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def step(self, token: int) -> str:
        return self.decoder.decode(bytes([token]) if 0 <= token < BYTES else b"")

    def flush(self) -> str:
        return self.decoder.decode(b"", final=True)
