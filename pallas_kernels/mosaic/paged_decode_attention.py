"""Hopper paged decode attention in Mosaic GPU: the decode-attention kernel of this tier, its K/V
blocks found through a block table.

Layout: q ``[B, Hq, D]``; k_pages, v_pages ``[N, block_size, Hkv, D]`` (a pool every sequence
draws from); block_tables ``[B, P]`` int32 (position ``j`` of row ``b`` lives in block
``block_tables[b, j // block_size]``); lengths ``[B]`` int32 in ``1..P * block_size``.

It is :mod:`pallas_kernels.mosaic.decode_attention` with the pipeline's index map reading the
table: the producer warpgroup's TMA copy of pipeline step ``j`` fetches block
``block_tables[b, first + j]`` of the pool (one ``[block_size, D]`` tile of KV head ``h``), where
the contiguous kernel fetched positions ``j * block_k`` of its row. Everything else is that
kernel's: a CTA per (split of the pages, KV head, row), the G query heads of the group as the rows
of a 64-row wgmma tile, the online softmax in f32 in the consumer warpgroup, partials combined by
the log-sum-exp rule (:func:`pallas_kernels.triton.online_softmax.combine`). One block a step,
so blocks of at least 64 positions (``--block-size 64``): the probabilities of a block go through a
``[64, block]`` shared-memory tile, and Mosaic GPU lays a narrower one out for wgmma only with a
swizzle it cannot infer a register layout for (lowering fails at 16 and 32, checked). Blocks of 16,
the serving engine's default, run on the Triton tier (``"pallas"`` mode falls back to it).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.mosaic import common as C
from pallas_kernels.mosaic.decode_attention import HEAD_DIMS, LOG2E, ROWS, attend_block, group_consumer
from pallas_kernels.triton import online_softmax

STAGES = 4            # blocks in flight in the TMA ring, at most
RING_BYTES = 160 * 1024   # shared memory the ring may take (the Q, P and output tiles take the rest)
MIN_BLOCK = 64        # the narrowest block whose P tile Mosaic GPU lays out for wgmma
MIN_SPLIT_KEYS = 256  # never split a row into runs shorter than this many keys


# ----------------------------------------------------------------------------- the kernel
def paged_decode_attention_kernel(lengths_ref, tables_ref, q_ref, k_ref, v_ref, acc_ref, ml_ref, q_smem, p_smem,
                                  o_smem, ml_smem, q_bar, *, pages_per_split, block_size, stages, scale_log2):
    # lengths_ref [B], tables_ref [B, P] int32 (GMEM); q_ref [B, Hkv, Gp, D]; k_ref, v_ref [N, bs, Hkv, D];
    # acc_ref [B, Hkv, splits, Gp, D] f32; ml_ref [B, Hkv, splits, 2, ROWS] f32 (m, l).
    d, dtype = q_ref.shape[-1], q_ref.dtype
    split, h, b = lax.axis_index("split"), lax.axis_index("h"), lax.axis_index("b")
    length = lengths_ref[b]
    first = split * pages_per_split
    end = jnp.minimum(first + pages_per_split, pl.cdiv(length, block_size))   # this CTA's pages: [first, end)
    n_pages = jnp.maximum(end - first, 0)

    def step(idx, k_smem, v_smem, k_bar, v_bar, carry):
        (j,) = idx
        return attend_block(carry, q_smem, k_smem, v_smem, k_bar, v_bar, p_smem, first_key=(first + j) * block_size,
                            end=length, block_k=block_size, scale_log2=scale_log2)

    consumer = group_consumer(q_ref.at[b, h, pl.ds(0, ROWS)], q_smem, q_bar, o_smem, ml_smem,
                              acc_ref.at[b, h, split, pl.ds(0, ROWS)], ml_ref.at[b, h, split], d=d)

    # Step j's tile is block tables[b, first + j] of the pool: the index map reads the table.
    spec = plgpu.BlockSpec((None, block_size, d), lambda j: (tables_ref[b, first + j], 0, 0),
                           transforms=C.swizzled(d, dtype), memory_space=plgpu.SMEM)
    pipeline = plgpu.emit_pipeline_warp_specialized(
        step, grid=(n_pages,), memory_registers=40, in_specs=[spec, spec], wg_axis="wg", num_compute_wgs=1,
        max_concurrent_steps=stages, manual_produced_barriers=True, compute_context=consumer)
    pipeline(k_ref.at[:, :, h, :], v_ref.at[:, :, h, :])


# ----------------------------------------------------------------------------- entry points
@C.one_entry("sm_scale", "config", "interpret")
def paged_decode_attention(q, k_pages, v_pages, block_tables, lengths, *, sm_scale=None,
                           config: MosaicPagedDecodeConfig | None = None, interpret=False):
    """One decode step through block tables on Hopper: q ``[B,Hq,D]``, pools ``[N,bs,Hkv,D]``,
    tables ``[B,P]`` -> ``[B,Hq,D]``. Assumes validated arguments (the public
    ``pk.paged_decode_attention`` checks them); rejects what this tier alone cannot take
    (:func:`unsupported`). ``interpret`` as the other kernels of the tier."""
    why = unsupported(q, k_pages)
    if why:
        raise ValueError(why)
    b, hq, d = q.shape
    _, block_size, hkv, _ = k_pages.shape
    pages = block_tables.shape[1]
    groups = hq // hkv
    config = config or MosaicPagedDecodeConfig()
    splits = config.splits
    if splits is None:   # enough CTAs for every SM, no run shorter than MIN_SPLIT_KEYS keys
        splits = max(1, min(C.cdiv(config.num_sms or C.device_num_sms(), b * hkv),
                            C.cdiv(pages * block_size, MIN_SPLIT_KEYS)))
    per_split = C.cdiv(pages, splits)
    splits = C.cdiv(pages, per_split)                # no split that starts past the table
    gp = C.round_up(groups, 8)
    q4 = q.reshape(b, hkv, groups, d)
    if gp != groups:
        q4 = jnp.pad(q4, ((0, 0), (0, 0), (0, gp - groups), (0, 0)))
    sm_scale = d ** -0.5 if sm_scale is None else float(sm_scale)
    stages = max(1, min(STAGES, RING_BYTES // (2 * block_size * d * jnp.dtype(q.dtype).itemsize)))
    kernel = functools.partial(paged_decode_attention_kernel, pages_per_split=per_split, block_size=block_size,
                               stages=stages, scale_log2=sm_scale * LOG2E)
    acc, ml = plgpu.kernel(
        kernel,
        out_type=(jax.ShapeDtypeStruct((b, hkv, splits, gp, d), jnp.float32),
                  jax.ShapeDtypeStruct((b, hkv, splits, 2, ROWS), jnp.float32)),
        scratch_types=[plgpu.SMEM((ROWS, d), q.dtype, transforms=C.swizzled(d, q.dtype)),
                       plgpu.SMEM((ROWS, block_size), q.dtype, transforms=C.swizzled(block_size, q.dtype)),
                       plgpu.SMEM((ROWS, d), jnp.float32, transforms=C.swizzled(d, jnp.float32)),
                       plgpu.SMEM((2, ROWS), jnp.float32),
                       plgpu.Barrier(num_barriers=1)],
        grid=(splits, hkv, b),
        grid_names=("split", "h", "b"),
        num_threads=2,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
        interpret=C.interpret_params(interpret),
    )(lengths.astype(jnp.int32), block_tables.astype(jnp.int32), q4, k_pages, v_pages)
    # [B, Hkv, splits, G, ...] -> the combine's [B, splits, Hq, ...]; rows >= G of the tile dropped
    acc = acc[:, :, :, :groups].transpose(0, 2, 1, 3, 4).reshape(b, splits, hq, d)
    m = ml[:, :, :, 0, :groups].transpose(0, 2, 1, 3).reshape(b, splits, hq)
    l = ml[:, :, :, 1, :groups].transpose(0, 2, 1, 3).reshape(b, splits, hq)
    return online_softmax.combine(acc, m, l, q.dtype)


def unsupported(q, k_pages, *, allow_copies: bool = True) -> str | None:
    """Why this tier cannot take these operands (a one-line reason), or None."""
    del allow_copies   # nothing is ever copied here
    if jnp.dtype(q.dtype) not in C.MMA_DTYPES:
        return f"q has dtype {q.dtype}; the Mosaic GPU paged decode attention takes bfloat16 or float16"
    if q.shape[-1] not in HEAD_DIMS:
        return f"head dim {q.shape[-1]}: the Mosaic GPU paged decode attention supports {HEAD_DIMS}"
    if q.shape[1] // k_pages.shape[2] > ROWS:
        return f"{q.shape[1] // k_pages.shape[2]} query heads per KV head; the Mosaic GPU tile holds {ROWS}"
    if k_pages.shape[1] < MIN_BLOCK:
        return (f"blocks of {k_pages.shape[1]} positions: the Mosaic GPU paged decode attention takes blocks of "
                f"{MIN_BLOCK} or more")
    return None


@dataclasses.dataclass(frozen=True)
class MosaicPagedDecodeConfig:
    """How many splits of a row's pages (None: enough CTAs for every SM), on how many SMs."""

    splits: int | None = None
    num_sms: int | None = None

    def __post_init__(self):
        if self.splits is not None and (isinstance(self.splits, bool) or not isinstance(self.splits, int)
                                        or self.splits < 1):
            raise ValueError(f"MosaicPagedDecodeConfig.splits={self.splits!r} must be a positive integer or None")
