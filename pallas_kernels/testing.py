"""Helpers for checking kernels: poisoned outputs and float64 NumPy references.

- :func:`poisoned_outputs` makes every kernel output start as NaN, so an element a kernel
  forgets to write shows up in a comparison, under the interpreter *and* compiled on a GPU
  (where a fresh buffer holds whatever the allocator left there, often the right answer from
  a previous call). It wraps the ``pallas_call`` the kernels use for the duration of a
  ``with`` block; outside one, nothing of it is on the kernels' path.
- :func:`matmul_f64`, :func:`attention_f64`, :func:`decode_attention_f64`: the math in float64
  NumPy, the ground truth the tests and the lessons compare against.
"""

from __future__ import annotations

import contextlib

import jax.numpy as jnp
import numpy as np


@contextlib.contextmanager
def poisoned_outputs():
    """Inside the block, every Pallas kernel's outputs start filled with NaN.

    Each output not already aliased to an input gets an extra NaN-filled input aliased to it
    (``input_output_aliases``); the kernel body never sees the extra refs.
    """
    from pallas_kernels.triton import common

    original = common.pallas_call

    def poisoning_pallas_call(kernel, *, out_shape, input_output_aliases=None, **kwargs):
        aliases = dict(input_output_aliases or {})
        outs = (out_shape,) if not isinstance(out_shape, (tuple, list)) else tuple(out_shape)
        fresh = [i for i in range(len(outs)) if i not in aliases.values()]

        def call(*args):
            n_in = len(args)
            extra = tuple(jnp.full(outs[i].shape, np.nan if jnp.issubdtype(outs[i].dtype, jnp.floating)
                                   else -1, outs[i].dtype) for i in fresh)
            al = {**aliases, **{n_in + j: i for j, i in enumerate(fresh)}}

            def body(*refs):
                kernel(*refs[:n_in], *refs[n_in + len(extra):])

            return original(body, out_shape=out_shape, input_output_aliases=al, **kwargs)(*args, *extra)

        return call

    common.pallas_call = poisoning_pallas_call
    try:
        yield
    finally:
        common.pallas_call = original


def f64(x) -> np.ndarray:
    """Any array (bf16 included) as float64 NumPy."""
    return np.asarray(jnp.asarray(x, jnp.float32), dtype=np.float64)


def rel_err(x, ref) -> float:
    """Largest absolute difference, relative to the largest magnitude of ``ref``."""
    x, ref = f64(x), f64(ref)
    return float(np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1e-30))


def matmul_f64(a, b) -> np.ndarray:
    return f64(a) @ f64(b)


def attention_f64(q, k, v, visible, sm_scale=None) -> np.ndarray:
    """Softmax attention in float64: q ``[B,T,Hq,D]``, k/v ``[B,S,Hkv,D]``, ``visible``
    broadcastable to ``[B,T,S]`` (True where query t sees key s). Query head h uses KV head
    ``h // (Hq // Hkv)``."""
    q, k, v = f64(q), f64(k), f64(v)
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    s = np.einsum("bthd,bshd->bhts", q, k) * scale
    s = np.where(np.broadcast_to(visible, (q.shape[0], q.shape[1], k.shape[1]))[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", p, v)


def flash_attention_f64(q, k, v, causal=True, sm_scale=None, q_offsets=None) -> np.ndarray:
    """:func:`attention_f64` with the kernels' causal rule: query i sees keys j <= i + S - T, or
    j <= q_offsets[b] + i when the offsets are given."""
    t, s = q.shape[1], k.shape[1]
    if q_offsets is not None:
        offsets = np.asarray(q_offsets)[:, None, None]
        return attention_f64(q, k, v, np.arange(s)[None, None, :] <= np.arange(t)[None, :, None] + offsets, sm_scale)
    visible = np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t) if causal else np.ones((t, s), bool)
    return attention_f64(q, k, v, visible[None], sm_scale)


def decode_attention_f64(q, k_cache, v_cache, lengths, sm_scale=None) -> np.ndarray:
    """One query per row: q ``[B,Hq,D]`` over the first ``lengths[b]`` keys of each cache row."""
    s = k_cache.shape[1]
    visible = (np.arange(s)[None, :] < np.asarray(lengths)[:, None])[:, None, :]
    return attention_f64(np.asarray(f64(q))[:, None], k_cache, v_cache, visible, sm_scale)[:, 0]


def paged_decode_attention_f64(q, k_pages, v_pages, block_tables, lengths, sm_scale=None) -> np.ndarray:
    """Paged decode attention's ground truth: each row's blocks gathered in NumPy, then
    :func:`decode_attention_f64` over them."""
    tables = np.asarray(block_tables)
    b, pages = tables.shape
    k, v = np.asarray(f64(k_pages)), np.asarray(f64(v_pages))
    rows_k = k[tables].reshape(b, pages * k.shape[1], *k.shape[2:])
    rows_v = v[tables].reshape(b, pages * v.shape[1], *v.shape[2:])
    return decode_attention_f64(q, rows_k, rows_v, lengths, sm_scale)


def ragged_paged_attention_f64(q, k_pages, v_pages, block_tables, query_start, context_lens,
                               sm_scale=None) -> np.ndarray:
    """Ragged paged attention's ground truth, request by request: its blocks gathered in NumPy, its
    tokens at the last positions of its context, causal (:func:`flash_attention_f64` with offsets);
    zeros for the tokens past ``query_start[R]``."""
    q, tables = f64(q), np.asarray(block_tables)
    starts, lens = np.asarray(query_start), np.asarray(context_lens)
    k, v = f64(k_pages), f64(v_pages)
    out = np.zeros_like(q)
    for i in range(tables.shape[0]):
        a, b = int(starts[i]), int(starts[i + 1])
        if a == b:
            continue
        rows_k = k[tables[i]].reshape(-1, *k.shape[2:])[None, :lens[i]]
        rows_v = v[tables[i]].reshape(-1, *v.shape[2:])[None, :lens[i]]
        out[a:b] = flash_attention_f64(q[None, a:b], rows_k, rows_v, sm_scale=sm_scale,
                                       q_offsets=[lens[i] - (b - a)])[0]
    return out
