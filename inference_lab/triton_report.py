"""Every Pallas kernel the model launches, compiled for NVIDIA GPUs on this machine (no GPU).

    python -m inference_lab.triton_report [--target sm_90|sm_80|all] [--json PATH] [--markdown]
    make triton-report

For the ``base`` (Llama-3.2-1B) and ``llama3_8b`` presets, the model's prefill (batch 1 with a
2048-token prompt, batch 64 with 512 tokens) and one decode step at the same batch and cache
(prompt + 64 slots) are lowered for CUDA with ``mode="triton"``, plus the kernel benchmark's
GPU shapes; each unique kernel is compiled with Triton and printed with its grid, warps,
stages, shared memory, registers and spills (:mod:`pallas_kernels.triton_compile` does the
work and says what it proves). Weights and caches are abstract shapes
(``jax.eval_shape``/``jax.ShapeDtypeStruct``): nothing is allocated, so the 8B model costs
no memory. All layers of a preset are lowered (the call counts are per model step); layers
share shapes, so their kernels are de-duplicated to one row each.
"""

from __future__ import annotations

import sys
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from inference_lab.model import transformer as M
from inference_lab.base.config import ModelConfig
from pallas_kernels import triton_compile as tc

PRESETS = ("base", "llama3_8b")
SHAPES = ((1, 2048), (64, 512))      # (batch, prompt tokens); the cache holds prompt + DECODE_ROOM
DECODE_ROOM = 64
SERVING = (8, 2048, 4)               # the serving engine's step: slots, positions per slot, prompt chunks (16 tokens each)
PAGED_BLOCK = 16                     # its paged cache's block size (the serve default)


def abstract_params(cfg: ModelConfig) -> dict:
    """The model's parameter dict as ``ShapeDtypeStruct`` leaves (no weights are drawn)."""
    return jax.eval_shape(lambda: M.Transformer(cfg, rngs=nnx.Rngs(0), kernels="reference").params())


def model_cases(presets=PRESETS, shapes=SHAPES, *, n_layers: int | None = None) -> list[tuple[str, Callable, tuple]]:
    """``(context, fn, abstract args)`` for prefill and one decode step of each preset and shape,
    and the serving engine's step (:data:`SERVING`: every slot's decode row and prompt chunks of
    16 tokens in one forward, both through the ragged paged attention), over contiguous slots and
    over a paged cache.

    ``n_layers`` overrides the presets' depth (every layer has the same kernels; tests use 1).
    """
    S = jax.ShapeDtypeStruct
    cases = []
    for preset in presets:
        cfg = ModelConfig.preset(preset, **({"n_layers": n_layers} if n_layers else {}))
        params = abstract_params(cfg)
        for batch, prompt in shapes:
            slot = S((batch, prompt + DECODE_ROOM, cfg.n_kv_heads, cfg.head_dim), jnp.dtype(cfg.dtype))
            cache = [slot] * cfg.n_layers
            lengths = S((batch,), jnp.int32)

            def prefill(p, tokens, n, k, v, cfg=cfg):
                return M.prefill_forward(p, tokens, n, k, v, cfg=cfg, mode="triton")

            def decode(p, tokens, n, k, v, cfg=cfg):
                return M.decode_forward(p, tokens, n, k, v, cfg=cfg, mode="triton")

            ctx = f"{preset} B{batch}"
            cases.append((f"{ctx} prefill T{prompt}", prefill,
                          (params, S((batch, prompt), jnp.int32), lengths, cache, cache)))
            cases.append((f"{ctx} decode ctx{prompt + DECODE_ROOM}", decode,
                          (params, S((batch,), jnp.int32), lengths, cache, cache)))
        slots, positions, chunks = SERVING
        cache = [S((slots, positions, cfg.n_kv_heads, cfg.head_dim), jnp.dtype(cfg.dtype))] * cfg.n_layers
        i32 = jnp.int32
        chunk_args = (S((16 * chunks,), i32), S((chunks + 1,), i32), S((chunks,), i32), S((chunks,), i32))

        def step(p, tokens, n, active, chunk_tokens, bounds, chunk_slots, starts, heads, k, v, cfg=cfg):
            return M.step_forward(p, tokens, n, active, chunk_tokens, bounds, chunk_slots, starts, heads, k, v,
                                  cfg=cfg, mode="triton")

        cases.append((f"{preset} serving step {slots} rows + {chunks} chunks ctx{positions}", step,
                      (params, S((slots,), i32), S((slots,), i32), S((slots,), jnp.bool_), *chunk_args,
                       S((slots + chunks,), i32), cache, cache)))
        # the same step over a paged cache: the pool holds every slot's positions in blocks of 16
        pool = [S((slots * positions // PAGED_BLOCK + 1, PAGED_BLOCK, cfg.n_kv_heads, cfg.head_dim),
                  jnp.dtype(cfg.dtype))] * cfg.n_layers

        def paged_step(p, tokens, n, active, chunk_tokens, bounds, chunk_slots, starts, heads, k, v, table, cfg=cfg):
            return M.step_forward(p, tokens, n, active, chunk_tokens, bounds, chunk_slots, starts, heads, k, v,
                                  cfg=cfg, mode="triton", block_table=table)

        cases.append((f"{preset} paged serving step {slots} rows + {chunks} chunks ctx{positions}", paged_step,
                      (params, S((slots,), i32), S((slots,), i32), S((slots,), jnp.bool_), *chunk_args,
                       S((slots + chunks,), i32), pool, pool, S((slots, positions // PAGED_BLOCK), i32))))
    return cases


def all_cases() -> list[tuple[str, Callable, tuple]]:
    """The model's kernels at both presets and shapes, then the kernel benchmark's shapes."""
    return model_cases() + tc.benchmark_cases()


def main(argv: list[str] | None = None) -> int:
    return tc.main(argv, cases=all_cases, prog="python -m inference_lab.triton_report",
                   what="the shapes the model launches (base and llama3_8b, prefill and decode, "
                        "batch 1 and 64) and the kernel benchmark's GPU shapes")


if __name__ == "__main__":
    sys.exit(main())
