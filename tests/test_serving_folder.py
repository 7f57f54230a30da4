"""`serve --model DIR`: a Hugging Face folder (a tiny random Qwen2 with a byte-level BPE tokenizer
and a ChatML chat template, written in the test) served to the official OpenAI client. Its greedy
text equals what the float64 NumPy forward of the architecture writes, through the folder's own
tokenizer and chat template; it ends where the folder's generation_config.json says."""

from __future__ import annotations

import httpx
import pytest

import hf_checkpoints as hf
from inference_lab.base import folder_tokenizer
from inference_lab.serving import server as serving_server
from inference_lab.serving.protocol import APIError, read_request

PROMPT = "To be, or not to be: that is"
MESSAGES = [{"role": "system", "content": "Speak as Hamlet."}, {"role": "user", "content": "Who's there?"}]
NEW = 12       # tokens per answer
STOP_AT = 5    # the folder's EOS is the reference's token at this index: the answer ends before it


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    c = hf.config("qwen2")
    weights = hf.tensors(c, seed=3)
    path = hf.write(tmp_path_factory.mktemp("Tiny-Qwen2"), c, weights)
    hf.write_tokenizer(path)
    tok = folder_tokenizer.load(path)
    prompt = tok.encode(PROMPT)
    reference = hf.greedy(c, weights, prompt, NEW)
    chat_prompt = tok.apply_chat_template(MESSAGES)
    chat_reference = hf.greedy(c, weights, chat_prompt, NEW)
    # an EOS the completion meets at STOP_AT and the chat answer never does
    eos = next(t for t in reference[STOP_AT:] if t not in reference[:STOP_AT] and t not in chat_reference)
    stop = reference.index(eos)
    hf.write_tokenizer(path, generation_config={"bos_token_id": 1, "eos_token_id": [eos]})
    return dict(path=path, tok=tok, prompt=prompt, reference=reference, chat_prompt=chat_prompt,
                chat_reference=chat_reference, eos=eos, stop=stop)


@pytest.fixture(scope="module")
def server(folder):
    s = serving_server.ServerProcess("--max-model-len", "128", "--max-num-seqs", "2", "--max-num-batched-tokens",
                                     "32", model=folder["path"])
    try:
        yield s
    finally:
        s.stop()


def _client(server):
    import openai
    return openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=60)


def test_models_lists_the_folders_name(server, folder):
    models = _client(server).models.list().data
    assert [m.id for m in models] == [folder["path"].name]
    assert models[0].model_extra["max_model_len"] == 128


def test_completions_write_the_reference_text_and_stop_at_the_folders_eos(server, folder):
    client, tok, ref = _client(server), folder["tok"], folder["reference"]
    name = folder["path"].name
    whole = client.completions.create(model=name, prompt=PROMPT, max_tokens=NEW, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert whole.choices[0].text == tok.decode(ref) and whole.choices[0].finish_reason == "length"
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(folder["prompt"]), NEW)
    ended = client.completions.create(model=name, prompt=PROMPT, max_tokens=NEW, temperature=0)
    assert ended.choices[0].finish_reason == "stop"
    assert ended.choices[0].text == tok.decode(ref[:folder["stop"]])
    # a prompt of token ids is the same prompt
    ids = client.completions.create(model=name, prompt=folder["prompt"], max_tokens=NEW, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert ids.choices[0].text == whole.choices[0].text


def test_streamed_chat_applies_the_folders_chat_template(server, folder):
    client, tok = _client(server), folder["tok"]
    pieces, usage = [], None
    for chunk in client.chat.completions.create(model=folder["path"].name, messages=MESSAGES, max_tokens=NEW,
                                                temperature=0, stream=True, stream_options={"include_usage": True},
                                                logprobs=True):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            if chunk.choices[0].logprobs:
                for entry in chunk.choices[0].logprobs.content:
                    assert entry.token == bytes(entry.bytes).decode(errors="replace")
        if chunk.usage:
            usage = chunk.usage
    assert "".join(pieces) == tok.decode(folder["chat_reference"])
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(folder["chat_prompt"]), NEW)


def test_a_role_the_template_refuses_is_a_400_naming_it(server, folder):
    r = httpx.post(server.base_url + "/chat/completions", timeout=60,
                   json={"model": folder["path"].name, "messages": [{"role": "tool", "content": "x"}]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages" and "Unknown role: tool" in r.json()["error"]["message"]


def test_bench_serve_runs_against_the_folder_with_its_tokenizer(server, folder):
    """bench-serve with --tokenizer sends token ids: the server sees exactly the trace's prompt length."""
    from inference_lab.serving import load

    result = load.bench_serve(server.base_url, load.sample_requests(3, 1.0, output_len=4, prompt_len=20, seed=0),
                              model=folder["path"].name, tokenizer=folder["tok"])
    assert [r.error for r in result.results] == [""] * 3
    assert [r.prompt_len for r in result.results] == [20] * 3 and [r.output_len for r in result.results] == [4] * 3


def test_a_folder_without_a_chat_template_answers_chat_400(folder, tmp_path):
    hf.write(tmp_path, hf.config("llama"), hf.tensors(hf.config("llama")))
    hf.write_tokenizer(tmp_path, chat_template=None)
    with pytest.raises(APIError) as err:
        read_request({"model": "m", "messages": MESSAGES}, True, model_name="m", max_seq_len=128, vocab_size=300,
                     tokenizer=folder_tokenizer.load(tmp_path))
    assert err.value.status == 400 and "no chat template" in err.value.message and err.value.param == "messages"


@pytest.mark.parametrize("flags, match", [
    (["--model", "{folder}", "--preset", "small"], "drop --preset/--weights"),
    (["--max-model-len", "64"], "--max-model-len applies to --model only"),
    (["--model", "{folder}", "--max-model-len", "100000"], "max_model_len=100000 must be an integer from 1 to"),
    (["--model", "/nonexistent/folder"], r"--model /nonexistent/folder: .*config\.json"),
])
def test_bad_model_flags_are_refused_in_one_line(folder, capsys, flags, match):
    with pytest.raises(SystemExit):
        serving_server.parse_args([f.format(folder=folder["path"]) for f in flags])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert __import__("re").search(match, err), err


def test_served_model_name_replaces_the_folders(folder):
    args = serving_server.parse_args(["--model", str(folder["path"]), "--served-model-name", "mine"])
    assert (args.served_model_name, args.cfg.name) == ("mine", folder["path"].name)


def test_a_folder_without_its_tokenizer_is_refused_before_the_weights_load(tmp_path, capsys, monkeypatch):
    c = hf.config("llama")
    folder = hf.write(tmp_path / "no-tokenizer", c, hf.tensors(c))
    monkeypatch.setattr(serving_server, "build_backend", lambda args: pytest.fail("loaded the weights first"))
    assert serving_server.main(["--model", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"serve: --model {folder}: {folder / 'tokenizer.json'}: missing") and "\n" not in err
