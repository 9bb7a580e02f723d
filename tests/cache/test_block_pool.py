"""Block pool: reference counts, chained hashes, prefix lookup, LRU eviction of cached blocks."""

import pytest

from torchinferno.cache.block_pool import BlockPool, NoFreeBlocksError, hash_block_tokens, hash_token_blocks


def test_allocate_free_and_refcounts():
    pool = BlockPool(num_blocks=4, block_size=2)
    a = pool.allocate(3)
    assert len(set(a)) == 3 and pool.num_free == 1 and pool.usage == 0.75
    assert [pool.ref_counts[b] for b in a] == [1, 1, 1]
    pool.touch([a[0]])  # a second sequence shares the first block
    assert pool.ref_counts[a[0]] == 2
    pool.free(a)
    assert pool.ref_counts[a[0]] == 1 and pool.num_free == 3
    pool.free([a[0]])
    assert pool.num_free == 4 and pool.usage == 0.0
    with pytest.raises(RuntimeError, match="freed more times"):
        pool.free([a[0]])
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(5)


def test_hash_chaining_identifies_the_whole_prefix():
    bs = 4
    x = list(range(12))
    y = [99] + x[1:]  # differs only in the first token
    hx, hy = hash_token_blocks(x, bs), hash_token_blocks(y, bs)
    assert len(hx) == 3 and len(hash_token_blocks(x + [1, 2], bs)) == 3  # partial tail ignored
    assert hx[1] != hy[1] and hx[2] != hy[2]  # same block tokens, different parent -> different hash
    assert hash_block_tokens(None, x[4:8]) != hx[1]  # the parent is part of the key
    assert hx[1] == hash_block_tokens(hx[0], x[4:8])
    # Incremental hashing from the middle equals hashing everything.
    assert hash_token_blocks(x, bs, start=1, parent_hash=hx[0]) == hx[1:]
    assert hash_token_blocks(x[:8] + [7, 7, 7, 7], bs)[:2] == hx[:2]


def test_lookup_returns_longest_cached_run_and_freed_blocks_stay_reusable():
    bs = 2
    pool = BlockPool(num_blocks=6, block_size=bs)
    toks = [1, 2, 3, 4, 5, 6]
    hashes = hash_token_blocks(toks, bs)
    blocks = pool.allocate(3)
    for b, h in zip(blocks, hashes):
        assert pool.cache_block(b, h)
    assert pool.lookup(hashes) == blocks
    assert pool.lookup(hash_token_blocks([1, 2, 3, 4, 0, 0], bs)) == blocks[:2]
    assert pool.lookup(hash_token_blocks([0, 2, 3, 4, 5, 6], bs)) == []  # first block misses -> nothing
    pool.free(reversed(blocks))
    assert pool.num_free == 6 and pool.lookup(hashes) == blocks  # unreferenced but still cached
    pool.touch(blocks[:2])
    assert pool.num_free == 4 and pool.ref_counts[blocks[0]] == 1
    # A second block with an already-cached hash is not registered (first one wins).
    other = pool.allocate(1)[0]
    assert not pool.cache_block(other, hashes[0])
    assert pool.lookup(hashes[:1]) == blocks[:1]


def test_lru_eviction_order_and_plain_blocks_first():
    bs = 1
    pool = BlockPool(num_blocks=5, block_size=bs)
    blocks = pool.allocate(4)
    hashes = hash_token_blocks([10, 11, 12, 13], bs)
    for b, h in zip(blocks, hashes):
        pool.cache_block(b, h)
    # Free in this order: LRU is blocks[2], then [0], then [3], then [1].
    for i in (2, 0, 3, 1):
        pool.free([blocks[i]])
    # Re-using blocks[0] (a prefix hit) and freeing it again makes it most recently used.
    pool.touch([blocks[0]])
    pool.free([blocks[0]])
    fresh = pool.allocate(1)  # the never-hashed plain block goes first; nothing evicted
    assert fresh[0] not in blocks and pool.num_evictions == 0 and pool.num_cached_blocks == 4
    evicted = []
    for _ in range(4):
        b = pool.allocate(1)[0]
        evicted.append(b)
    assert evicted == [blocks[2], blocks[3], blocks[1], blocks[0]]
    assert pool.num_evictions == 4 and pool.num_cached_blocks == 0
    assert pool.lookup(hashes) == []
    assert all(pool.block_hash[b] is None for b in blocks)


def test_prefix_counters_and_disabled_caching():
    pool = BlockPool(num_blocks=2, block_size=2, enable_prefix_caching=False)
    b = pool.allocate(1)[0]
    h = hash_token_blocks([1, 2], 2)
    assert not pool.cache_block(b, h[0]) and pool.lookup(h) == []
    pool.record_prefix_query(10, 4)
    pool.record_prefix_query(6, 0)
    assert (pool.prefix_queries, pool.prefix_hits) == (16, 4) and pool.prefix_hit_rate == 0.25


def test_reset_prefix_cache_turns_cached_blocks_plain():
    pool = BlockPool(num_blocks=2, block_size=1)
    a = pool.allocate(2)
    hs = hash_token_blocks([5, 6], 1)
    pool.cache_block(a[0], hs[0])
    pool.cache_block(a[1], hs[1])
    pool.free([a[0]])
    pool.reset_prefix_cache()
    assert pool.lookup(hs) == [] and pool.num_free == 1
    pool.free([a[1]])  # its hash was dropped while referenced: goes back as a plain block
    assert pool.num_free == 2 and pool.num_cached_blocks == 0
