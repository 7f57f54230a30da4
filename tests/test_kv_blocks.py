"""The paged KV cache's bookkeeping alone (no model, no jax): the block pool (allocation,
reference counts, the eviction order, prefix caching by chained keys and what a hash collision
costs), and the scheduler over it on random traffic, replayed on a stand-in device that stores
the token written at every position of every block and checks that every read sees the request's
own tokens, in order, whatever blocks they share or however often a request was preempted.
"""

from __future__ import annotations

import random

import pytest

from inference_lab.serving.blocks import NULL_BLOCK, BlockPool, BlockTable, PagedKV, check_block_size, parse_bytes
from inference_lab.serving.requests import Request
from inference_lab.serving.scheduler import PIECE, Scheduler, Sequence

MAX_LEN = 256


# ----------------------------------------------------------------------------- the pool
def test_allocate_release_and_reference_counts():
    pool = BlockPool(5, 16)
    assert pool.usable == 4 and pool.num_free == 4 and pool.usage == 0.0
    a, b = pool.allocate(), pool.allocate()
    assert NULL_BLOCK not in (a, b) and a != b and pool.num_free == 2 and pool.usage == 0.5
    pool.share(a)                         # a second holder
    pool.release([a, b])
    assert pool.refs[a] == 1 and pool.refs[b] == 0 and pool.num_free == 3
    pool.release([a])
    assert pool.num_free == 4 and all(r == 0 for r in pool.refs)
    with pytest.raises(AssertionError, match="released more often"):
        pool.release([a])


def test_eviction_order_uncached_first_then_least_recently_freed():
    pool = BlockPool(6, 16, prefix_caching=True)
    blocks = [pool.allocate() for _ in range(5)]          # 1..5
    for i, b in enumerate(blocks[:3]):                     # 1, 2, 3 cached (a chain)
        pool.register(b, 100 + i, [i] * 16, blocks[i - 1] if i else None)
    pool.release(blocks[:2])                               # freed first: 2 then 1 (a request's tail first)
    pool.release([blocks[2]])
    pool.release(blocks[3:])                               # uncached: reused before any cached one
    order = [pool.allocate() for _ in range(5)]
    assert order[:2] == [4, 5] and order[2:] == [2, 1, 3]
    assert pool.evictions == 3 and not pool.cached and not pool.by_key


def test_a_hit_takes_the_block_off_the_free_list_and_shares_it():
    kv = PagedKV(9, 16, 64, prefix_caching=True)
    tokens = list(range(40))                               # two full blocks and 8 tokens
    first = BlockTable()
    assert kv.match(first, tokens) == 0 and kv.grow(first, 40)
    kv.filled(first, tokens, 40)
    assert len(first.keys) == 2 and len(kv.pool.cached) == 2
    held = first.blocks[:2]
    kv.free(first)
    assert kv.pool.num_free == 8                           # cached blocks are free, still findable
    second = BlockTable()
    assert kv.match(second, tokens + [7]) == 32 and second.blocks == held
    assert kv.pool.num_free == 6 and all(kv.pool.refs[b] == 1 for b in second.blocks)
    third = BlockTable()
    assert kv.match(third, tokens[:33]) == 32 and third.blocks == second.blocks
    assert all(kv.pool.refs[b] == 2 for b in third.blocks)


def test_at_least_one_token_is_left_to_compute():
    """A prompt of whole cached blocks keeps its last block to itself: its last token's logits
    give the next token, and no request ever writes into a block another one shares."""
    kv = PagedKV(9, 16, 64, prefix_caching=True)
    tokens = list(range(32))
    t = BlockTable()
    kv.grow(t, 32)
    kv.filled(t, tokens, 32)
    assert kv.match(BlockTable(), tokens) == 16
    assert kv.match(BlockTable(), tokens + [1]) == 32


def test_keys_are_chained_so_a_block_is_found_only_behind_its_own_prefix():
    kv = PagedKV(9, 16, 64, prefix_caching=True)
    a = [1] * 16 + [2] * 16 + [0]
    b = [3] * 16 + [2] * 16 + [0]                          # the same second block behind another first
    t = BlockTable()
    kv.grow(t, 33)
    kv.filled(t, a, 33)
    assert kv.match(BlockTable(), b) == 0
    assert kv.match(BlockTable(), a) == 32


def test_a_hash_collision_costs_a_miss_never_a_wrong_cache():
    """With a hash that gives every block the same key, nothing is found that does not hold the
    same tokens behind the same parent: the cache only loses hits."""
    kv = PagedKV(9, 16, 64, prefix_caching=True, hash_fn=lambda _: 42)
    a, b = [1] * 16 + [2] * 16 + [0], [3] * 16 + [2] * 16 + [0]
    t = BlockTable()
    kv.grow(t, 33)
    kv.filled(t, a, 33)
    assert len(kv.pool.cached) == 1                        # the second block's key was taken: uncached
    assert kv.match(BlockTable(), b) == 0
    assert kv.match(BlockTable(), a) == 16


def test_an_evicted_parent_breaks_the_chain_of_its_children():
    """A child block names its parent by block id and the generation of that id: once the parent
    is evicted and its id reused for other tokens, the child is not found behind the newcomer,
    even when every key collides."""
    kv = PagedKV(3, 16, 32, prefix_caching=True, hash_fn=lambda x: hash(x[1]))   # keys ignore the parent
    a = [1] * 16 + [2] * 16 + [0]
    t = BlockTable()
    kv.grow(t, 32)
    kv.filled(t, a, 32)
    parent, child = t.blocks
    kv.free(t)
    kv.pool.share(child)                                    # keep the child; the parent alone is free
    u = BlockTable()
    assert kv.grow(u, 16) and u.blocks == [parent]          # the parent's id, reused and evicted
    kv.filled(u, [5] * 16, 16)
    assert kv.match(BlockTable(), [5] * 16 + [2] * 16 + [0]) == 16   # the newcomer, not the orphaned child


def test_a_prefix_recomputed_after_its_parent_was_evicted_is_cached_whole_again():
    """Two requests prefill one prompt side by side: the second block one of them registers hangs
    off the other's first block. That first block is freed and evicted while the second block
    stays cached, an orphan no lookup can reach. The prompt, prefilled again, must take the
    orphan's key for its own second block: before, the orphan kept it, and every later request
    found 16 of the prompt's 32 cacheable tokens."""
    kv = PagedKV(9, 16, 64, prefix_caching=True)
    prompt = list(range(32)) + [99]
    x, y = BlockTable(), BlockTable()
    assert kv.grow(x, 33) and kv.grow(y, 33)
    kv.filled(y, prompt, 16)                                 # y's first block is cached first
    kv.filled(x, prompt, 32)                                 # x's second block hangs off y's first
    kv.filled(y, prompt, 32)
    orphan = x.blocks[1]
    assert kv.pool.cached[orphan].parent == kv.pool.ident(y.blocks[0])
    kv.free(y)                                               # y's first block is freed before x's second
    kv.free(x)
    filler = BlockTable()                                    # the 6 uncached free blocks, then y's first
    assert kv.grow(filler, 16 * 7) and kv.pool.evictions == 1
    assert orphan in kv.pool.cached and kv.pool.by_key.get(kv.pool.cached[orphan].key) == orphan
    kv.free(filler)
    again = BlockTable()
    assert kv.match(again, prompt) == 0 and kv.grow(again, 33)   # the first block is gone: prefill it all
    kv.filled(again, prompt, 32)
    kv.free(again)
    assert kv.match(BlockTable(), prompt) == 32              # both blocks found: 32 of 32 cacheable tokens
    assert orphan not in kv.pool.cached


def test_pool_and_block_size_rules_name_the_fix():
    for size, word in ((12, "power of two"), (8, "at least 16"), (48, "power of two"), ("16", "integer"),
                       (512, "does not divide")):
        with pytest.raises(ValueError, match=word):
            check_block_size(size, 256, smallest=16)
    assert check_block_size(64, 256, smallest=16) == 64
    with pytest.raises(ValueError, match="cannot hold one request of the full context.*at least 17 blocks"):
        PagedKV(16, 16, 256)
    with pytest.raises(ValueError, match=">= 2"):
        BlockPool(1, 16)
    assert parse_bytes("2GiB") == 2 * 2**30 and parse_bytes("512 MiB") == 512 * 2**20
    assert parse_bytes("1.5GB") == 1_500_000_000 and parse_bytes("1e6") == 10**6 and parse_bytes(4096) == 4096
    for bad in ("2 gigs", "", "-1MiB", "0", "GiB", True):
        with pytest.raises(ValueError, match="kv_cache_memory"):
            parse_bytes(bad)


# ----------------------------------------------------------------------------- the scheduler over a pool
class PagedDevice:
    """Each block's positions: the token written there. A decode row at position ``p`` writes the
    token fed there; a read of position ``j < p`` through the row's table must give the request's
    own token ``j`` (its prompt, then its outputs)."""

    def __init__(self, kv: PagedKV):
        self.kv, self.blocks = kv, {}

    def at(self, table, j):
        got = self.blocks.get((table[j // self.kv.block_size], j % self.kv.block_size))
        if isinstance(got, tuple):   # an output token fed by a decode row: known once delivered
            seq, index = got
            return seq.output[index] if index < len(seq.output) else got
        return got

    @staticmethod
    def token(seq, j):
        """What position ``j`` of ``seq`` holds: a prompt token, or its output token ``j - prompt``
        (its value, or (seq, index) while it is still on its way to the host)."""
        if j < seq.prompt_len:
            return seq.request.prompt[j]
        index = j - seq.prompt_len
        return seq.output[index] if index < len(seq.output) else (seq, index)

    def run(self, step, sched):
        assert step.shape in sched.shapes(), f"{step.shape} is not compiled at warm-up"
        table = step.block_table
        assert table.shape == (sched.n_slots, self.kv.blocks_per_seq)
        # Every write first, then every read (the step scatters all new K/V before attending: a
        # chunk sees what its prompt wrote before, and a request that hit a block another request's
        # chunk fills in this very step reads it filled). A write that
        # changed what another request holds would show in that request's reads.
        writes, reads = [], []
        for seq, p in zip(step.decode, step.positions):   # fed at p: its last output token
            row = table[seq.slot]
            writes.append((row, p, (seq, p - seq.prompt_len)))
            reads.append((seq, row, p))
        for chunk in step.chunks:
            row = table[chunk.seq.slot]
            writes += [(row, chunk.start + j, tok) for j, tok in enumerate(chunk.tokens)]
            reads.append((chunk.seq, row, chunk.start))
        for row, p, tok in writes:
            block = row[p // self.kv.block_size]
            assert block != NULL_BLOCK, "a write into the null block"
            self.blocks[(block, p % self.kv.block_size)] = tok
        for seq, row, n in reads:
            assert all(self.at(row, j) == self.token(seq, j) for j in range(n)), f"{seq.rid} reads a stranger's token"


def _prompt(rng, shared, n):
    """A prompt of ``n`` tokens, starting with one of the ``shared`` prefixes half the time."""
    body = [rng.randrange(3, 250) for _ in range(n)]
    if rng.random() < 0.5:
        prefix = rng.choice(shared)
        body = (prefix + body)[:n]
    return [1] + body[:n - 1]


def _serve_paged(policy, kv, n_requests, rng, *, cancel=0.0, n_slots=8, budget=64, lengths=(1, 200), outputs=(1, 120)):
    """Run the scheduler over a paged pool until every request ended, as the engine does: each
    step's tokens are delivered one iteration late (async scheduling), a random token id each;
    some requests are cancelled at random moments. Returns (requests, tokens each got, scheduler)."""
    sched = Scheduler(policy, n_slots=n_slots, max_len=MAX_LEN, budget=budget, kv=kv)
    device = PagedDevice(kv)
    shared = [[rng.randrange(3, 250) for _ in range(rng.choice((16, 40, 64)))] for _ in range(3)]
    seqs = [Sequence(Request(str(i), _prompt(rng, shared, rng.randint(*lengths)), rng.randint(*outputs),
                             stop_at_eos=False), emit=None) for i in range(n_requests)]
    todo, pending, steps = list(seqs), None, 0
    ended = set()

    def deliver(step):
        for _, seq, index in step.sampled:
            if seq.finished:
                continue
            assert index == seq.delivered, f"{seq.rid}: token {index} after {seq.delivered}"
            seq.output.append(rng.randrange(3, 250))
            seq.delivered = index + 1
            if index >= seq.last_token(MAX_LEN):
                seq.finished = True
                ended.add(seq.rid)
                sched.release(seq)

    while todo or not sched.idle() or pending is not None:
        for _ in range(rng.randint(0, 3)):
            if todo:
                sched.add(todo.pop(0))
        if cancel and rng.random() < cancel:
            # held by the scheduler: waiting or running (a request whose last token a step planned has
            # left it already, and a cancel then finds nothing to take out, as in the engine)
            live = [s for s in seqs if not s.finished and s.rid not in ended
                    and (s in sched.waiting or sched.running.get(s.slot) is s)]
            if live:
                victim = rng.choice(live)
                assert sched.remove(victim.rid) is victim
                victim.finished = True
                ended.add(victim.rid)
        step = sched.schedule()
        if step is not None:
            device.run(step, sched)
        if pending is not None:
            deliver(pending)
        pending = step
        steps += 1
        assert steps < 20_000, "no progress"
    return seqs, sched


def _pool_is_full(kv):
    p = kv.pool
    return p.num_free == p.usable and all(r == 0 for r in p.refs)


@pytest.mark.parametrize("policy,budget", [("chunked", 64), ("prefill-first", 256)])
@pytest.mark.parametrize("caching", [False, True], ids=["no-cache", "prefix-cache"])
def test_a_small_pool_preempts_and_every_request_gets_every_token(policy, budget, caching):
    """60 requests on 8 slots over a pool of 40 blocks (2.5 full-context requests): requests are
    preempted, start again and go on, each gets all its tokens, in order, and every read sees its
    own tokens. The pool is full again at the end."""
    rng = random.Random(7 + caching)
    kv = PagedKV(41, 16, MAX_LEN, prefix_caching=caching)
    seqs, sched = _serve_paged(policy, kv, 60, rng, budget=budget)
    for s in seqs:
        assert s.delivered == min(s.request.max_tokens, MAX_LEN - s.prompt_len + 1), s.rid
    assert sched.preemptions > 0 and _pool_is_full(kv) and not sched.running and not sched.waiting
    if caching:
        assert 0 < kv.pool.hits < kv.pool.queries


def test_no_block_leaks_after_200_random_requests_with_cancels():
    rng = random.Random(11)
    kv = PagedKV(60, 16, MAX_LEN, prefix_caching=True)
    seqs, sched = _serve_paged("chunked", kv, 200, rng, cancel=0.08)
    cancelled = [s for s in seqs if s.delivered < min(s.request.max_tokens, MAX_LEN - s.prompt_len + 1)]
    assert len(cancelled) > 10 and sched.preemptions > 0
    assert _pool_is_full(kv), f"{kv.pool.usable - kv.pool.num_free} blocks still held"


def test_a_cancel_mid_prefill_gives_its_blocks_back():
    kv = PagedKV(33, 16, MAX_LEN)
    sched = Scheduler("chunked", n_slots=4, max_len=MAX_LEN, budget=32, kv=kv)
    long = Sequence(Request("long", [1] * 200, 5), emit=None)
    sched.add(long)
    sched.schedule()
    sched.schedule()
    assert 0 < long.prefilled < 200 and len(long.table.blocks) == 4 and kv.pool.num_free == 28
    sched.remove("long")
    assert _pool_is_full(kv) and not sched.running


def test_a_request_that_outgrows_the_pool_preempts_the_newest():
    """Two requests whose answers together outgrow a pool of one full context: the newer one is
    preempted when the older needs a block, waits, and starts again with its tokens so far."""
    kv = PagedKV(17, 16, MAX_LEN)
    sched = Scheduler("chunked", n_slots=2, max_len=MAX_LEN, budget=32, kv=kv)
    old, new = (Sequence(Request(r, [1] * 16, 200, stop_at_eos=False), emit=None) for r in ("old", "new"))
    sched.add(old)
    sched.add(new)
    preempted_at = None
    for _ in range(400):
        step = sched.schedule()
        if step is None:
            break
        for _, seq, index in step.sampled:   # deliver at once (the engine without the overlap)
            seq.output.append(9)
            seq.delivered = index + 1
            if index >= seq.last_token(MAX_LEN):
                seq.finished = True
                sched.release(seq)
        if sched.preemptions and preempted_at is None:
            preempted_at = new.resumed_at
            assert new in sched.waiting and new.table.blocks == [] and old.slot >= 0
    assert preempted_at and new.finished and old.finished and new.delivered == 200
    assert _pool_is_full(kv) and new.resumed_at >= preempted_at


def test_the_block_table_outlives_a_request_ending_in_its_own_step():
    """A step that samples a request's last token still reads its blocks: the table the step
    carries has them, though the request gave them back when the step was planned."""
    kv = PagedKV(33, 16, MAX_LEN)
    sched = Scheduler("chunked", n_slots=2, max_len=MAX_LEN, budget=32, kv=kv)
    seq = Sequence(Request("a", [1] * 20, 2), emit=None)
    sched.add(seq)
    sched.schedule()                          # both pieces: token 0 sampled
    step = sched.schedule()                   # token 1, the last: blocks given back at once
    assert step.sampled[0][2] == 1 and _pool_is_full(kv)
    assert list(step.block_table[seq.slot][:2]) != [0, 0]


def test_paged_engine_settings_refused_in_the_pools():
    with pytest.raises(ValueError, match="contiguous caches"):
        Scheduler("prefill-only", n_slots=2, max_len=MAX_LEN, budget=256, kv=PagedKV(33, 16, MAX_LEN))
    assert PIECE == 16
