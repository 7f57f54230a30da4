"""A Hugging Face folder's tokenizer (inference_lab.base.folder_tokenizer): a byte-level BPE trained
in the test, its ids, streamed text, token bytes and chat template, compared with `transformers`'
own tokenizer when the optional `hf` extra is installed; and every bad file refused by name."""

from __future__ import annotations

import pytest

import hf_checkpoints as hf
from inference_lab.base import folder_tokenizer, tokenizer
from inference_lab.model import huggingface
from inference_lab.runtime.generation import generate

TEXT = "To be, or not to be: whether 'tis nobler! Naïve café — 東京 🎭"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "To be?"}]


def _folder(tmp_path, **tokenizer_args):
    c = hf.config("llama")
    folder = hf.write(tmp_path, c, hf.tensors(c))
    hf.write_tokenizer(folder, **tokenizer_args)
    return folder, c


def test_the_folders_tokenizer_round_trips_and_ends_where_generation_config_says(tmp_path):
    folder, c = _folder(tmp_path, generation_config={"bos_token_id": 1, "eos_token_id": [2, 0]})
    cfg = huggingface.read_config(folder)
    tok = folder_tokenizer.load(folder, cfg)
    ids = tok.encode(TEXT)
    assert ids[0] == 1 and tok.encode(TEXT, bos=False) == ids[1:]
    assert len(ids) < len(TEXT.encode()), "the merges it learned shorten the text"
    assert tok.decode(ids) == TEXT
    assert (tok.bos_id, tok.eos_ids, tok.vocab_size) == (1, (2, 0), 280)
    # without generation_config.json, config.json's ids
    (folder / "generation_config.json").unlink()
    assert folder_tokenizer.load(folder).eos_ids == (c["eos_token_id"],)
    # the model reads those ids: its greedy tokens from the tokenized prompt equal the float64 forward's
    model = huggingface.load(folder)
    assert generate(model, [ids], max_new_tokens=8)[0] == hf.greedy(c, hf.tensors(c), ids, 8)


def test_streamed_text_equals_the_whole_decode_and_never_shows_half_a_character(tmp_path):
    """Characters of several bytes come as several byte tokens here (the merges never saw them):
    each step gives only whole characters, and together they are the text."""
    tok = folder_tokenizer.load(_folder(tmp_path)[0])
    ids = tok.encode(TEXT)
    stream = tok.stream()
    pieces = [stream.step(t) for t in ids] + [stream.flush()]
    assert "".join(pieces) == TEXT
    assert not any("\ufffd" in p for p in pieces)
    assert "" in pieces, "some token ends inside a character: its step waits for the rest"
    # a long run of tokens with no text (a random model's ids past the vocabulary) keeps the window short
    stream = tok.stream()
    assert [stream.step(299) for _ in range(50)] == [""] * 50 and len(stream._tokens) - stream._context <= 1
    assert "".join(stream.step(t) for t in ids) + stream.flush() == TEXT
    # special tokens and ids past the tokenizer's vocabulary (a random model draws them) add nothing
    stream = tok.stream()
    assert [stream.step(t) for t in (1, 2, 279 + 5, 299)] == ["", "", "", ""]


def test_token_bytes_are_the_texts_bytes_and_name_special_tokens(tmp_path):
    tok = folder_tokenizer.load(_folder(tmp_path)[0])
    ids = tok.encode(TEXT, bos=False)
    assert b"".join(bytes(tok.token_bytes(t)) for t in ids) == TEXT.encode()
    partial = next(t for t in ids if len(tok.token_bytes(t)) == 1 and tok.token_bytes(t)[0] >= 0x80)
    assert tok.token_text(partial) == "\ufffd"
    assert (tok.token_text(2), tok.token_bytes(2)) == ("</s>", list(b"</s>"))
    assert tok.token_bytes(290) == [] and tok.token_text(290) == ""


def test_the_chat_template_renders_as_transformers_does(tmp_path):
    folder, _ = _folder(tmp_path)
    tok = folder_tokenizer.load(folder)
    ids = tok.apply_chat_template(MESSAGES)
    expected = ("<s><|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nTo be?<|im_end|>\n"
                "<|im_start|>assistant\n")
    assert ids == tok.encode(expected, bos=False) and ids[:2] == [1, 3]
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    assert reference.encode(TEXT) == tok.encode(TEXT)
    assert reference.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                         return_dict=False) == ids


def test_chat_template_jinja_wins_and_a_template_can_refuse(tmp_path):
    folder, _ = _folder(tmp_path)
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}|{% endfor %}")
    tok = folder_tokenizer.load(folder)
    assert tok.apply_chat_template(MESSAGES) == tok.encode("You are terse.|To be?|", bos=False)
    (folder / "chat_template.jinja").unlink()
    with pytest.raises(ValueError, match="the model's chat template refused the messages: Unknown role: tool$"):
        folder_tokenizer.load(folder).apply_chat_template([{"role": "tool", "content": "x"}])
    # the template runs sandboxed: it cannot reach Python's internals
    (folder / "chat_template.jinja").write_text("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ValueError, match="refused the messages"):
        folder_tokenizer.load(folder).apply_chat_template(MESSAGES)
    # a template whose own code breaks on these messages is their refusal too, not a crash
    (folder / "chat_template.jinja").write_text("{{ messages[0]['content'] + 1 }}")
    with pytest.raises(ValueError, match=r"failed on these messages \(TypeError"):
        folder_tokenizer.load(folder).apply_chat_template(MESSAGES)


def test_a_folder_without_a_chat_template_says_to_use_completions(tmp_path):
    folder, _ = _folder(tmp_path, chat_template=None)
    with pytest.raises(ValueError, match=r"has no chat template .*; use /v1/completions"):
        folder_tokenizer.load(folder).apply_chat_template(MESSAGES)


@pytest.mark.parametrize("damage, match", [
    ("missing", r"tokenizer\.json: missing"),
    ("damaged", r"tokenizer\.json: not a readable tokenizer"),
    ("too large", r"tokenizer\.json: 320 token ids, past the model's vocab_size=300"),
    ("bad eos", r"generation_config\.json: eos_token_id='x' must be a token id"),
    ("bad template", r"tokenizer_config\.json: the chat template does not compile"),
    ("template not text", r"tokenizer_config\.json: chat_template must be a string"),
    ("config not json", r"tokenizer_config\.json: not readable JSON"),
])
def test_a_bad_tokenizer_is_refused_naming_the_file(tmp_path, damage, match):
    template = {"bad template": "{% for m in messages %}", "template not text": 7}.get(damage, hf.CHAT_TEMPLATE)
    folder, _ = _folder(tmp_path, vocab_size=320 if damage == "too large" else 280, chat_template=template,
                        generation_config={"eos_token_id": "x"} if damage == "bad eos" else None)
    if damage == "missing":
        (folder / "tokenizer.json").unlink()
    elif damage == "damaged":
        (folder / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    elif damage == "config not json":
        (folder / "tokenizer_config.json").write_text("{")
    with pytest.raises(ValueError, match=match):
        folder_tokenizer.load(folder, huggingface.read_config(folder))


def test_both_tokenizers_offer_what_the_server_uses(tmp_path):
    """The server takes either: the byte-level one (the presets) or a folder's."""
    names = ("encode", "decode", "stream", "token_text", "token_bytes", "apply_chat_template", "eos_ids", "vocab_size")
    byte = tokenizer.ByteTokenizer()
    folder = folder_tokenizer.load(_folder(tmp_path)[0])
    assert all(hasattr(byte, n) and hasattr(folder, n) for n in names)
    stream = byte.stream()
    assert "".join(stream.step(t) for t in byte.encode(TEXT)) + stream.flush() == TEXT
    assert byte.apply_chat_template(MESSAGES) == byte.encode("SYSTEM:\nYou are terse.\n\nUSER:\nTo be?\n\nASSISTANT:\n")
