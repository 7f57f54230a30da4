"""The lab's decoder-only transformer: Llama-style, written to be read in one sitting.

    tokens -> embedding -> n_layers x [ RMSNorm -> GQA attention (RoPE) -> + residual
                                        RMSNorm -> SwiGLU MLP          -> + residual ]
           -> RMSNorm -> output head -> logits

Two layers of code:

1. **Pure functions over a dict of arrays** (:func:`prefill_forward`, :func:`decode_forward`,
   :func:`verify_forward`, :func:`step_forward` (a serving engine's mixed batch), :func:`forward`).
   They are what the runtime and the serving engine jit. Every matmul is :func:`dense`:
   ``pk.matmul`` on a 2-D view (``pk.quantized_matmul`` for a quantized weight,
   :mod:`inference_lab.model.quantize`), prefill attention is ``pk.flash_attention``, decode
   attention is ``pk.decode_attention`` (over an int8 cache too, ``kv_cache.QuantizedKV``), all
   with the same ``mode``. Head counts and the vocabulary size
   are read from the *local* weight shapes, and the two partial sums of a tensor-parallel
   layer are ``psum``-ed over the mesh axis ``"tp"`` only when that axis exists, so the same
   functions run unchanged inside ``shard_map`` (Megatron layout: ``parallel.PARTITION``).
   One :func:`block` serves every phase; only its attention differs (whole prompts through
   flash attention in prefill, one token against the cache in decode, both at once in a
   serving step).
2. :class:`Transformer`, a Flax NNX module that owns the parameters (seeded initialiser,
   safetensors save/load) and hands them out with :meth:`Transformer.params`.

Parameter layout (``D`` = d_model, ``Hq``/``Hkv`` query/KV heads, ``G = Hq / Hkv``, ``Dh`` =
head_dim, ``F`` = d_ff, ``V`` = vocab):

========== ===================== ====================================================
name       shape                 meaning
========== ===================== ====================================================
embed      [V, D]                token embedding (untied models only)
head       [D, V]                output head; a tied model gathers its embedding rows
                                 from the columns of this matrix (no transposed copy)
final_norm [D]                   RMSNorm scale before the head
attn_norm  [D]                   per layer
w_qkv      [D, Hkv, G + 2, Dh]   per layer: for each KV head, its G query heads, then K, V
w_o        [Hq * Dh, D]          per layer: rows ordered like the query heads
mlp_norm   [D]                   per layer
w_gate_up  [D, 2, F]             per layer: SwiGLU gate and up projections
w_down     [F, D]                per layer
b_qkv      [Hkv, G + 2, Dh]      per layer, only with ``cfg.qkv_bias`` (Qwen2): Q/K/V biases
========== ===================== ====================================================

Q, K and V come out of one matmul (and gate/up out of another) because on a GPU a batch-1
decode step is a few dozen small kernels per layer and each launch costs microseconds;
grouping the weights by KV head keeps the fused matrix splittable across devices: cutting
axis 1 of ``w_qkv`` gives each device whole KV heads with their query heads. Query head
``h`` uses KV head ``h // G``, the convention of ``pk.flash_attention``/``decode_attention``.

A new model's weights are random (seeded): the timing lessons measure speed, and how long a
matmul takes does not depend on the values in it. Trained weights load from a local file
(:meth:`Transformer.load`); the lab ships one small trained model (:mod:`inference_lab.model.pretrained`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

import pallas_kernels as pk
from inference_lab.model import kv_cache, parallel, quantize, weights
from inference_lab.model.rotary import rope
from inference_lab.base import checks, random_arrays
from inference_lab.base.config import ModelConfig
from inference_lab.model.weights import layer_params


# ----------------------------------------------------------------------------- input checks
def check_tokens(tokens, name: str, ndim: int, cfg: ModelConfig, *, drawn_on_device: bool = False) -> np.ndarray:
    """``tokens`` as int32 after checking, on the host, everything a compiled program would
    get wrong silently: the rank, integer ids inside the vocabulary (``jnp.take`` gives NaN rows
    for ids >= V and wraps negative ones, without a word) and at most ``cfg.max_seq_len``
    positions per row.

    One exception (``drawn_on_device``): the tokens the lab's own sampler just drew, fed back
    to the next decode step, are checked for their shape and dtype only, because reading their
    values would copy them to the host and wait for the device on every decode step (the
    sampler draws only ids inside the vocabulary). Every other input, a jax array on the device
    included, is range-checked: one host copy per call.
    """
    on_device = drawn_on_device and isinstance(tokens, jax.Array) and ndim == 1
    arr = tokens if on_device else np.asarray(tokens)
    if arr.ndim != ndim:
        want = "[B, T]" if ndim == 2 else "[B]"
        raise ValueError(f"{name} has shape {tuple(arr.shape)}; it must be {want} token ids")
    if arr.size == 0:
        raise ValueError(f"{name} is empty; give at least one token per row")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} has dtype {arr.dtype}; token ids must be integers (int32)")
    if ndim == 2 and arr.shape[1] > cfg.max_seq_len:
        raise ValueError(f"{name} has {arr.shape[1]} positions per row, past the model's "
                         f"max_seq_len={cfg.max_seq_len}; shorten the prompts")
    if on_device:
        return arr.astype(jnp.int32)
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= cfg.vocab_size:
        raise ValueError(f"{name} holds ids in [{lo}, {hi}] but the vocabulary is 0..{cfg.vocab_size - 1}; "
                         "fix the ids (the tokenizer only makes 0..258)")
    return arr.astype(np.int32)


# ----------------------------------------------------------------------------- small pieces
def dense(x, w, mode, out_dtype=None):
    """``x [..., K] @ w`` with ``w`` of shape ``[K, ...]`` through ``pk.matmul`` on 2-D views
    (``pk.quantized_matmul`` when ``w`` is a :class:`~inference_lab.model.quantize.QuantizedWeight`)."""
    k = x.shape[-1]
    if isinstance(w, quantize.QuantizedWeight):
        y = pk.quantized_matmul(x.reshape(-1, k), w.q, w.scales, group_size=w.group_size,
                                activations=w.activations, out_dtype=out_dtype, mode=mode)
    else:
        y = pk.matmul(x.reshape(-1, k), w.reshape(k, -1), out_dtype=out_dtype, mode=mode)
    return y.reshape(*x.shape[:-1], y.shape[-1])


def rms_norm(x, scale, eps):
    """``x / sqrt(mean(x^2) + eps) * scale`` over the last axis, computed in float32."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def _embed(params, tokens, cfg):
    """Gather embedding rows for ``tokens`` (any shape) -> [..., D]."""
    if "embed" in params:
        table, axis = params["embed"], 0          # [V, D]
    else:
        table, axis = params["head"], 1           # tied: columns of [D, V]
    if isinstance(table, quantize.QuantizedWeight):   # tied and quantized: widen only the gathered columns
        return jnp.moveaxis(table.dequantize(columns=tokens), 0, -1)
    if table.shape[axis] < cfg.vocab_size:       # vocabulary split over "tp": parallel assembles the rows
        return parallel.embed_split_vocabulary(table, tokens, axis=axis)
    x = jnp.take(table, tokens, axis=axis)
    return jnp.moveaxis(x, 0, -1) if axis == 1 else x   # a tied table's columns: [D, ...] -> [..., D]


def _logits(params, x, cfg, mode):
    """Final RMSNorm and output head: x [N, D] -> float32 logits [N, V]."""
    x = rms_norm(x, params["final_norm"], cfg.norm_eps)
    logits = dense(x, params["head"], mode, out_dtype=jnp.float32)
    if logits.shape[-1] < cfg.vocab_size:         # vocabulary split over "tp": each device has a slice
        logits = parallel.gather_vocabulary(logits)
    return logits


def _qkv(p, h, positions, cfg, mode):
    """h [..., D] -> q [..., Hq, Dh], k, v [..., Hkv, Dh] with RoPE applied to q and k."""
    _, hkv, g2, dh = p["w_qkv"].shape           # local head counts come from the weight
    qkv = dense(h, p["w_qkv"], mode).reshape(*h.shape[:-1], hkv, g2, dh)
    if "b_qkv" in p:   # Qwen2's biases, added before RoPE as its attention adds them
        qkv = qkv + p["b_qkv"].astype(qkv.dtype)
    q = qkv[..., : g2 - 2, :].reshape(*h.shape[:-1], hkv * (g2 - 2), dh)
    k, v = qkv[..., g2 - 2, :], qkv[..., g2 - 1, :]
    theta, scaling = cfg.rope_theta, cfg.rope_scaling
    return rope(q, positions, theta, scaling), rope(k, positions, theta, scaling), v


def _attention_out(p, attn, mode):
    """Heads [..., Hq, Dh] -> [..., D]: the output projection (partial sums under tp, added)."""
    return parallel.psum_tp(dense(attn.reshape(*attn.shape[:-2], -1), p["w_o"], mode))


def mlp(p, h, mode):
    """SwiGLU: ``down(silu(gate(h)) * up(h))`` (partial sums under tp, added)."""
    f = p["w_gate_up"].shape[-1]
    gu = dense(h, p["w_gate_up"], mode).reshape(*h.shape[:-1], 2, f)
    act = jax.nn.silu(gu[..., 0, :].astype(jnp.float32)) * gu[..., 1, :].astype(jnp.float32)
    return parallel.psum_tp(dense(act.astype(h.dtype), p["w_down"], mode))


# ----------------------------------------------------------------------------- attention, two ways
def prefill_attention(p, h, kc, vc, *, positions, cfg, mode):
    """Causal self-attention over whole prompts. h [B, T, D]; the prompt's K/V are written
    at positions 0..T-1 of the layer's caches kc, vc [B, S, Hkv, Dh]."""
    q, k, v = _qkv(p, h, positions, cfg, mode)                     # [B,T,Hq,Dh], [B,T,Hkv,Dh]
    attn = pk.flash_attention(q, k, v, causal=True, mode=mode)      # [B, T, Hq, Dh]
    kc, vc = kv_cache.write_prefix(kc, k), kv_cache.write_prefix(vc, v)   # an int8 cache rounds them
    return _attention_out(p, attn, mode), kc, vc


def decode_attention(p, h, kc, vc, *, lengths, cfg, mode):
    """One new token per row. h [B, D]; its K/V go to position ``lengths[b]`` of the donated
    caches, in place (inside the kernel on the Pallas path: no separate scatter), and it
    attends to ``lengths[b] + 1`` keys."""
    q, k, v = _qkv(p, h, lengths, cfg, mode)                       # [B,Hq,Dh], [B,Hkv,Dh]
    if isinstance(kc, kv_cache.QuantizedKV):   # an int8 cache: round and write the new K/V, then read
        rows = jnp.arange(h.shape[0])
        kc, vc = kv_cache.write_rows(kc, rows, lengths, k), kv_cache.write_rows(vc, rows, lengths, v)
        attn = pk.decode_attention(q, kc.values, vc.values, lengths + 1, k_scales=kc.scales, v_scales=vc.scales,
                                   mode=mode)
        return _attention_out(p, attn, mode), kc, vc
    attn, kc, vc = pk.decode_attention(q, kc, vc, lengths + 1, k_new=k.astype(kc.dtype),
                                       v_new=v.astype(vc.dtype), mode=mode)   # [B, Hq, Dh]
    return _attention_out(p, attn, mode), kc, vc


def verify_attention(p, h, kc, vc, *, lengths, cfg, mode):
    """``T`` new tokens per row, at positions ``lengths[b] .. lengths[b] + T - 1`` (speculative
    decoding's check of ``T - 1`` guesses). h [B, T, D]. Q, K and V of all ``T`` tokens come out of
    one matmul (the weights are read once, as in prefill) and their K/V go into the caches at
    once. Attention is the decode kernel, called once for all ``B x T`` tokens: token ``j`` of row
    ``b`` is one query over row ``b``'s cache that sees ``lengths[b] + j + 1`` keys, the cache and
    the new tokens up to itself, exactly as ``T`` decode steps would. Each token's query needs its
    row's cache, so the cache is repeated ``T`` times for the call (a copy, small next to the
    weights at the contexts speculation is used at); one call rather than ``T`` matters on a
    CPU, where each call of a small kernel costs a fixed tenth of a millisecond or more."""
    b, t = h.shape[:2]
    positions = lengths[:, None] + jnp.arange(t, dtype=jnp.int32)     # [B, T]
    q, k, v = _qkv(p, h, positions, cfg, mode)                      # [B,T,Hq,Dh], [B,T,Hkv,Dh]
    rows = jnp.arange(b)[:, None]
    kc = kc.at[rows, positions].set(k.astype(kc.dtype), mode="promise_in_bounds")
    vc = vc.at[rows, positions].set(v.astype(vc.dtype), mode="promise_in_bounds")
    attn = pk.decode_attention(q.reshape(b * t, *q.shape[2:]), jnp.repeat(kc, t, axis=0),
                               jnp.repeat(vc, t, axis=0), (positions + 1).reshape(b * t), mode=mode)
    return _attention_out(p, attn.reshape(b, t, *attn.shape[1:]), mode), kc, vc


def step_attention(p, h, kc, vc, *, decode_lengths, decode_active, chunk_bounds, chunk_slots, chunk_starts, cfg, mode,
                   block_table=None, chunk_unit=None):
    """A serving iteration's attention: h [Wd + T, D] holds one decode token for each of the first
    Wd rows of the cache, then the iteration's prompt chunks back to back in T token places: chunk
    ``i`` is tokens ``chunk_bounds[i]:chunk_bounds[i + 1]`` of them ([R + 1], non-decreasing; an
    empty chunk and the places past ``chunk_bounds[R]`` pad the compiled shape), it belongs to row
    ``chunk_slots[i]`` and starts at its position ``chunk_starts[i]``. Q, K and V of every token come
    out of one matmul, and every new K/V goes into the cache at once, in one scatter, in place: a
    decode token's at ``decode_lengths`` of its row (only where ``decode_active``: a free or
    still-prefilling row rides along in the decode batch and writes nothing), a chunk's from
    ``chunk_starts`` of its row (positions past the context are dropped). ``chunk_unit`` (static):
    the chunks' tokens, each rounded up to a multiple of it, fit the T places (the engine packs
    its steps so), which bounds the attention's work at T / ``chunk_unit`` query blocks.

    Then ``pk.ragged_paged_attention`` for every token: each decode token and each chunk is a run of
    queries at the end of its row's context, reading its row's keys where they are (no row gathered
    into a copy). It sees what earlier iterations wrote, the chunks before it in this one and
    itself, causally.

    The cache is a paged pool kc, vc [N, block_size, Hkv, Dh] read through ``block_table`` [rows,
    pages] (:mod:`inference_lab.serving.blocks`), or contiguous rows [rows, S, Hkv, Dh], which are
    the same to the kernel: a pool of each row's blocks in order (:func:`contiguous_pool`)."""
    contiguous = block_table is None
    if contiguous:
        block_table = contiguous_table(kc)
        kc, vc = contiguous_pool(kc), contiguous_pool(vc)
    wd, r = decode_lengths.shape[0], chunk_slots.shape[0]
    t = h.shape[0] - wd
    n_blocks, bs = kc.shape[:2]
    context = block_table.shape[1] * bs
    place = jnp.arange(t, dtype=jnp.int32)
    owner = jnp.clip(jnp.searchsorted(chunk_bounds[1:], place, side="right"), 0, max(r - 1, 0))   # [T] its chunk
    chunk_positions = chunk_starts[owner] + place - chunk_bounds[owner]
    positions = jnp.concatenate([decode_lengths, chunk_positions])
    q, k, v = _qkv(p, h, positions, cfg, mode)                                     # [N,Hq,Dh], [N,Hkv,Dh]
    rows = jnp.concatenate([jnp.arange(wd, dtype=jnp.int32), chunk_slots[owner]])
    real = jnp.concatenate([decode_active, place < chunk_bounds[r]])
    valid = real & (positions < context)
    block = block_table.at[rows, positions // bs].get(mode="fill", fill_value=n_blocks)
    at = jnp.where(valid, block * bs + positions % bs, n_blocks * bs)             # flat position in the pool
    k_new, v_new = k.astype(kc.dtype), v.astype(vc.dtype)
    # Every new K/V first, in one scatter per cache over the pool seen flat (a write with no place
    # lands past it and is dropped), then the reads: XLA updates the donated pool in place and no
    # kernel reads a stale copy.
    if at.shape[0] == 1:
        # One write would become a dynamic-update-slice that reads the old value (for a dropped
        # write) while it updates the pool, and XLA:CPU keeps the old pool alive with a copy of the
        # whole cache, every layer, every step; a second write, always dropped, keeps it a scatter.
        at, k_new, v_new = jnp.append(at, n_blocks * bs), jnp.concatenate([k_new] * 2), jnp.concatenate([v_new] * 2)
    flat = (n_blocks * bs, *kc.shape[2:])
    kc = kc.reshape(flat).at[at].set(k_new, mode="drop").reshape(kc.shape)
    vc = vc.reshape(flat).at[at].set(v_new, mode="drop").reshape(vc.shape)
    # Two calls of the one kernel, as FlashInfer's decode and prefill wrappers split an iteration:
    # the decode rows (a run of 1 query each), then the chunks (a run of any length each). A chunk
    # past the context (a verify lane that checks nothing) attends to its row's first positions
    # instead: answers nobody reads, at a place that exists.
    outs = []
    if wd:
        starts = jnp.arange(wd + 1, dtype=jnp.int32)
        outs.append(pk.ragged_paged_attention(q[:wd], kc, vc, block_table[:wd], starts,
                                              (decode_lengths + 1).astype(jnp.int32), max_query_len=1, mode=mode))
    if r:
        n = chunk_bounds[1:] - chunk_bounds[:-1]
        ends = jnp.where(chunk_starts + n <= context, chunk_starts + n, n).astype(jnp.int32)
        outs.append(pk.ragged_paged_attention(q[wd:], kc, vc, block_table[chunk_slots], chunk_bounds, ends,
                                              max_query_len=t, query_unit=chunk_unit, mode=mode))
    attn = jnp.concatenate(outs) if len(outs) > 1 else outs[0]
    if contiguous:
        kc, vc = kc.reshape(-1, context, *kc.shape[2:]), vc.reshape(-1, context, *vc.shape[2:])
    return _attention_out(p, attn, mode), kc, vc


CONTIGUOUS_BLOCK = 64   # positions a contiguous row's "block" holds when the ragged kernel reads it as a pool


def _contiguous_block(context: int) -> int:
    """The largest power of two up to :data:`CONTIGUOUS_BLOCK` that divides the row (at least 16:
    the kernel's dot reads 16 keys or more at a time)."""
    for b in (CONTIGUOUS_BLOCK, 32, 16):
        if context % b == 0:
            return b
    raise ValueError(f"a contiguous cache row of {context} positions cannot be read as blocks of 16 or more: "
                     "make the cache length a multiple of 16")


def contiguous_pool(cache):
    """Contiguous rows [rows, S, Hkv, Dh] seen as a pool of blocks [rows * S / b, b, Hkv, Dh] (a
    reshape: no copy), row ``r``'s blocks in order from ``r * S / b``."""
    rows, context = cache.shape[:2]
    b = _contiguous_block(context)
    return cache.reshape(rows * (context // b), b, *cache.shape[2:])


def contiguous_table(cache):
    """The block table of :func:`contiguous_pool`: row ``r`` owns blocks ``r * P .. r * P + P - 1``."""
    rows, context = cache.shape[:2]
    pages = context // _contiguous_block(context)
    return jnp.arange(rows * pages, dtype=jnp.int32).reshape(rows, pages)


# ----------------------------------------------------------------------------- the block and forwards
def block(p, x, kc, vc, attention, *, cfg, mode):
    """One transformer layer, read like nanoGPT's ``Block``::

        x = x + attention(norm(x))      # also writes this layer's K/V into its cache
        x = x + mlp(norm(x))

    ``attention`` is :func:`prefill_attention` or :func:`decode_attention` with its
    positions bound; the rest of the layer is the same in both phases.
    """
    a, kc, vc = attention(p, rms_norm(x, p["attn_norm"], cfg.norm_eps), kc, vc)
    x = x + a
    x = x + mlp(p, rms_norm(x, p["mlp_norm"], cfg.norm_eps), mode)
    return x, kc, vc


def _layers(params, x, k_caches, v_caches, attention, cfg, mode):
    new_k, new_v = [], []
    for p, kc, vc in zip(params["layers"], k_caches, v_caches):   # unrolled: one kernel chain
        x, kc, vc = block(p, x, kc, vc, attention, cfg=cfg, mode=mode)
        new_k.append(kc)
        new_v.append(vc)
    return x, new_k, new_v


def prefill_forward(params, tokens, lengths, k_caches, v_caches, *, cfg, mode, all_logits=False):
    """Run prompts through the model and write their K/V at positions 0..T-1 of the caches.

    params: :meth:`Transformer.params` dict. tokens [B, T] int32 (right-padded); lengths [B]
    int32 in 1..T; k_caches/v_caches: per-layer lists of [B, S, Hkv, Dh] with S >= T.
    Returns (logits, k_caches, v_caches): float32 logits [B, V] at each row's last real token
    (position ``lengths[b] - 1``), or [B, T, V] at every position if ``all_logits``.
    Padded positions compute garbage K/V behind the real ones; decode overwrites them.
    """
    b, t = tokens.shape
    x = _embed(params, tokens, cfg)                               # [B, T, D]
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    attention = functools.partial(prefill_attention, positions=positions, cfg=cfg, mode=mode)
    x, new_k, new_v = _layers(params, x, k_caches, v_caches, attention, cfg, mode)
    if all_logits:
        return _logits(params, x.reshape(b * t, -1), cfg, mode).reshape(b, t, -1), new_k, new_v
    last = x[jnp.arange(b), lengths - 1]                          # [B, D]
    return _logits(params, last, cfg, mode), new_k, new_v


def decode_forward(params, tokens, lengths, k_caches, v_caches, *, cfg, mode):
    """One decode step for every row: tokens [B] int32 at positions ``lengths[b]``.

    Returns (float32 logits [B, V], k_caches, v_caches). ``lengths`` is not advanced here.
    """
    x = _embed(params, tokens, cfg)                               # [B, D]
    attention = functools.partial(decode_attention, lengths=lengths, cfg=cfg, mode=mode)
    x, new_k, new_v = _layers(params, x, k_caches, v_caches, attention, cfg, mode)
    return _logits(params, x, cfg, mode), new_k, new_v


def verify_forward(params, tokens, lengths, k_caches, v_caches, *, cfg, mode):
    """``T`` tokens per row at positions ``lengths[b]`` onwards: tokens [B, T] int32. Returns
    (float32 logits [B, T, V] at every new position, k_caches, v_caches); ``lengths`` is not
    advanced here. With ``T = 1`` it is :func:`decode_forward`."""
    _float_cache_only(cfg, "speculative decoding's verify step")
    b, t = tokens.shape
    x = _embed(params, tokens, cfg)                               # [B, T, D]
    attention = functools.partial(verify_attention, lengths=lengths, cfg=cfg, mode=mode)
    x, new_k, new_v = _layers(params, x, k_caches, v_caches, attention, cfg, mode)
    return _logits(params, x.reshape(b * t, -1), cfg, mode).reshape(b, t, -1), new_k, new_v


def step_forward(params, decode_tokens, decode_lengths, decode_active, chunk_tokens, chunk_bounds, chunk_slots,
                 chunk_starts, head_rows, k_caches, v_caches, *, cfg, mode, block_table=None, chunk_unit=None):
    """One iteration of a serving engine in one forward (vLLM v1's token-budget step): decode
    tokens [Wd] for the first Wd rows of the caches at positions ``decode_lengths`` [Wd] (rows
    whose ``decode_active`` [Wd] is False ride along, their work dropped), and R prompt chunks of
    any lengths back to back in ``chunk_tokens`` [T]: chunk ``i`` is tokens ``chunk_bounds[i] :
    chunk_bounds[i + 1]`` ([R + 1]), written into row ``chunk_slots[i]`` from position
    ``chunk_starts[i]`` ([R] each; :func:`step_attention`). Either group may be empty (Wd = 0 or
    T = R = 0). Every weight is read once for all ``Wd + T`` tokens. Returns (float32 logits [H, V]
    for the tokens at ``head_rows`` [H] only, indices into the decode tokens then the chunk tokens:
    the head runs where a token is sampled, not at every prompt position; k_caches, v_caches); no
    length is advanced here. With ``block_table`` [rows, P] the caches are pools of blocks (a paged
    cache). ``chunk_unit``: see :func:`step_attention`."""
    _float_cache_only(cfg, "the serving engine's step")
    tokens = jnp.concatenate([decode_tokens, chunk_tokens])
    x = _embed(params, tokens, cfg)                               # [Wd + T, D]
    attention = functools.partial(step_attention, decode_lengths=decode_lengths, decode_active=decode_active,
                                  chunk_bounds=chunk_bounds, chunk_slots=chunk_slots, chunk_starts=chunk_starts,
                                  cfg=cfg, mode=mode, block_table=block_table, chunk_unit=chunk_unit)
    x, new_k, new_v = _layers(params, x, k_caches, v_caches, attention, cfg, mode)
    return _logits(params, x[head_rows], cfg, mode), new_k, new_v


def _float_cache_only(cfg, what: str) -> None:
    if cfg.kv_cache_dtype != "auto":
        raise ValueError(f"kv_cache_dtype={cfg.kv_cache_dtype!r}: {what} keeps float caches so far; the int8 KV "
                         "cache runs prefill and decode (generate, decode_loop, the probe)")


def forward(params, tokens, *, cfg, mode):
    """Logits at every position, no cache: tokens [B, T] -> float32 [B, T, V]."""
    b, t = tokens.shape
    _, hkv, _, dh = params["layers"][0]["w_qkv"].shape
    dtype = params["layers"][0]["w_qkv"].dtype
    caches = [jnp.zeros((b, t, hkv, dh), dtype) for _ in params["layers"]]
    lengths = jnp.full((b,), t, jnp.int32)
    logits, _, _ = prefill_forward(params, tokens, lengths, caches, list(caches), cfg=cfg, mode=mode,
                                   all_logits=True)
    return logits


# ----------------------------------------------------------------------------- the module
class _Initializer:
    """Draws each weight as ``std * N(0, 1)`` (std = 1/sqrt(fan_in)), all from one seed
    (:func:`random_arrays.normal`, seeded by the key's words and the weight's index).

    Models up to ``HOST_MAX_PARAMS`` parameters are drawn by NumPy on the host, whatever each
    weight's size: no compile per weight shape (each costs ~0.3 s on a busy 2-core CPU), ~1 s for
    the 56M ``small``. Larger models are drawn by ``jax.random`` on the device, where NumPy would
    take minutes. Either way the same seed gives the same weights for a given preset on every
    machine.
    """

    HOST_MAX_PARAMS = 300_000_000

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.key = rngs.params()
        self.count = 0
        self.on_host = cfg.num_params <= self.HOST_MAX_PARAMS
        if self.on_host:   # the key's words seed NumPy (a large model may be built traced: no words then)
            self.entropy = [int(w) for w in np.asarray(jax.random.key_data(self.key)).ravel()]

    def __call__(self, shape, std, dtype):
        i, self.count = self.count, self.count + 1
        seed = self.entropy + [i] if self.on_host else jax.random.fold_in(self.key, i)
        return random_arrays.normal(shape, dtype, seed, std=std)


class LayerWeights(nnx.Module):
    """One transformer layer's parameters (the math lives in the pure functions above)."""

    def __init__(self, cfg: ModelConfig, init: _Initializer | None = None, weights: dict | None = None):
        if weights is not None:  # existing arrays (Transformer.load): no init work
            for name in layer_params(cfg):
                setattr(self, name, nnx.Param(weights[name]))
            return
        d, dh, f = cfg.d_model, cfg.head_dim, cfg.d_ff
        hkv, g = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads
        dt = jnp.dtype(cfg.dtype)
        # Scaled normal init (std 1/sqrt(fan_in)) keeps activations O(1) through the layers.
        self.attn_norm = nnx.Param(jnp.ones((d,), dt))
        self.w_qkv = nnx.Param(init((d, hkv, g + 2, dh), d ** -0.5, dt))
        self.w_o = nnx.Param(init((cfg.n_heads * dh, d), (cfg.n_heads * dh) ** -0.5, dt))
        self.mlp_norm = nnx.Param(jnp.ones((d,), dt))
        self.w_gate_up = nnx.Param(init((d, 2, f), d ** -0.5, dt))
        self.w_down = nnx.Param(init((f, d), f ** -0.5, dt))
        if cfg.qkv_bias:
            self.b_qkv = nnx.Param(jnp.zeros((hkv, g + 2, dh), dt))


class Transformer(nnx.Module):
    """The lab's model. ``Transformer(cfg, rngs=nnx.Rngs(0), kernels="auto")``.

    ``kernels``: a mode string for ``pallas_kernels`` (``"auto"``, ``"pallas"``, ``"triton"``,
    ``"mosaic"``, ``"interpret"``, ``"mosaic_interpret"``, ``"reference"``: see
    :mod:`pallas_kernels.mode`); the model keeps what it resolved to on this machine in
    ``model.kernels``. ``params=`` builds the module around existing weights (a
    :meth:`params` dict) instead of initialising new ones. ``mesh=``: a jax Mesh with the axis
    ``"tp"`` to split the weights over (tensor parallelism, :mod:`inference_lab.model.parallel`;
    ``parallel.shard(model, mesh)`` is the usual way to get one); None for one device.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs | None = None, kernels: str = "auto",
                 params: dict | None = None, mesh=None):
        if not isinstance(cfg, ModelConfig):
            raise ValueError(f"cfg must be a ModelConfig (e.g. ModelConfig.preset('tiny')), got {type(cfg).__name__}")
        self.cfg = cfg
        self.kernels = pk.mode.resolve_mode(kernels)
        self.mesh = None if mesh is None else parallel.check_mesh(mesh)
        if mesh is not None:
            checks.tensor_parallel(cfg, mesh.shape[parallel.AXIS])
            if (params is not None and quantize.is_quantized(params)) or cfg.kv_cache_dtype != "auto":
                raise ValueError("mesh= with quantized params or an int8 KV cache: tensor parallelism splits float "
                                 "weights and caches only; use the float model, or mesh=None")
        if params is not None:
            weights.check_params(cfg, params)  # before any array is placed on a device
            self._adopt(params if mesh is None else parallel.place_params(params, mesh))
            return
        init = _Initializer(cfg, nnx.Rngs(0) if rngs is None else rngs)
        dt = jnp.dtype(cfg.dtype)
        v, d = cfg.vocab_size, cfg.d_model
        if not cfg.tie_embeddings:
            self.embed = nnx.Param(init((v, d), 1.0, dt))
        self.head = nnx.Param(init((d, v), d ** -0.5, dt))
        self.final_norm = nnx.Param(jnp.ones((d,), dt))
        self.layers = nnx.List([LayerWeights(cfg, init) for _ in range(cfg.n_layers)])
        if mesh is not None:
            self._adopt(parallel.place_params(self.params(), mesh))

    def _adopt(self, params: dict) -> None:  # params checked by weights.check_params
        if "embed" in params:
            self.embed = nnx.Param(params["embed"])
        self.head = nnx.Param(params["head"])
        self.final_norm = nnx.Param(params["final_norm"])
        self.layers = nnx.List([LayerWeights(self.cfg, weights=lp) for lp in params["layers"]])

    # -- the arrays, as the pure functions want them
    def params(self) -> dict:
        """The weights as a plain dict (no copies): the layout in the module docstring."""
        # get_raw_value(): the stored array itself, ~20x cheaper than `param[...]` (which
        # walks nnx's variable machinery); this runs on every engine call.
        out = {"head": self.head.get_raw_value(), "final_norm": self.final_norm.get_raw_value(),
               "layers": [{name: getattr(blk, name).get_raw_value() for name in layer_params(self.cfg)}
                          for blk in self.layers]}
        if not self.cfg.tie_embeddings:
            out["embed"] = self.embed.get_raw_value()
        return out

    def with_kv_cache_dtype(self, kv_cache_dtype: str) -> "Transformer":
        """This model (the same weights) with its KV caches stored as ``kv_cache_dtype``: "auto"
        (the model's dtype) or "int8" (``kv_cache.QuantizedKV``: a float32 scale per token and KV head)."""
        if self.mesh is not None and kv_cache_dtype != "auto":
            raise ValueError("with_kv_cache_dtype(): this model is split over a mesh; the int8 KV cache is for one device")
        return type(self)(self.cfg.replace(kv_cache_dtype=kv_cache_dtype), kernels=self.kernels, params=self.params())

    def quantized(self, scheme: str, group_size: int | None = None, *, activations: str = "auto") -> "Transformer":
        """This model with its streamed matrices quantized (``scheme`` "int8", "int4" or "none";
        :func:`inference_lab.model.quantize.quantize`): a new Transformer, same config and kernels."""
        if self.mesh is not None:
            raise ValueError("quantized(): this model is split over a mesh; quantize the one-device model")
        group_size = quantize.group_size_for(scheme, group_size)
        if self.cfg.quantization != "none":
            raise ValueError(f"quantized(): this model is already {self.cfg.quantization}; quantize the float model")
        cfg = self.cfg.replace(quantization=scheme, group_size=group_size)   # checks that the shapes can be packed
        params = quantize.quantize(self.params(), scheme, group_size, activations=activations)
        return type(self)(cfg, kernels=self.kernels, params=params)

    @property
    def nbytes(self) -> int:
        """Bytes of all stored weights."""
        return sum(x.nbytes for x in jax.tree.leaves(self.params()))

    def __call__(self, tokens) -> jax.Array:
        """Logits at every position without a cache: tokens [B, T] -> float32 [B, T, V]."""
        tokens = check_tokens(tokens, "tokens", 2, self.cfg)
        return _forward_jit(self.params(), jnp.asarray(tokens), cfg=self.cfg, mode=self.kernels, mesh=self.mesh)

    # -- safetensors (inference_lab.model.weights)
    def save(self, path) -> None:
        """Write the weights (dtype kept, bf16 included) and the config to a safetensors file
        (whole or not at all: a full disk leaves an older file as it was)."""
        weights.save(path, self.cfg, self.params())

    @classmethod
    def load(cls, path, *, kernels: str = "auto") -> "Transformer":
        """Read a file written by :meth:`save` (the config travels inside it). Every tensor's
        name, shape and dtype is checked against that config first; a ValueError names the
        first mismatch (:func:`inference_lab.model.weights.read`)."""
        cfg, params = weights.read(path)
        return cls(cfg, kernels=kernels, params=params)


@functools.partial(jax.jit, static_argnames=("cfg", "mode", "mesh"))
def _forward_jit(params, tokens, *, cfg, mode, mesh):
    fn = functools.partial(forward, cfg=cfg, mode=mode)
    if mesh is not None:  # split weights: run per device, logits come back whole
        fn = parallel.per_device(fn, mesh, in_specs=(parallel.param_specs(params), P()), out_specs=P())
    return fn(params, tokens)


def head_counts(params) -> tuple[int, int]:
    """(query heads, KV heads) held locally, read from the weight shapes."""
    _, hkv, g2, _ = params["layers"][0]["w_qkv"].shape
    return hkv * (g2 - 2), hkv
