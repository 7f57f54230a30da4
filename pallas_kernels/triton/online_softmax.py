"""The online softmax both attention kernels share (flash attention and decode attention).

Attention over keys visited one block at a time, never holding the whole score row:
for each query row keep a running maximum ``m``, a running sum ``l`` of ``2^(s - m)`` and a
running weighted sum ``acc`` of values. When a new block raises the maximum from ``m`` to
``m_new``, everything accumulated so far is rescaled by ``alpha = 2^(m - m_new)``. After the
last block, ``acc / l`` is the softmax-weighted average of the values. Scores come in base 2
(the kernel folds ``log2(e)`` into the softmax scale), so ``exp2`` replaces ``exp``.

The first block a program visits must hold a key every row sees, so ``m`` is finite from then
on and ``exp2(-inf - m_new) = 0`` is safe.
"""

import jax.numpy as jnp
from jax import lax


def start(rows: int, d: int):
    """The empty carry: (acc [rows, d], m [rows], l [rows]), all f32."""
    return (jnp.zeros((rows, d), jnp.float32),
            jnp.full((rows,), -jnp.inf, jnp.float32),
            jnp.zeros((rows,), jnp.float32))


def update(carry, scores, v):
    """Fold one key block in: ``scores [rows, block_k]`` (base 2, masked keys -inf), ``v [block_k, d]``."""
    acc, m_i, l_i = carry
    m_new = jnp.maximum(m_i, jnp.max(scores, axis=1))
    alpha = jnp.exp2(m_i - m_new)
    p = jnp.exp2(scores - m_new[:, None])
    l_new = l_i * alpha + jnp.sum(p, axis=1)
    # P is cast to V's dtype before the dot, as the tensor cores want it; the sum stays f32.
    acc = acc * alpha[:, None] + jnp.dot(p.astype(v.dtype), v, precision=lax.Precision.HIGHEST,
                                         preferred_element_type=jnp.float32)
    return acc, m_new, l_new
