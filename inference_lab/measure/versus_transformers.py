"""``python -m inference_lab.measure.versus_transformers``: the lab's model against Hugging Face's
own (``transformers``, the optional ``hf`` extra) on the same folder, on this machine.

    python -m inference_lab.measure.versus_transformers                      # a random SmolLM2-135M
    python -m inference_lab.measure.versus_transformers --model models/SmolLM2-135M --prompt-len 512

Both read the same weights in float32 and run on the CPU (or the lab on its accelerator: then the
ratio compares two machines' parts, and the table says so). Three things, each the median of
``--repeats`` after a warm-up:

- **agreement**: the largest logit difference on one prompt, relative to the largest logit;
- **prefill**: one forward pass over a ``--prompt-len`` prompt, batch 1, filling the KV cache
  (the lab's :func:`~inference_lab.measure.timing.measure_prefill`; ``transformers``' forward with
  ``use_cache=True``);
- **decode**: batch-1 steps from a cache of ``--prompt-len`` tokens, greedy, as each library
  generates: the lab's steps run in one jitted loop (its generation loop), ``transformers``' one
  forward call each with its ``DynamicCache`` (its ``generate`` loop), the argmax included.

Without ``--model`` a folder of SmolLM2-135M's shape (HuggingFaceTB/SmolLM2-135M's config.json:
30 layers of 576, 9 query and 3 KV heads, tied embeddings of 49,152 tokens) with random weights is
written to a temporary folder (:func:`inference_lab.model.huggingface.save`): its speed is the
real model's, nothing downloads.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

import numpy as np

from inference_lab.base.config import ModelConfig
from pallas_kernels.timing import round_robin, timed, timed_call

# HuggingFaceTB/SmolLM2-135M's config.json, at the lab's default context
SMOLLM2_135M = ModelConfig(name="SmolLM2-135M-random", vocab_size=49_152, d_model=576, n_layers=30, n_heads=9,
                           n_kv_heads=3, head_dim=64, d_ff=1536, max_seq_len=2048, rope_theta=100_000.0,
                           norm_eps=1e-5, tie_embeddings=True, dtype="float32")


def random_folder(cfg: ModelConfig, folder, seed: int = 0) -> Path:
    """A Hugging Face folder of ``cfg``'s shape with seeded random weights."""
    from flax import nnx

    from inference_lab.model import huggingface
    from inference_lab.model.transformer import Transformer

    return huggingface.save(Transformer(cfg, rngs=nnx.Rngs(seed)), folder)


def transformers_times(folder, prompt: np.ndarray, steps: int, repeats: int) -> dict:
    """``transformers``' prefill of ``prompt`` and its decode step (median seconds), float32."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor(prompt[None].astype(np.int64))

    def prefill():
        return model(ids, use_cache=True)

    def step(token, cache):   # one greedy step, as `generate` takes it
        out = model(token, past_key_values=cache, use_cache=True)
        return out.logits[:, -1].argmax(-1, keepdim=True), out.past_key_values

    def decode() -> float:    # `steps` steps after the prompt (its prefill untimed): seconds per step
        out = prefill()
        token, cache, seconds = out.logits[:, -1].argmax(-1, keepdim=True), out.past_key_values, 0.0
        for _ in range(steps):
            took, (token, cache) = timed_call(step, token, cache)
            seconds += took
        return seconds / steps

    with torch.inference_mode():
        logits = prefill().logits[0].double().numpy()
        prefill_s, decode_s = (s.median for s in round_robin([lambda: timed(prefill), decode], repeats))
    return {"logits": logits, "prefill_s": prefill_s, "decode_step_s": decode_s,
            "threads": torch.get_num_threads(), "version": f"transformers {transformers.__version__}, "
                                                           f"torch {torch.__version__}"}


def lab_times(folder, prompt: np.ndarray, steps: int, repeats: int) -> dict:
    """The lab's prefill of ``prompt``'s length and its batch-1 decode step (median seconds)."""
    import jax

    from inference_lab.measure import timing
    from inference_lab.model import huggingface

    model = huggingface.load(folder, dtype="float32")
    logits = np.asarray(model(np.asarray(prompt[None], np.int32))[0], np.float64)
    prefill = timing.measure_prefill(model, 1, len(prompt), repeats=repeats, ceilings=None)
    decode = timing.measure_decode(model, 1, len(prompt), steps, repeats=repeats, ceilings=None)
    return {"logits": logits, "prefill_s": prefill.seconds, "decode_step_s": decode.step_seconds,
            "kernels": model.kernels, "version": f"jax {jax.__version__}",
            "device": jax.devices()[0].device_kind}


def compare(folder, *, prompt_len: int = 256, steps: int = 32, repeats: int = 5, seed: int = 0) -> dict:
    """Both libraries on ``folder``: their logits' agreement and their times (:func:`main` prints them)."""
    from inference_lab.model import huggingface

    cfg = huggingface.read_config(folder)
    prompt = np.random.default_rng(seed).integers(0, cfg.vocab_size, prompt_len)
    lab = lab_times(folder, prompt, steps, repeats)
    hf = transformers_times(folder, prompt, steps, repeats)
    agreement = float(np.max(np.abs(lab["logits"] - hf["logits"])) / np.max(np.abs(hf["logits"])))
    return {"model": cfg.name, "prompt_len": prompt_len, "steps": steps, "repeats": repeats,
            "agreement": agreement, "lab": {k: v for k, v in lab.items() if k != "logits"},
            "transformers": {k: v for k, v in hf.items() if k != "logits"}}


def format_table(r: dict) -> str:
    lab, hf = r["lab"], r["transformers"]
    rows = [f"{r['model']}: float32, batch 1; lab ({lab['version']}, {lab['kernels']} kernels on {lab['device']}) "
            f"vs {hf['version']} ({hf['threads']} threads)",
            f"logits agree within {r['agreement']:.1e} of the largest",
            f"{'':28s}{'lab':>10s}{'transformers':>14s}{'lab speed-up':>14s}"]
    for name, key in ((f"prefill of {r['prompt_len']} tokens", "prefill_s"),
                      (f"decode step at {r['prompt_len']}", "decode_step_s")):
        rows.append(f"{name:28s}{1e3 * lab[key]:8.2f} ms{1e3 * hf[key]:11.2f} ms{hf[key] / lab[key]:13.2f}x")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m inference_lab.measure.versus_transformers",
                                description="Time the lab's model against transformers' on one Hugging Face folder.")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="a Hugging Face folder (default: a random SmolLM2-135M-shaped one, written to a temporary folder)")
    p.add_argument("--prompt-len", type=int, default=256, help="prefill length and decode context (default: 256)")
    p.add_argument("--steps", type=int, default=32, help="decode steps timed per repeat (default: 32)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats after a warm-up (default: 5)")
    args = p.parse_args(argv)
    for name, low in (("prompt_len", 1), ("steps", 1), ("repeats", 1)):
        if getattr(args, name) < low:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be at least {low}")
    if not all(importlib.util.find_spec(name) for name in ("torch", "transformers")):
        p.error("transformers and torch are not installed: install the hf extra (README, \"Your own model\")")
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.model or random_folder(SMOLLM2_135M, Path(scratch) / SMOLLM2_135M.name)
        try:
            result = compare(folder, prompt_len=args.prompt_len, steps=args.steps, repeats=args.repeats)
        except ValueError as e:
            print(f"versus_transformers: {e}", file=sys.stderr)
            return 2
    from inference_lab.base.hardware import processor_name

    print(f"{processor_name()}\n{format_table(result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
