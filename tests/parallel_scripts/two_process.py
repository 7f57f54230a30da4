"""One of two processes that form one 4-device mesh (2 CPU devices each) on localhost.

Usage: python two_process.py PORT PROCESS_ID OUT.npz
Both processes run the same program (multi-controller SPMD): build the seeded tiny model,
shard it over the 4 global devices, prefill a ragged batch and take one decode step.
Process 0 writes the (replicated) logits to OUT.npz; the test compares them with one process.
"""

import sys

import jax

port, pid, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
jax.config.update("jax_num_cpu_devices", 2)          # before any jax operation
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                           initialization_timeout=60)

import numpy as np  # noqa: E402

from inference_lab.runtime import generation
from inference_lab.model import parallel  # noqa: E402
from inference_lab.model.kv_cache import KVCache  # noqa: E402
from inference_lab.base.config import ModelConfig  # noqa: E402
from inference_lab.model.transformer import Transformer  # noqa: E402

assert jax.process_count() == 2 and len(jax.devices()) == 4 and len(jax.local_devices()) == 2

cfg = ModelConfig.preset("tiny")
model = parallel.shard(Transformer(cfg, kernels="reference"), parallel.make_mesh(4))
tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 6))
prefill_logits, cache = generation.prefill(model, tokens, KVCache.create(cfg, 2, 8), lengths=[6, 4])
decode_logits, cache = generation.decode_step(model, [5, 7], cache)
# The logits are replicated on every device: each process can read its own copy.
pre = np.asarray(prefill_logits.addressable_shards[0].data)
dec = np.asarray(decode_logits.addressable_shards[0].data)
if pid == 0:
    np.savez(out, prefill=pre, decode=dec, tokens=tokens)
jax.distributed.shutdown()
print("ok", pid)
