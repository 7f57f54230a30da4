"""The KV cache: every layer's keys and values for every token seen so far.

Layout: for each of the ``n_layers`` layers, one key array and one value array of shape
``[B, S, Hkv, Dh]`` (batch, max_len positions, KV heads, head_dim) in the model's dtype,
plus ``lengths [B]`` int32: how many positions of row ``b`` hold real tokens. Rows are
independent and may be ragged (prompts right-padded; each row has its own length).

Separate arrays per layer (rather than one stacked [L, ...] array) let XLA update each
layer's cache in place: a decode step writes one position of each and reads it back, and a
stacked array routed through a loop over layers tends to be copied whole.

The engine *donates* a cache to each ``prefill``/``decode_step``: the arrays are handed to
XLA to be overwritten in place and the call returns a new ``KVCache`` around them. The old
object is marked consumed and refuses to be used again, with a message saying what to do.

With ``cfg.kv_cache_dtype == "int8"`` each layer's K (and V) is a :class:`QuantizedKV`: int8
values ``[B, S, Hkv, Dh]`` and a float32 scale per token and KV head ``[B, S, Hkv]`` (a vector's
``max |x| / 127``), about a quarter of float32's bytes. :func:`write_prefix` and :func:`write_rows`
write new K/V into either kind, rounding them on the way in.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from inference_lab.base import random_arrays
from inference_lab.base.config import ModelConfig
from pallas_kernels import quantization


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedKV:
    """One layer's int8 K (or V) cache: ``values`` int8 ``[B, S, Hkv, Dh]``, ``scales`` float32
    ``[B, S, Hkv]``; ``values * scales[..., None]`` is what attention reads."""

    values: jax.Array
    scales: jax.Array

    @property
    def shape(self):
        return self.values.shape

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.scales.nbytes)

    @classmethod
    def of(cls, x) -> "QuantizedKV":
        """Float K or V ``[..., Dh]`` rounded to int8, one scale per vector."""
        return cls(*quantization.quantize_kv(x))

    def dequantize(self, dtype=jnp.float32):
        return (self.values.astype(jnp.float32) * self.scales[..., None]).astype(dtype)


def write_prefix(cache, new):
    """``new [B, T, Hkv, Dh]`` written at positions 0..T-1 of a layer's cache (float or int8)."""
    if isinstance(cache, QuantizedKV):
        q = QuantizedKV.of(new)
        return QuantizedKV(jax.lax.dynamic_update_slice(cache.values, q.values, (0, 0, 0, 0)),
                           jax.lax.dynamic_update_slice(cache.scales, q.scales, (0, 0, 0)))
    return jax.lax.dynamic_update_slice(cache, new.astype(cache.dtype), (0, 0, 0, 0))


def write_rows(cache, rows, positions, new):
    """``new [..., Hkv, Dh]`` written at ``(rows, positions)`` (same leading shape) of a layer's
    cache (float or int8), one scatter per array; positions past the cache are dropped."""
    if isinstance(cache, QuantizedKV):
        q = QuantizedKV.of(new)
        return QuantizedKV(cache.values.at[rows, positions].set(q.values, mode="drop"),
                           cache.scales.at[rows, positions].set(q.scales, mode="drop"))
    return cache.at[rows, positions].set(new.astype(cache.dtype), mode="drop")


class KVCache:
    """Per-layer K and V ``[B, S, Hkv, Dh]`` plus ``lengths [B]``. Build with :meth:`create`."""

    def __init__(self, k, v, lengths, *, host_lengths=None):
        self._k = tuple(k)
        self._v = tuple(v)
        self._lengths = jnp.asarray(lengths, jnp.int32)
        # A host copy of the lengths (always equal to the device one: the engine advances
        # both) so that boundary checks never wait for the device.
        self._host_lengths = (np.asarray(jax.device_get(self._lengths), np.int32).copy()
                              if host_lengths is None else np.asarray(host_lengths, np.int32))
        self._consumed_by = None
        b, s, hkv, dh = self._k[0].shape
        self.batch, self.max_len, self.n_kv_heads, self.head_dim = b, s, hkv, dh
        self.n_layers = len(self._k)
        self.dtype = self._k[0].dtype

    @classmethod
    def create(cls, cfg: ModelConfig, batch: int, max_len: int) -> "KVCache":
        """An empty cache (all lengths 0) for ``batch`` rows of up to ``max_len`` tokens."""
        for name, value in (("batch", batch), ("max_len", max_len)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if max_len > cfg.max_seq_len:
            raise ValueError(f"max_len={max_len} is past the model's max_seq_len={cfg.max_seq_len} "
                             f"({cfg.name}); the model is not meant for longer sequences: use max_len <= "
                             f"{cfg.max_seq_len}")
        shape = (int(batch), int(max_len), cfg.n_kv_heads, cfg.head_dim)
        dt = jnp.dtype(cfg.dtype)
        if cfg.kv_cache_dtype == "int8":
            def empty():
                return QuantizedKV(jnp.zeros(shape, jnp.int8), jnp.zeros(shape[:3], jnp.float32))
        else:
            def empty():
                return jnp.zeros(shape, dt)
        k = [empty() for _ in range(cfg.n_layers)]
        v = [empty() for _ in range(cfg.n_layers)]
        return cls(k, v, jnp.zeros((batch,), jnp.int32), host_lengths=np.zeros(batch, np.int32))

    @classmethod
    def random(cls, cfg: ModelConfig, batch: int, max_len: int, context: int, seed: int = 0) -> "KVCache":
        """A cache whose ``batch`` rows already hold ``context`` tokens of random keys and values
        (~N(0, 1)): what a decode measurement starts from. A step takes the same time whichever
        tokens made the cache, and filling it by a real prefill would cost more than the
        measurement on a CPU."""
        cache = cls.create(cfg, batch, max_len)   # the same checks
        if not 1 <= context <= max_len:
            raise ValueError(f"context={context!r} must be in 1..max_len={max_len}")
        dt = jnp.dtype(cfg.dtype)
        shape = (cache.batch, cache.max_len, cfg.n_kv_heads, cfg.head_dim)
        k = [random_arrays.normal(shape, dt, (seed, 2 * i)) for i in range(cfg.n_layers)]
        v = [random_arrays.normal(shape, dt, (seed, 2 * i + 1)) for i in range(cfg.n_layers)]
        if cfg.kv_cache_dtype == "int8":
            k, v = [QuantizedKV.of(x) for x in k], [QuantizedKV.of(x) for x in v]
        lengths = np.full((cache.batch,), context, np.int32)
        return cls(k, v, jnp.asarray(lengths), host_lengths=lengths)

    def rewound(self, lengths) -> "KVCache":
        """The same buffers with every row's length set back to ``lengths`` (an int or one per
        row): later steps overwrite what the rows held past it. This cache is donated to the
        new one. A measurement rewinds to time the same steps again; speculative decoding
        rewinds past the guesses it rejected."""
        host = np.broadcast_to(np.asarray(lengths, np.int32), (self.batch,)).copy()
        if host.min() < 0 or host.max() > self.max_len:
            raise ValueError(f"lengths {host.tolist()} must be in 0..max_len={self.max_len}")
        k, v = self.donate("rewound")
        return KVCache(k, v, jnp.asarray(host), host_lengths=host)

    # -- guarded access: a donated cache's buffers are gone
    def check_alive(self, what: str) -> None:
        """Raise the one-line error that using a donated cache deserves (``what``: the use)."""
        if self._consumed_by is not None:
            raise ValueError(
                f"cache was donated to {self._consumed_by}() and its buffers now belong to the "
                f"cache that call returned; use that one for {what} (e.g. "
                "`logits, cache = decode_step(model, tokens, cache)`)"
            )

    def donate(self, by: str):
        """Hand the arrays to a jitted call that overwrites them (``by``: its name, for the
        error a later use gets); this object is then dead. Returns (k list, v list)."""
        self.check_alive(f"{by}()")
        self._consumed_by = by
        return list(self._k), list(self._v)

    @property
    def consumed(self) -> bool:
        """True once this cache has been donated to a call (use the returned cache)."""
        return self._consumed_by is not None

    @property
    def k(self) -> tuple:
        self.check_alive("reading cache.k")
        return self._k

    @property
    def v(self) -> tuple:
        self.check_alive("reading cache.v")
        return self._v

    @property
    def lengths(self) -> jax.Array:
        """Tokens stored per row, int32 [B]."""
        self.check_alive("reading cache.lengths")
        return self._lengths

    @property
    def host_lengths(self) -> np.ndarray:
        """``lengths`` as a NumPy copy kept on the host (no device round trip)."""
        return self._host_lengths.copy()

    @property
    def quantized(self) -> bool:
        """True for an int8 cache (each layer a :class:`QuantizedKV`)."""
        return isinstance(self._k[0], QuantizedKV)

    @property
    def nbytes(self) -> int:
        """Bytes of all K and V arrays, scales included (what a full-context decode step would read)."""
        per_vector = self.head_dim * self.dtype.itemsize + (4 if self.quantized else 0)
        return 2 * self.n_layers * self.batch * self.max_len * self.n_kv_heads * per_vector

    def __repr__(self) -> str:
        state = f"consumed by {self._consumed_by}()" if self.consumed else f"lengths={self._host_lengths.tolist()}"
        return (f"KVCache(layers={self.n_layers}, batch={self.batch}, max_len={self.max_len}, "
                f"kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, dtype={self.dtype}, "
                f"{state}, nbytes={self.nbytes:,})")
