"""Plain-``jnp`` twins of the Pallas kernels: same signatures (minus ``mode``), same numerics.

These are what ``mode="reference"`` runs (and what ``"auto"`` runs where Pallas cannot
compile), so XLA compiles them into its own fused kernels. Numerics match the kernels:
operands in the input dtype, products accumulated in f32 (f32 inputs at
``precision=HIGHEST``: no TF32), softmax in f32, the probabilities cast to the value dtype
before they multiply V (as the kernels feed the tensor cores), output in the input dtype.

Grouped-query attention is computed by viewing the ``Hq`` query heads as ``[Hkv, G]``
(G = Hq // Hkv, query head ``h`` uses KV head ``h // G``), never by repeating K and V.
Shape and dtype checks live in the public kernel functions; these assume valid inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels import quantization

_HIGHEST = lax.Precision.HIGHEST
INT8_MIN_ROWS = 2   # XLA:CPU runs an int8 x int8 dot of fewer rows on a slow path


def matmul(a, b, *, out_dtype=None):
    """``a [M, K] @ b [K, N]`` with f32 accumulation; result in ``out_dtype`` (default a's)."""
    out_dtype = a.dtype if out_dtype is None else out_dtype
    return jnp.dot(a, b, precision=_HIGHEST, preferred_element_type=jnp.float32).astype(out_dtype)


def quantized_matmul(x, q, scales, *, group_size=None, activations="float", out_dtype=None):
    """``x [M, K]`` times a quantized weight (:mod:`pallas_kernels.quantization`: int8 ``q [K, N]``
    with ``scales [N]``, or packed int4 ``q [K/2, N]`` with ``scales [K/group_size, N]``).

    ``activations="float"``: weight-only, as the kernel computes it: the integer values in x's
    dtype, f32 sums (one per int4 group, times the group's scale), times the column scales.
    ``activations="int8"``: x quantized per row too, int8 x int8 summed in int32 (exact), then both
    scales; the form XLA:CPU runs fastest (its dot on int8 or bf16 weights with f32 activations
    converts the weight first, and runs ~15x slower than f32: docs/benchmarks.md).
    """
    out_dtype = x.dtype if out_dtype is None else out_dtype
    m, k = x.shape
    n = q.shape[1]
    int4 = q.dtype == jnp.uint8
    groups = k // group_size if int4 else 1
    if activations == "int8":
        xq, x_scales = quantization.quantize_rows(x)
        # XLA:CPU multiplies an int8 matrix by a single int8 row ~20x slower than by two (its
        # matrix-vector path is not the vectorised one: measured), so one row is padded to two.
        rows = max(m, INT8_MIN_ROWS)
        xq = jnp.pad(xq, ((0, rows - m), (0, 0)))
        w, acc_dtype = (quantization.unpack_int4(q, group_size) if int4 else q), jnp.int32
        lhs = xq
    else:
        rows, x_scales = m, None
        w = (quantization.unpack_int4(q, group_size) if int4 else q).astype(x.dtype)
        lhs, acc_dtype = x, jnp.float32
    if int4:   # one sum per group: [groups, rows, N], each times its group's scales
        acc = lax.dot_general(lhs.reshape(rows, groups, group_size), w.reshape(groups, group_size, n),
                              (((2,), (1,)), ((1,), (0,))), precision=_HIGHEST, preferred_element_type=acc_dtype)
        y = jnp.sum(acc[:, :m].astype(jnp.float32) * scales[:, None, :], axis=0)
    else:
        acc = lax.dot(lhs, w, precision=_HIGHEST, preferred_element_type=acc_dtype)
        y = acc[:m].astype(jnp.float32) * scales[None, :]
    return (y if x_scales is None else y * x_scales).astype(out_dtype)


def _attend(q, k, v, visible, sm_scale):
    """q [B,T,Hkv,G,D], k/v [B,S,Hkv,D], visible broadcastable to [B,Hkv,G,T,S] -> [B,T,Hkv,G,D]."""
    s = jnp.einsum("bthgd,bshd->bhgts", q, k, precision=_HIGHEST,
                   preferred_element_type=jnp.float32) * sm_scale
    s = jnp.where(visible, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)                         # f32; every row sees key 0
    return jnp.einsum("bhgts,bshd->bthgd", p.astype(v.dtype), v, precision=_HIGHEST,
                      preferred_element_type=jnp.float32)


def flash_attention(q, k, v, *, causal=True, sm_scale=None, q_offsets=None):
    """Attention for q [B,T,Hq,D] over k, v [B,S,Hkv,D] -> [B,T,Hq,D] (q's dtype).

    ``causal`` is aligned to the end: query ``i`` sees keys ``j <= i + (S - T)``; with
    ``q_offsets`` [B], query ``i`` of row ``b`` sees ``j <= q_offsets[b] + i``.
    ``sm_scale`` defaults to ``D ** -0.5``.
    """
    b, t, hq, d = q.shape
    s_len, hkv = k.shape[1], k.shape[2]
    sm_scale = d ** -0.5 if sm_scale is None else sm_scale
    qg = q.reshape(b, t, hkv, hq // hkv, d)
    if causal:
        i = jnp.arange(t)[:, None]
        j = jnp.arange(s_len)[None, :]
        if q_offsets is None:
            visible = j <= i + (s_len - t)                 # [T, S]
        else:                                              # [B, 1, 1, T, S]
            visible = (j[None] <= i[None] + q_offsets[:, None, None])[:, None, None]
    else:
        visible = jnp.ones((t, s_len), bool)
    out = _attend(qg, k, v, visible, sm_scale)
    return out.reshape(b, t, hq, d).astype(q.dtype)


def decode_attention(q, k_cache, v_cache, lengths, *, k_new=None, v_new=None, sm_scale=None, k_scales=None,
                     v_scales=None):
    """One query token per row: q [B,Hq,D] over caches [B,S_max,Hkv,D] -> [B,Hq,D].

    Key ``j`` of row ``b`` is visible iff ``j < lengths[b]`` (lengths in 1..S_max). With
    ``k_new``, ``v_new`` [B,Hkv,D] they are first written at ``lengths[b] - 1`` (a scatter,
    in place when the caches are donated) and ``(out, k_cache, v_cache)`` is returned.

    Written as multiply-then-sum over the cache in its stored ``[B, S, Hkv, D]`` layout rather
    than as an einsum: XLA lowers that einsum to a dot whose operands it first transposes, a
    copy of the whole cache every decode step, which on a CPU cost as much as the attention
    itself. Products are exact in f32 and summed in f32, as in the kernels.

    An int8 cache comes with ``k_scales``/``v_scales`` [B,S_max,Hkv]: each cached vector is its
    integers times its scale, widened inside the same fused multiply-then-sum (the f32 cache is
    never written out), the value scales weighing the probabilities as the kernel does.
    """
    if k_new is not None:
        rows, pos = jnp.arange(q.shape[0]), lengths - 1
        k_cache = k_cache.at[rows, pos].set(k_new, mode="promise_in_bounds")
        v_cache = v_cache.at[rows, pos].set(v_new, mode="promise_in_bounds")
        return decode_attention(q, k_cache, v_cache, lengths, sm_scale=sm_scale), k_cache, v_cache
    b, hq, d = q.shape
    s_max, hkv = k_cache.shape[1], k_cache.shape[2]
    sm_scale = d ** -0.5 if sm_scale is None else sm_scale
    f32 = jnp.float32
    qg = q.reshape(b, 1, hkv, hq // hkv, d).astype(f32)                          # [B,1,Hkv,G,D]
    s = jnp.sum(qg * k_cache[:, :, :, None, :].astype(f32), axis=-1) * sm_scale  # [B,S,Hkv,G]
    if k_scales is not None:
        s = s * k_scales[..., None]
    visible = (jnp.arange(s_max)[None, :] < lengths[:, None])[:, :, None, None]
    s = jnp.where(visible, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=1)                                                # every row sees key 0
    if v_scales is None:
        p = p.astype(v_cache.dtype).astype(f32)
    else:   # the integers are V; the scales weigh P, cast to q's dtype as the kernel's dot takes it
        p = (p * v_scales[..., None]).astype(q.dtype).astype(f32)
    out = jnp.sum(p[..., None] * v_cache[:, :, :, None, :].astype(f32), axis=1)  # [B,Hkv,G,D]
    return out.reshape(b, hq, d).astype(q.dtype)


def paged_decode_attention(q, k_pages, v_pages, block_tables, lengths, *, sm_scale=None):
    """Decode attention through block tables: q [B,Hq,D] over the pool k_pages, v_pages
    [N, block_size, Hkv, D], row ``b``'s position ``j`` in block ``block_tables[b, j // block_size]``.

    Each row's blocks are gathered into a contiguous [B, P * block_size, Hkv, D] view, then
    :func:`decode_attention` runs over it. XLA fuses the gather into the multiply-then-sum (no copy
    of the gathered cache is written); table entries past a row's length point at any block (the
    serving engine's null block), whose keys the length masks.
    """
    b, pages = block_tables.shape
    _, block_size, hkv, d = k_pages.shape
    k = k_pages[block_tables].reshape(b, pages * block_size, hkv, d)
    v = v_pages[block_tables].reshape(b, pages * block_size, hkv, d)
    return decode_attention(q, k, v, lengths, sm_scale=sm_scale)


RAGGED_CHUNK = 256   # key positions a ragged step's reference reads per loop iteration


def query_blocks(query_start, context_lens, n_blocks: int, block_q: int):
    """A ragged batch's tokens cut into ``n_blocks`` query blocks of up to ``block_q`` tokens, each
    within one request (a request of ``n`` tokens is ``ceil(n / block_q)`` blocks, in order; the
    blocks past the last real one hold nothing). For each block: its request, its first token, how
    many tokens it holds and its first token's position. Four int32 ``[n_blocks]``; what the
    ragged kernel's grid and this reference both walk."""
    r = context_lens.shape[0]
    n = query_start[1:] - query_start[:-1]                        # [R] tokens per request
    per_req = (n + block_q - 1) // block_q
    ends = jnp.cumsum(per_req)
    starts = ends - per_req
    b = jnp.arange(n_blocks, dtype=jnp.int32)
    req = jnp.minimum(jnp.searchsorted(ends, b, side="right"), r - 1).astype(jnp.int32)
    local = b - starts[req]
    first = query_start[req] + local * block_q
    count = jnp.where(b < ends[r - 1], jnp.minimum(block_q, n[req] - local * block_q), 0)
    pos = context_lens[req] - n[req] + local * block_q
    return req, first.astype(jnp.int32), count.astype(jnp.int32), pos.astype(jnp.int32)


def ragged_query_block(n_tokens: int, n_requests: int, max_query_len: int) -> int:
    """The reference's query block for a ragged batch: the mean request's tokens rounded up to a
    power of two, at least 16, at most ``max_query_len``'s: one block per request when they are
    alike, and never more than about twice the tokens' rows however they are spread."""
    mean = -(-n_tokens // max(n_requests, 1))
    pow2 = lambda n: 1 << max(int(n) - 1, 0).bit_length()  # noqa: E731
    return min(pow2(max_query_len), max(16, pow2(mean)))


def ragged_paged_attention(q, k_pages, v_pages, block_tables, query_start, context_lens, *, sm_scale=None,
                           max_query_len=None, query_unit=None):
    """One serving iteration's attention (``pk.ragged_paged_attention``): q [T, Hq, D], request ``i``'s
    tokens ``query_start[i]:query_start[i + 1]`` at the last positions of its ``context_lens[i]``,
    causal, over the pool k_pages, v_pages [N, block_size, Hkv, D] through block_tables [R, P] ->
    [T, Hq, D], zeros past ``query_start[R]``. ``max_query_len``: no request has more tokens (static;
    None: T); ``query_unit``: the requests' tokens, each rounded up to a multiple of it, fit in T
    (static; then the query blocks are ``query_unit`` tokens, ``T / query_unit`` of them).

    With one token a request (decode) the tokens are laid out by request, and the scores are decode
    attention's multiply-then-sum over the keys' stored layout. With more, they are laid out in query
    blocks ``[B, block_q]`` (:func:`query_blocks`, :func:`ragged_query_block`), and each block's
    scores are flash attention's batched dots. Either way each request's keys are read where they
    are, through its table, :data:`RAGGED_CHUNK` positions at a time (a loop with an online softmax,
    as the kernel walks its pages; no chunk past the iteration's longest context is read, and no
    request's whole row is gathered at once). The probabilities are cast to V's dtype before they
    weigh V, as the kernel's dot takes them."""
    t, hq, d = q.shape
    _, block_size, hkv, _ = k_pages.shape
    r, pages = block_tables.shape
    lq = t if max_query_len is None else int(max_query_len)
    g = hq // hkv
    sm_scale = d ** -0.5 if sm_scale is None else sm_scale
    f32 = jnp.float32
    decode = lq == 1
    if decode:        # request i's token is token i (or none)
        b, bq = r, 1
        tables = block_tables
        first = query_start[:r]
        count = query_start[1:] - query_start[:-1]
        first_pos = context_lens - count
    else:
        if query_unit is not None:     # blocks that tile each request's units: at most T / unit units of them
            bq = min(query_unit, 1 << max(lq - 1, 0).bit_length())
            b = min(-(-t // query_unit) * (query_unit // bq), r * -(-lq // bq))
        else:
            bq = ragged_query_block(t, r, lq)
            b = min(-(-t // bq) + r, r * -(-lq // bq))
        req, first, count, first_pos = query_blocks(query_start, context_lens, b, bq)
        tables = block_tables[req]                                                     # [B, P]
    j = jnp.arange(bq)
    token = first[:, None] + j                                                         # [B, bq]
    valid = j[None, :] < count[:, None]
    pos = jnp.where(valid, first_pos[:, None] + j, 0)                                 # others see key 0 only
    qr = q[jnp.clip(token, 0, t - 1)].reshape(b, bq, hkv, g, d)
    per_chunk = max(1, RAGGED_CHUNK // block_size)
    tables = jnp.pad(tables, ((0, 0), (0, (-pages) % per_chunk)))                      # null block past P
    # the running softmax, in each form's own layout: decode [B, Hkv, G] (+ D); blocks [B, Hkv, G, bq] (+ D)
    stat = (b, hkv, g) if decode else (b, hkv, g, bq)
    if decode:
        qf = qr[:, 0].astype(f32) * sm_scale                                           # [B, Hkv, G, D]
    visible_pos = pos[:, 0] if decode else pos                                        # [B] or [B, bq]

    def chunk(c, carry):
        m, l, acc = carry
        cols = c * per_chunk + jnp.arange(per_chunk)
        where = lax.dynamic_slice_in_dim(tables, c * per_chunk, per_chunk, axis=1)    # [B, per_chunk]
        k = k_pages[where].reshape(b, per_chunk * block_size, hkv, d)
        v = v_pages[where].reshape(b, per_chunk * block_size, hkv, d)
        key_pos = (cols[:, None] * block_size + jnp.arange(block_size)).reshape(-1)   # [C]
        if decode:    # [B, C, Hkv, G], summed over D in the cache's layout (no transposed copy)
            s = jnp.sum(qf[:, None] * k[:, :, :, None, :].astype(f32), axis=-1)
            s = jnp.where((key_pos[None, :] <= visible_pos[:, None])[:, :, None, None], s, -jnp.inf)
            m_new = jnp.maximum(m, jnp.max(s, axis=1))
            alpha = jnp.exp(m - m_new)
            p = jnp.exp(s - m_new[:, None])
            l = l * alpha + jnp.sum(p, axis=1)
            pv = p.astype(v.dtype).astype(f32)
            upd = jnp.sum(pv[..., None] * v[:, :, :, None, :].astype(f32), axis=1)    # [B, Hkv, G, D]
        else:         # [B, Hkv, G, bq, C], flash attention's batched dots
            s = jnp.einsum("bqhgd,bchd->bhgqc", qr, k, precision=_HIGHEST, preferred_element_type=f32) * sm_scale
            s = jnp.where((key_pos[None, None, :] <= visible_pos[:, :, None])[:, None, None], s, -jnp.inf)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            alpha = jnp.exp(m - m_new)
            p = jnp.exp(s - m_new[..., None])
            l = l * alpha + jnp.sum(p, axis=-1)
            upd = jnp.einsum("bhgqc,bchd->bhgqd", p.astype(v.dtype), v, precision=_HIGHEST,
                             preferred_element_type=f32)
        return m_new, l, acc * alpha[..., None] + upd

    init = (jnp.full(stat, -jnp.inf, f32), jnp.zeros(stat, f32), jnp.zeros((*stat, d), f32))
    span = per_chunk * block_size
    if pages * block_size <= span:    # the whole table is one chunk: no loop (a loop costs XLA:CPU per layer)
        _, l, acc = chunk(0, init)
    else:
        n_chunks = (jnp.max(jnp.where(valid, pos, -1)) + span) // span
        _, l, acc = lax.fori_loop(0, n_chunks, chunk, init)
    out = acc / jnp.where(l > 0, l, 1.0)[..., None]
    rows = out[:, None] if decode else out.transpose(0, 3, 1, 2, 4)                   # [B, bq, Hkv, G, D]
    rows = rows.reshape(b, bq, hq, d)
    full = jnp.zeros((t, hq, d), f32).at[jnp.where(valid, token, t)].set(rows, mode="drop")
    return full.astype(q.dtype)
