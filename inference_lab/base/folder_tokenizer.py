"""A Hugging Face model folder's tokenizer: ``tokenizer.json`` through the ``tokenizers`` library
(the fast Rust one every such model ships), and its chat template through jinja2, as vLLM and
``transformers`` render it.

    from inference_lab.base import folder_tokenizer
    tok = folder_tokenizer.load("models/SmolLM2-135M")
    ids = tok.encode("The capital of France is")              # BOS as the folder's post-processor adds it
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}])

It has the interface of the lab's byte-level tokenizer (:class:`~inference_lab.base.tokenizer.ByteTokenizer`),
so the server takes either: ``encode``/``decode``, ``eos_ids`` (every id that ends an
answer: ``generation_config.json``'s, else ``config.json``'s), ``stream()`` (text as tokens come),
``token_text``/``token_bytes`` and ``apply_chat_template``. Where a folder keeps each:

* ``tokenizer.json``: the vocabulary, merges, pre- and post-processing (required);
* ``generation_config.json`` / ``config.json``: ``bos_token_id``, ``eos_token_id``;
* ``chat_template.jinja``, else ``tokenizer_config.json``'s ``chat_template`` (a string, or a list
  of named templates: "default" is used), with that file's ``bos_token``/``eos_token`` strings.

A folder without a chat template serves completions only; a template that does not compile is
refused when the folder is read, not at the first chat request. Nothing downloads.
"""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

from inference_lab.base.config import ModelConfig

_SP_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")   # SentencePiece's byte-fallback pieces (Llama 2, Mistral)


def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the character each byte is written as in a byte-level
    BPE vocabulary (printable bytes as themselves, the rest shifted past U+0100)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, shifted = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + shifted)] = b
            shifted += 1
    return chars


_BYTE_OF_CHAR = _byte_of_char()


class FolderTokenizer:
    """A folder's tokenizer (:func:`load` makes one). ``encode(text, bos=True)`` adds what the
    tokenizer's own post-processor adds (Llama's ``<|begin_of_text|>``; Qwen2 adds nothing);
    ``decode`` drops special tokens, as an answer's text does."""

    def __init__(self, tokenizer, *, bos_id: int | None, eos_ids: tuple[int, ...], chat_template=None,
                 special_strings: dict | None = None, source: Path | None = None):
        from tokenizers import decoders

        self._tokenizer = tokenizer
        self.bos_id, self.eos_ids = bos_id, eos_ids
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.chat_template = chat_template            # a compiled jinja2 template, or None
        self._special_strings = special_strings or {}
        self._source = source
        self._special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
        self._byte_level = isinstance(tokenizer.decoder, decoders.ByteLevel)

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}; decode bytes first")
        return self._tokenizer.encode(text, add_special_tokens=bos).ids

    def decode(self, ids) -> str:
        known = [int(i) for i in ids if 0 <= int(i) < self.vocab_size]   # a random model draws past the tokenizer
        return self._tokenizer.decode(known, skip_special_tokens=True)

    def stream(self) -> "TokenStream":
        return TokenStream(self)

    def token_bytes(self, token: int) -> list[int]:
        """OpenAI's ``bytes`` field: the token's own bytes (a byte-level piece may hold part of a
        character), a special token's name as UTF-8, none for an id past the tokenizer's vocabulary."""
        piece = self._tokenizer.id_to_token(token) if 0 <= token < self.vocab_size else None
        if piece is None:
            return []
        if token in self._special:
            return list(piece.encode())
        if self._byte_level and all(c in _BYTE_OF_CHAR for c in piece):
            return [_BYTE_OF_CHAR[c] for c in piece]
        if m := _SP_BYTE.fullmatch(piece):
            return [int(m.group(1), 16)]
        return list(piece.replace("▁", " ").encode())

    def token_text(self, token: int) -> str:
        """The token's bytes decoded alone (part of a character shows as U+FFFD)."""
        return bytes(self.token_bytes(token)).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        """``messages`` rendered by the folder's chat template with the assistant's turn opened
        (``add_generation_prompt``), then tokenized without adding special tokens (the template
        writes its own BOS), as vLLM does. A ValueError names what is wrong: no template, or the
        template's own refusal (roles that do not alternate, say)."""
        import jinja2

        if self.chat_template is None:
            raise ValueError(f"{self._source}: this model has no chat template (neither chat_template.jinja nor "
                             "tokenizer_config.json's chat_template); use /v1/completions")
        try:
            text = self.chat_template.render(messages=messages, add_generation_prompt=True, tools=None,
                                             documents=None, **self._special_strings)
        except jinja2.TemplateError as err:   # raise_exception(...) in the template, or the sandbox
            raise ValueError(f"the model's chat template refused the messages: {str(err)[:200]}") from None
        except Exception as err:   # the template's own code failed on these messages (a TypeError, ...)
            raise ValueError(f"the model's chat template failed on these messages ({type(err).__name__}: "
                             f"{str(err)[:150]})") from None
        return self.encode(text, bos=False)


class TokenStream:
    """Text as token ids come, decoded as vLLM decodes incrementally: the tokens since the last
    text sent, with one token of context before them (so a tokenizer that strips a leading space
    strips it from both), decoded again at each step; the new text goes out once it does not end
    in U+FFFD (a character still partial). Special tokens and ids past the tokenizer's vocabulary
    (a random model can draw them) add nothing. ``flush()``: what is held at the end, a cut
    character as U+FFFD, so the streamed pieces always join into ``decode`` of all the tokens."""

    def __init__(self, tokenizer: FolderTokenizer):
        self._decode = tokenizer.decode
        self._tokens: list[int] = []
        self._context = 0      # the tokens from here on are decoded at each step
        self._sent = 0         # the text of the tokens before this has gone out

    def _new_text(self) -> str:
        before = self._decode(self._tokens[self._context:self._sent])
        return self._decode(self._tokens[self._context:])[len(before):]

    def step(self, token: int) -> str:
        self._tokens.append(int(token))
        text = self._new_text()
        if text.endswith("\ufffd"):   # a character still partial: wait for the rest of it
            return ""
        # sent (even when empty: a special token's nothing), so the window decoded stays a few tokens
        self._context, self._sent = self._sent, len(self._tokens)
        return text

    def flush(self) -> str:
        text = self._new_text()
        self._context = self._sent = len(self._tokens)
        return text


# ----------------------------------------------------------------------------- reading a folder
def _read_json(file: Path) -> dict:
    try:
        data = json.loads(file.read_text()) if file.is_file() else {}
    except (OSError, ValueError) as err:
        raise ValueError(f"{file}: not readable JSON ({str(err)[:100]}); fetch the folder again") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file}: holds {type(data).__name__}, not a JSON object; fetch the folder again")
    return data


def _ids(value, where: Path, key: str) -> tuple[int, ...]:
    ids = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError(f"{where}: {key}={value!r} must be a token id or a list of them")
    return tuple(ids)


def _special_string(value) -> str | None:
    """A tokenizer_config.json special token: a string, or an AddedToken written as {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(folder: Path, config: dict):
    """The folder's chat template, compiled as ``transformers`` compiles it (a sandbox, blocks
    trimmed, ``raise_exception`` and ``strftime_now`` available), or None."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    source, where = None, folder / "chat_template.jinja"
    if where.is_file():
        try:
            source = where.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"{where}: not readable ({err}); fetch the folder again") from None
    else:
        where, source = folder / "tokenizer_config.json", config.get("chat_template")
        if isinstance(source, list):   # named templates: [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if source is not None and not isinstance(source, str):
            raise ValueError(f"{where}: chat_template must be a string (or named templates with a \"default\")")
    if source is None:
        return None

    def raise_exception(message):
        raise jinja2.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateError as err:
        raise ValueError(f"{where}: the chat template does not compile ({str(err)[:100]}); fetch the folder "
                         "again") from None


def load(folder, cfg: ModelConfig | None = None) -> FolderTokenizer:
    """The tokenizer of ``folder`` (the module docstring says which file holds what). With ``cfg``
    (the folder's ``model.huggingface.read_config``), a tokenizer whose ids reach past the model's
    vocabulary is refused: those ids would index past the embedding."""
    from tokenizers import Tokenizer

    folder = Path(folder).expanduser()
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"{path}: missing; the lab reads the fast tokenizer's tokenizer.json (fetch it with the "
                         "folder; a folder with only tokenizer.model needs converting with transformers once)")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:   # tokenizers raises its own Exception for a damaged file
        raise ValueError(f"{path}: not a readable tokenizer ({str(err)[:100]}); fetch it again") from None
    ids = {}
    for name in ("generation_config.json", "config.json"):
        data = _read_json(folder / name)
        for key in ("bos_token_id", "eos_token_id"):
            if key not in ids and data.get(key) is not None:
                ids[key] = _ids(data[key], folder / name, key)
    config = _read_json(folder / "tokenizer_config.json")
    strings = {key: _special_string(config.get(key)) for key in ("bos_token", "eos_token", "unk_token", "pad_token")}
    result = FolderTokenizer(tokenizer, bos_id=(ids.get("bos_token_id") or (None,))[0],
                             eos_ids=ids.get("eos_token_id", ()), chat_template=_chat_template(folder, config),
                             special_strings={k: v for k, v in strings.items() if v is not None}, source=folder)
    if cfg is not None and result.vocab_size > cfg.vocab_size:
        raise ValueError(f"{path}: {result.vocab_size} token ids, past the model's vocab_size={cfg.vocab_size} in "
                         "config.json; the tokenizer belongs to another model")
    return result


# ----------------------------------------------------------------------------- the lab's tokenizer as a folder's
BYTE_SPECIALS = ("<|bos|>", "<|eos|>", "<|pad|>")     # ids 256, 257, 258: tokenizer.BOS, EOS, PAD
# the Shakespeare models' dialogue (ByteTokenizer.apply_chat_template) as a chat template
BYTE_CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] | upper }}:\n{{ m['content'] }}\n\n"
                      "{% endfor %}{% if add_generation_prompt %}ASSISTANT:\n{% endif %}")


def save_byte_tokenizer(folder) -> None:
    """The lab's byte-level tokenizer (:mod:`inference_lab.base.tokenizer`) written as a folder's:
    ``tokenizer.json`` (a byte-level BPE with no merges, so one token a byte, ids 0..255, and the
    three special tokens after them), ``tokenizer_config.json`` with the Shakespeare dialogue as a
    chat template, ``generation_config.json`` with BOS and EOS. :func:`load`, ``transformers`` and
    vLLM then tokenize as the lab does (but for text that spells a special token's name: ``<|bos|>``
    becomes that token there, as in every Hugging Face tokenizer, and five bytes here)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    from inference_lab.base import tokenizer as byte_tokenizer

    folder = Path(folder)
    tok = Tokenizer(models.BPE(vocab={c: b for c, b in _BYTE_OF_CHAR.items()}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in BYTE_SPECIALS])
    tok.post_processor = processors.TemplateProcessing(single=f"{BYTE_SPECIALS[0]} $A",
                                                       special_tokens=[(BYTE_SPECIALS[0], byte_tokenizer.BOS)])
    tok.save(str(folder / "tokenizer.json"))
    bos, eos, pad = BYTE_SPECIALS
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos, "pad_token": pad,
        "chat_template": BYTE_CHAT_TEMPLATE}, indent=2) + "\n")
    (folder / "generation_config.json").write_text(json.dumps({
        "bos_token_id": byte_tokenizer.BOS, "eos_token_id": byte_tokenizer.EOS,
        "pad_token_id": byte_tokenizer.PAD}, indent=2) + "\n")

