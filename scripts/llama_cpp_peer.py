"""The peer that shows what this CPU can do with int8 weights: llama.cpp, timing a model of the
lab preset's shape in float32 and in Q8_0 (int8 blocks of 32 with a float16 scale each), in one run.

    PYTHONPATH=. python scripts/llama_cpp_peer.py --llama-cpp PATH/TO/llama.cpp [--preset small]

``PATH/TO/llama.cpp`` is a local llama.cpp source tree with ``llama-bench`` built
(``cmake -B build && cmake --build build --target llama-bench``; nothing is downloaded here). The
script writes two GGUF files of the preset's shape with seeded random weights (timing does not
depend on the values: the lab's timing lessons use random weights too), using the tree's own
``gguf-py``, then runs ``llama-bench`` on both (prompt processing of ``--prompt-len`` tokens and
``--new-tokens`` decode steps at batch 1, ``--threads`` threads) and prints a markdown table with the
processor, for ``docs/benchmarks.md``. llama.cpp quantizes the activations to Q8 blocks too when it
multiplies Q8_0 weights (as the lab's int8 x int8 path does), with hand-written SIMD kernels.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from inference_lab.base.config import ModelConfig
from inference_lab.base.hardware import processor_summary


def write_gguf(path: Path, cfg: ModelConfig, qtype: str, gguf, seed: int = 0) -> None:
    """A llama-architecture GGUF of ``cfg``'s shape (random weights) with its matrices in ``qtype``
    ("F32" or "Q8_0"); norms stay float32, as llama.cpp's own converters keep them."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    d, f, hd = cfg.d_model, cfg.d_ff, cfg.head_dim
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(d)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(f)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_file_type(0 if qtype == "F32" else 7)           # LLAMA_FTYPE_ALL_F32 / MOSTLY_Q8_0
    # a SentencePiece-style vocabulary of the preset's size: unk, bos, eos, the 256 bytes, fillers
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"t{i}" for i in range(cfg.vocab_size - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (cfg.vocab_size - 259)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def matrix(name, out_features, in_features):
        a = (rng.standard_normal((out_features, in_features)) / np.sqrt(in_features)).astype(np.float32)
        if qtype == "F32":
            w.add_tensor(name, a)
        else:
            kind = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(a, kind), raw_shape=gguf.quant_shape_to_byte_shape(a.shape, kind),
                         raw_dtype=kind)

    def norm(name, n):
        w.add_tensor(name, np.ones(n, np.float32))

    matrix("token_embd.weight", cfg.vocab_size, d)
    for i in range(cfg.n_layers):
        norm(f"blk.{i}.attn_norm.weight", d)
        matrix(f"blk.{i}.attn_q.weight", cfg.n_heads * hd, d)
        matrix(f"blk.{i}.attn_k.weight", cfg.n_kv_heads * hd, d)
        matrix(f"blk.{i}.attn_v.weight", cfg.n_kv_heads * hd, d)
        matrix(f"blk.{i}.attn_output.weight", d, cfg.n_heads * hd)
        norm(f"blk.{i}.ffn_norm.weight", d)
        matrix(f"blk.{i}.ffn_gate.weight", f, d)
        matrix(f"blk.{i}.ffn_up.weight", f, d)
        matrix(f"blk.{i}.ffn_down.weight", d, f)
    norm("output_norm.weight", d)
    matrix("output.weight", cfg.vocab_size, d)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run_bench(bench: Path, models: list[Path], prompt_len: int, new_tokens: int, threads: int, repeats: int) -> list:
    """``llama-bench``'s JSON rows for every model: one prompt-processing row, one generation row."""
    cmd = [str(bench), "-m", ",".join(str(m) for m in models), "-p", str(prompt_len), "-n", str(new_tokens),
           "-t", str(threads), "-r", str(repeats), "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def table(rows: list, names: dict) -> str:
    """Markdown: prefill and decode tokens/s per format, each against float32."""
    by = {}
    for r in rows:
        kind = "prefill" if r["n_prompt"] > 0 else "decode"
        by.setdefault(names[Path(r["model_filename"]).name], {})[kind] = r["avg_ts"]
    f32 = by["float32"]
    lines = ["| llama.cpp weights | prefill tok/s | x f32 | decode B1 tok/s | x f32 |", "|---|---:|---:|---:|---:|"]
    for name, t in by.items():
        lines.append(f"| {name} | {t['prefill']:,.0f} | x{t['prefill'] / f32['prefill']:.2f} | "
                     f"{t['decode']:,.1f} | x{t['decode'] / f32['decode']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-cpp", required=True, type=Path, help="a llama.cpp source tree with llama-bench built")
    p.add_argument("--preset", default="small")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    bench = next((c for c in (args.llama_cpp / "build" / "bin" / "llama-bench", args.llama_cpp / "llama-bench")
                  if c.is_file()), None)
    if bench is None or not (args.llama_cpp / "gguf-py").is_dir():
        p.error(f"--llama-cpp {args.llama_cpp}: no build/bin/llama-bench or gguf-py there; build llama-bench first")
    sys.path.insert(0, str(args.llama_cpp / "gguf-py"))
    import gguf

    cfg = ModelConfig.preset(args.preset)
    with tempfile.TemporaryDirectory() as tmp:
        names, paths = {}, []
        for name, qtype in (("float32", "F32"), ("Q8_0", "Q8_0")):
            path = Path(tmp) / f"{cfg.name}-{qtype.lower()}.gguf"
            write_gguf(path, cfg, qtype, gguf)
            names[path.name] = name
            paths.append(path)
        rows = run_bench(bench, paths, args.prompt_len, args.new_tokens, args.threads, args.repeats)
    print(f"processor: {processor_summary()}; llama.cpp build {rows[0].get('build_commit', '?')}, "
          f"{args.threads} threads, {cfg.name} shape, prompt {args.prompt_len}, {args.new_tokens} new tokens")
    print(table(rows, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
