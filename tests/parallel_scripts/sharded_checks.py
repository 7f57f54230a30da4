"""Child process of tests/test_parallel.py: run with 4 simulated CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=4 set by the parent before jax starts).

Runs the tiny model on one device and sharded over tp = 1, 2, 4 devices and prints one JSON
line of measurements that the parent's tests assert on:
- max |logit difference| against the one-device model, prefill and decode, "reference" for
  tp = 1, 2, 4 and "interpret" (the Pallas kernels under the interpreter, one layer, small
  shapes: it is slow) for tp = 4 only (every split at once; the sharding code is the same
  for every mode, so reference covers the other degrees);
- bytes of weights on device 0 and in total, and of the replicated RMSNorm scales;
- all-reduce and all-gather instructions in the compiled decode step;
- generate() (prefill + jitted decode loop) and model(tokens) on a sharded model against
  the one-device model.
"""

import json

import jax
import numpy as np

from inference_lab.runtime import generation, hlo
from inference_lab.model import parallel
from inference_lab.model.kv_cache import KVCache
from inference_lab.base.config import ModelConfig
from inference_lab.model.transformer import Transformer

assert len(jax.devices()) == 4, jax.devices()
out = {"reference": {}, "interpret": {}, "bytes": {}, "collectives": {}}
rng = np.random.default_rng(0)
INTERPRET_TP = (4,)  # the whole layout at once: vocabulary split, one KV head per device


def run(model, cfg, tokens, lengths, nxt):
    """prefill then one decode step; returns (prefill logits, decode logits, cache)."""
    pre, cache = generation.prefill(model, tokens, KVCache.create(cfg, tokens.shape[0], tokens.shape[1] + 2), lengths)
    dec, cache = generation.decode_step(model, nxt, cache)
    return np.asarray(pre), np.asarray(dec), cache


def diff(a, b):
    return float(np.abs(a - b).max())


# --- reference kernels, the full tiny preset, ragged batch of 2
cfg = ModelConfig.preset("tiny")
one = Transformer(cfg, kernels="reference")
tokens, lengths = rng.integers(0, cfg.vocab_size, (2, 6)), np.array([6, 4])
# Feed the greedy token, so that generate() below must reproduce [argmax(pre1), argmax(dec1)]
# from the same compiled shapes (prompt width 6, cache 8) without another one-device run.
pre1 = np.asarray(generation.prefill(one, tokens, KVCache.create(cfg, 2, 8), lengths)[0])
nxt = pre1.argmax(-1)
pre1, dec1, _ = run(one, cfg, tokens, lengths, nxt)
out["logit_scale"] = float(np.abs(pre1).max())
out["bytes"]["total"] = int(one.nbytes)
out["bytes"]["norms"] = int(sum(x.nbytes for k, x in one.params().items() if k.endswith("norm"))
                            + sum(lp[k].nbytes for lp in one.params()["layers"] for k in ("attn_norm", "mlp_norm")))
for tp in (1, 2, 4):
    model = parallel.shard(one, parallel.make_mesh(tp))
    pre, dec, cache = run(model, cfg, tokens, lengths, nxt)
    out["reference"][tp] = {"prefill": diff(pre, pre1), "decode": diff(dec, dec1),
                            "cache_spec": str(cache.k[0].sharding.spec)}
    out["bytes"][tp] = parallel.weight_bytes_per_device(model)
    text = hlo.compiled_decode_text(model, cache)
    ops = [op for op, *_ in hlo.hlo_ops(text)]
    out["collectives"][tp] = {"all_reduces": hlo.count_all_reduces(text),
                              "all_gathers": sum(op.startswith("all-gather") for op in ops)}
    if tp == 4:  # the rest of the public API on a sharded model
        prompts = [tokens[0].tolist(), tokens[1, :4].tolist()]
        out["generate"] = generation.generate(model, prompts, max_new_tokens=2)
        out["generate_expected"] = np.stack([nxt, dec1.argmax(-1)], 1).tolist()
        out["call"] = diff(np.asarray(model(tokens)), np.asarray(one(tokens)))

# --- Pallas kernels under the interpreter: one layer, one row, checked against the
# one-device reference model (the kernel tests establish interpret == reference).
cfg1 = cfg.replace(n_layers=1)
ref1 = Transformer(cfg1, kernels="reference")
tok1, len1, nxt1 = rng.integers(0, cfg.vocab_size, (1, 4)), np.array([4]), np.array([42])
pre_r, dec_r, _ = run(ref1, cfg1, tok1, len1, nxt1)
interp = Transformer(cfg1, kernels="interpret", params=ref1.params())
for tp in INTERPRET_TP:
    pre, dec, _ = run(parallel.shard(interp, parallel.make_mesh(tp)), cfg1, tok1, len1, nxt1)
    out["interpret"][tp] = {"prefill": diff(pre, pre_r), "decode": diff(dec, dec_r)}

print(json.dumps(out))
