"""The paged KV cache's bookkeeping: which block of the pool holds which tokens of which request.
Host logic only (no jax), so it is read, and tested, without a model.

A contiguous cache gives every request ``max_len`` positions from the moment it starts, however
few it uses; a paged one (vLLM's PagedAttention) cuts the cache into **blocks** of
``block_size`` positions, hands a request a block only when its tokens reach it, and keeps a
**block table** per request (logical block ``i`` of the request lives in physical block
``table[i]`` of the pool). Memory then follows the tokens that exist, not the tokens that might,
and as many requests run as their real lengths allow.

Three things ride on the same table:

* **freeing**: a finished, cancelled or preempted request gives its blocks back at once;
* **prefix caching** (vLLM's ``--enable-prefix-caching``): a block whose ``block_size`` positions
  a prompt's prefill filled is keyed by a *chained* hash, of its tokens and of the key of the block
  before it, so a key names the whole prefix up to the block's end. A later request whose first
  ``k`` blocks have the same keys takes those blocks (a reference count each) and prefills only the
  rest. A hash can collide; a hit is taken only if the block's tokens are equal *and* its parent is
  the very block matched before it (block id and the generation the id had when it was written),
  so a collision costs a miss, never a wrong cache;
* **eviction**: a block nobody holds goes back to the free list but keeps its contents and key, so
  it can still be hit until it is needed for something else. The free list is the eviction order:
  blocks with no key (worth nothing) are reused first, then cached ones, least recently freed first.

Block 0 is the **null block**: never handed out, it is what every unused table entry points at
(vLLM v1's convention), so a step that reads a whole table row reads real blocks and one small
block that stays in the processor's cache. ``num_blocks`` counts it: ``num_blocks - 1`` are usable.
"""

from __future__ import annotations

import collections
import dataclasses
import re

import numpy as np

from inference_lab.analytic import costs

NULL_BLOCK = 0
WATERMARK = 0.01   # the share of the pool a request may not start into (vLLM v0's default)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text, name: str = "kv_cache_memory") -> int:
    """A memory size as a person writes it: ``2GiB``, ``512 MiB``, ``1.5GB``, ``1e9`` or a plain
    integer (bytes). GiB/MiB are powers of two, GB/MB powers of ten, as ``vllm`` and ``ls`` read them."""
    if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
        value = int(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
        unit = m and m.group(2).lower()
        if not m or unit not in _UNITS:
            raise ValueError(f"{name}={text!r} is not a memory size: write bytes or a number with a unit, "
                             "such as 2GiB, 512MiB or 1.5GB")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"{name}={text!r} must be a positive memory size")
    return value


def check_block_size(block_size, max_len: int, *, smallest: int) -> int:
    """``block_size`` as an int after the paged cache's rules: a power of two (blocks tile the
    kernel's loads), at least ``smallest`` (16: the ragged attention's dot reads 16 keys
    or more at a time), dividing ``max_len`` (the table of a full-length request is whole)."""
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
        raise ValueError(f"block_size={block_size!r} must be an integer (a power of two such as 16)")
    b = int(block_size)
    if b < smallest or b & (b - 1):
        raise ValueError(f"block_size={b} must be a power of two of at least {smallest} (16, 32, 64, ...)")
    if max_len % b:
        raise ValueError(f"block_size={b} does not divide the context of {max_len} positions: choose a power "
                         f"of two that divides it (16, 32, ... up to {max_len & -max_len})")
    return b


@dataclasses.dataclass
class _Cached:
    """What a cached block holds: its key, its tokens, and the block before it (id, generation)."""

    key: int
    tokens: tuple
    parent: tuple | None


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` positions (block 0 the null block), their reference
    counts, the free list in eviction order and, with ``prefix_caching``, the cached blocks by key.

    ``hash_fn`` makes a block's key from ``(parent key, tokens)``; Python's own hash of a tuple of
    ints is fast and the same in every process. A test passes a weak one to show that collisions
    cost only misses."""

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = False, hash_fn=hash):
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, (int, np.integer)) or num_blocks < 2:
            raise ValueError(f"num_kv_blocks={num_blocks!r} must be an integer >= 2 (block 0 is the null block)")
        self.num_blocks, self.block_size = int(num_blocks), int(block_size)
        self.prefix_caching, self.hash_fn = bool(prefix_caching), hash_fn
        self.refs = [0] * self.num_blocks
        self.generation = [0] * self.num_blocks      # bumped when a cached block is evicted
        self.free: collections.OrderedDict[int, None] = collections.OrderedDict.fromkeys(range(1, self.num_blocks))
        self.by_key: dict[int, int] = {}             # key -> cached block
        self.cached: dict[int, _Cached] = {}         # cached block -> what it holds
        self.queries = self.hits = 0                 # prefix-cache tokens looked up, and found
        self.evictions = 0

    @property
    def usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        """Blocks a request can get now: free ones, cached or not (a cached one is evicted for it)."""
        return len(self.free)

    @property
    def usage(self) -> float:
        """The fraction of usable blocks some request holds (vLLM's ``kv_cache_usage_perc``)."""
        return 1.0 - self.num_free / self.usable

    def ident(self, block: int) -> tuple:
        return block, self.generation[block]

    # -- taking and giving back
    def allocate(self) -> int:
        """A free block, the first in eviction order (a cached one loses its key)."""
        block, _ = self.free.popitem(last=False)
        held = self.cached.pop(block, None)
        if held is not None:
            if self.by_key.get(held.key) == block:
                del self.by_key[held.key]
            self.generation[block] += 1
            self.evictions += 1
        self.refs[block] = 1
        return block

    def share(self, block: int) -> None:
        """One more holder of ``block`` (a prefix hit); a free cached block leaves the free list."""
        if self.refs[block] == 0:
            del self.free[block]
        self.refs[block] += 1

    def release(self, blocks: list) -> None:
        """Every block of ``blocks`` has one holder less; one nobody holds is free again, a cached
        block at the end of the eviction order (the last block of a request first, so a shared
        prefix outlives the tails that hang off it), one without a key at the front."""
        for block in reversed(blocks):
            self.refs[block] -= 1
            assert self.refs[block] >= 0, f"block {block} released more often than taken"
            if self.refs[block] == 0:
                self.free[block] = None
                if block not in self.cached:
                    self.free.move_to_end(block, last=False)

    # -- prefix caching
    def key(self, parent_key, tokens) -> int:
        return self.hash_fn((parent_key, tuple(tokens)))

    def lookup(self, tokens, most: int) -> list[tuple[int, int]]:
        """The cached blocks that hold ``tokens``' first full blocks, at most ``most`` of them:
        ``[(block, key)]`` in order, stopping at the first miss. Takes nothing."""
        found, parent_key, parent = [], None, None
        bs = self.block_size
        for i in range(most):
            chunk = tuple(tokens[i * bs:(i + 1) * bs])
            key = self.key(parent_key, chunk)
            block = self.by_key.get(key)
            held = self.cached.get(block) if block is not None else None
            if held is None or held.tokens != chunk or held.parent != parent:
                break
            found.append((block, key))
            parent_key, parent = key, self.ident(block)
        return found

    def register(self, block: int, key: int, tokens, parent: int | None) -> None:
        """``block`` now holds ``tokens`` after the block ``parent`` (None: the first), keyed ``key``.
        A key that another block holds already keeps that one while :meth:`lookup` can still reach
        it (two requests prefilled the same prefix side by side, or a hash collision): this block
        stays uncached. A holder whose parent is gone (evicted, or no longer cached under its key)
        can never be hit again: this block takes the key, or a prefix recomputed after its parent's
        eviction would never be found again."""
        if block in self.cached:
            return
        old = self.by_key.get(key)
        if old is not None:
            if self._reachable(old):
                return
            self._forget(old)
        self.by_key[key] = block
        self.cached[block] = _Cached(key, tuple(tokens), None if parent is None else self.ident(parent))

    def _reachable(self, block: int) -> bool:
        """Whether a lookup can still arrive at the cached ``block``: it is a first block, or its
        parent is that very block (same generation) and still the one cached under its own key."""
        parent = self.cached[block].parent
        if parent is None:
            return True
        held = self.cached.get(parent[0])
        return self.ident(parent[0]) == parent and held is not None and self.by_key.get(held.key) == parent[0]

    def _forget(self, block: int) -> None:
        """``block``'s cache entry goes (it can no longer be hit); free, it is reused first."""
        del self.by_key[self.cached.pop(block).key]
        if self.refs[block] == 0:
            self.free.move_to_end(block, last=False)


@dataclasses.dataclass(eq=False)
class BlockTable:
    """One request's blocks: ``blocks[i]`` holds its positions ``i * block_size ...``; ``keys``: the
    chained keys of its leading full blocks that prefix caching knows (hit or registered)."""

    blocks: list = dataclasses.field(default_factory=list)
    keys: list = dataclasses.field(default_factory=list)


class PagedKV:
    """The paged cache of one engine: the pool, and what a request's table needs as it grows.
    ``max_len`` positions per request at most (a table has ``max_len // block_size`` entries)."""

    def __init__(self, num_blocks: int, block_size: int, max_len: int, *, prefix_caching: bool = False,
                 smallest_block: int = 16, hash_fn=hash):
        self.block_size = check_block_size(block_size, max_len, smallest=smallest_block)
        self.max_len = int(max_len)
        self.blocks_per_seq = self.max_len // self.block_size
        self.pool = BlockPool(num_blocks, self.block_size, prefix_caching=prefix_caching, hash_fn=hash_fn)
        self.watermark = max(1, round(WATERMARK * self.pool.usable))   # blocks a newcomer leaves free
        if self.pool.usable < self.blocks_per_seq:
            raise ValueError(
                f"a pool of {num_blocks} blocks ({self.pool.usable} usable after the null block) of {self.block_size} "
                f"tokens cannot hold one request of the full context ({max_len} tokens = {self.blocks_per_seq} "
                f"blocks): give at least {self.blocks_per_seq + 1} blocks (--num-kv-blocks, or more --kv-cache-memory)")

    def blocks_for(self, n_positions: int) -> int:
        return -(-int(n_positions) // self.block_size)

    def grow(self, table: BlockTable, n_positions: int) -> bool:
        """Blocks for positions ``0 .. n_positions - 1`` in ``table``, all or none: False (nothing
        taken) when the pool has too few free blocks."""
        need = self.blocks_for(n_positions) - len(table.blocks)
        if need <= 0:
            return True
        if need > self.pool.num_free:
            return False
        table.blocks += [self.pool.allocate() for _ in range(need)]
        return True

    def match(self, table: BlockTable, tokens) -> int:
        """Prefix caching at a request's start: the cached blocks holding ``tokens``' leading full
        blocks go into the (empty) ``table``, shared; returns how many tokens they hold. At least
        one token is left to compute (its logits give the next token), so a prompt of whole blocks
        keeps its last block to itself."""
        assert not table.blocks
        if not self.pool.prefix_caching:
            return 0
        found = self.pool.lookup(tokens, (len(tokens) - 1) // self.block_size)
        for block, key in found:
            self.pool.share(block)
            table.blocks.append(block)
            table.keys.append(key)
        return len(found) * self.block_size

    def count_lookup(self, n_tokens: int, n_hit: int) -> None:
        """A request started: ``n_tokens`` looked up, ``n_hit`` found (vLLM's prefix-cache queries, hits)."""
        if self.pool.prefix_caching:
            self.pool.queries += int(n_tokens)
            self.pool.hits += int(n_hit)

    def filled(self, table: BlockTable, tokens, n_written: int) -> None:
        """Prefill has written ``tokens[:n_written]``: key and cache each block that is now full."""
        if not self.pool.prefix_caching:
            return
        bs = self.block_size
        for i in range(len(table.keys), min(n_written // bs, len(table.blocks))):
            chunk = tokens[i * bs:(i + 1) * bs]
            parent_key = table.keys[-1] if table.keys else None
            key = self.pool.key(parent_key, chunk)
            # the parent a lookup will have matched: the block cached under the previous key
            # (another request's, if both prefilled the same prefix side by side)
            parent = self.pool.by_key.get(parent_key, table.blocks[i - 1]) if i else None
            self.pool.register(table.blocks[i], key, chunk, parent)
            table.keys.append(key)

    def free(self, table: BlockTable) -> None:
        """Every block of ``table`` back to the pool (cached ones stay findable until evicted)."""
        self.pool.release(table.blocks)
        table.blocks, table.keys = [], []

    def tables(self, tables: dict, n_rows: int) -> np.ndarray:
        """The device's block table ``[n_rows, blocks_per_seq]`` int32 from ``{row: BlockTable}``
        (entries nobody uses point at the null block)."""
        out = np.full((n_rows, self.blocks_per_seq), NULL_BLOCK, np.int32)
        for row, table in tables.items():
            out[row, :len(table.blocks)] = table.blocks
        return out

    def stats(self) -> dict:
        p = self.pool
        return {"block_size": self.block_size, "num_kv_blocks": p.num_blocks, "blocks_usable": p.usable,
                "blocks_free": p.num_free, "blocks_used": p.usable - p.num_free, "kv_cache_usage": p.usage,
                "prefix_caching": p.prefix_caching, "prefix_cache_queries": p.queries,
                "prefix_cache_hits": p.hits, "cached_blocks": len(p.cached), "evictions": p.evictions}


def paged_kv(cfg, *, policy: str, n_slots: int, block_size=None, num_kv_blocks=None, kv_cache_memory=None,
             prefix_caching: bool = False, piece: int = 16) -> PagedKV | None:
    """The paged cache an engine of model ``cfg`` asks for, checked (one-line errors), or None for
    contiguous slots (none of the paged settings given). ``block_size`` defaults to 16;
    ``num_kv_blocks`` (the null block included) or as many blocks as ``kv_cache_memory`` holds, by
    default the memory ``n_slots`` contiguous slots of the full context would take."""
    if not isinstance(prefix_caching, bool):
        raise ValueError(f"enable_prefix_caching={prefix_caching!r} must be True or False")
    if block_size is None and num_kv_blocks is None and kv_cache_memory is None and not prefix_caching:
        return None
    if policy not in ("prefill-first", "chunked"):
        raise ValueError("the two pools hand on contiguous caches: a paged cache (block size, KV blocks or memory, "
                         "prefix caching) serves the policies 'prefill-first' and 'chunked'")
    max_len = cfg.max_seq_len
    bs = check_block_size(16 if block_size is None else block_size, max_len, smallest=piece)
    if num_kv_blocks is not None and kv_cache_memory is not None:
        raise ValueError("give num_kv_blocks or kv_cache_memory, not both (the one sets the other)")
    if kv_cache_memory is not None:
        num_kv_blocks = parse_bytes(kv_cache_memory) // int(bs * costs.kv_bytes_per_token(cfg))
    elif num_kv_blocks is None:
        num_kv_blocks = n_slots * max_len // bs + 1
    return PagedKV(num_kv_blocks, bs, max_len, prefix_caching=prefix_caching, smallest_block=piece)
