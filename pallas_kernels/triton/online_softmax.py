"""The online softmax the attention kernels share (flash attention, decode attention, paged decode
attention), and how a decode kernel whose keys are split ends: its outputs and their combine.

Attention over keys visited one block at a time, never holding the whole score row:
for each query row keep a running maximum ``m``, a running sum ``l`` of ``2^(s - m)`` and a
running weighted sum ``acc`` of values. When a new block raises the maximum from ``m`` to
``m_new``, everything accumulated so far is rescaled by ``alpha = 2^(m - m_new)``. After the
last block, ``acc / l`` is the softmax-weighted average of the values. Scores come in base 2
(the kernel folds ``log2(e)`` into the softmax scale), so ``exp2`` replaces ``exp``.

The first block a program visits must hold a key every row sees, so ``m`` is finite from then
on and ``exp2(-inf - m_new) = 0`` is safe.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas.triton import store

from pallas_kernels.triton.common import block_mask


def start(rows: int, d: int):
    """The empty carry: (acc [rows, d], m [rows], l [rows]), all f32."""
    return (jnp.zeros((rows, d), jnp.float32),
            jnp.full((rows,), -jnp.inf, jnp.float32),
            jnp.zeros((rows,), jnp.float32))


def update(carry, scores, v, v_scales=None):
    """Fold one key block in: ``scores [rows, block_k]`` (base 2, masked keys -inf), ``v [block_k, d]``.
    ``v_scales [block_k]``: an int8 cache's per-key value scales (``v`` holds the integers, widened):
    they weigh the probabilities instead of the values, so ``v`` is never scaled element by element."""
    acc, m_i, l_i = carry
    m_new = jnp.maximum(m_i, jnp.max(scores, axis=1))
    alpha = jnp.exp2(m_i - m_new)
    p = jnp.exp2(scores - m_new[:, None])
    l_new = l_i * alpha + jnp.sum(p, axis=1)
    weights = p if v_scales is None else p * v_scales[None, :]
    # P is cast to V's dtype before the dot, as the tensor cores want it; the sum stays f32.
    acc = acc * alpha[:, None] + jnp.dot(weights.astype(v.dtype), v, precision=lax.Precision.HIGHEST,
                                         preferred_element_type=jnp.float32)
    return acc, m_new, l_new


def combine(acc, m, l, dtype):
    """Merge the partials of programs that each saw a part of the keys (flash-decoding's splits):
    ``acc [B, splits, Hq, D]``, ``m``, ``l [B, splits, Hq]`` -> ``[B, Hq, D]`` in ``dtype``, by the
    log-sum-exp rule (base 2): ``M = max_s m_s``, ``w_s = 2^(m_s - M)``, ``out = sum_s w_s acc_s /
    sum_s w_s l_s``. A split that saw no key (``m = -inf``, ``l = 0``) weighs 0; split 0 always has a
    key, so ``M`` is finite. A few fused jnp ops on small arrays."""
    m_max = jnp.max(m, axis=1, keepdims=True)               # [B, 1, Hq]
    w = jnp.exp2(m - m_max)                                 # [B, splits, Hq]
    num = jnp.sum(w[..., None] * acc, axis=1)               # [B, Hq, D]
    den = jnp.sum(w * l, axis=1)                            # [B, Hq]
    return (num / den[..., None]).astype(dtype)


def split_outputs(b: int, splits: int, hq: int, d: int, dtype) -> list:
    """What a decode kernel whose keys are split ``splits`` ways writes: with one split the
    normalised output ``[B, Hq, D]`` in ``dtype``; with several each split's partial for
    :func:`combine`: acc ``[B, splits, Hq, D]``, m and l ``[B, splits, Hq]`` (f32)."""
    if splits == 1:
        return [jax.ShapeDtypeStruct((b, hq, d), dtype)]
    return [jax.ShapeDtypeStruct((b, splits, hq, d), jnp.float32), jax.ShapeDtypeStruct((b, splits, hq), jnp.float32),
            jax.ShapeDtypeStruct((b, splits, hq), jnp.float32)]


def finish(outs, carry, *, b, split, heads, row_ok) -> None:
    """A decode program's end, into the refs of :func:`split_outputs`: with one output, ``acc / l``
    normalised; with three, its partial (acc, m, l) at ``split``. ``heads``: its query heads (a
    ``pl.ds`` of the group's rows); ``row_ok``: which rows of its tile are real heads."""
    acc, m_i, l_i = carry
    rows_mask = block_mask(row_ok, None, acc.shape)
    if len(outs) == 1:   # one split: no combine afterwards
        (o_ref,) = outs
        store(o_ref.at[b, heads, :], (acc / l_i[:, None]).astype(o_ref.dtype), mask=rows_mask)
        return
    acc_ref, m_ref, l_ref = outs
    store(acc_ref.at[b, split, heads, :], acc, mask=rows_mask)
    store(m_ref.at[b, split, heads], m_i, mask=row_ok)
    store(l_ref.at[b, split, heads], l_i, mask=row_ok)
