"""BlockPool eviction orders: lru evicts the least recently freed cached block, fifo the one registered longest ago
(reuse does not save it); both keep the pool's invariants under random operations; a bad name is refused."""

import random

import pytest

from torchinferno.cache.block_pool import BlockPool
from torchinferno.engine.config import EngineConfig
from torchinferno.errors import ConfigError


def _cached_pair(eviction: str) -> BlockPool:
    pool = BlockPool(2, 4, eviction=eviction)
    a, b = pool.allocate(2)
    pool.cache_block(a, 111)  # registered first
    pool.cache_block(b, 222)
    pool.free([a, b])  # both evictable; a freed first
    pool.touch([a])  # a reused ...
    pool.free([a])  # ... and freed again: now the most recently used
    return pool


@pytest.mark.parametrize("eviction,survivor", [("lru", 111), ("fifo", 222)])
def test_eviction_order(eviction, survivor):
    pool = _cached_pair(eviction)
    pool.allocate(1)
    assert set(pool.cached_hashes()) == {survivor} and pool.num_evictions == 1


def _check(pool: BlockPool) -> None:
    ref = [b for b in range(pool.num_blocks) if pool.ref_counts[b] > 0]
    assert len(ref) + len(pool._plain) + len(pool._evictable) == pool.num_blocks
    assert all(pool.block_hash[b] is not None for b in pool._evictable)
    assert all(pool.block_hash[b] == h for h, b in pool._cached.items())


@pytest.mark.parametrize("eviction", ["lru", "fifo"])
def test_random_operations_keep_invariants(eviction):
    rng = random.Random(0)
    pool = BlockPool(16, 4, eviction=eviction)
    held: list[int] = []
    next_hash = 1
    for _ in range(3000):
        op = rng.random()
        if op < 0.4 and pool.num_free:
            got = pool.allocate(rng.randint(1, min(3, pool.num_free)))
            for b in got:
                if rng.random() < 0.7:
                    pool.cache_block(b, next_hash)
                    next_hash += 1
            held += got
        elif op < 0.8 and held:
            b = held.pop(rng.randrange(len(held)))
            pool.free([b])
        elif pool._cached:
            h = rng.choice(list(pool._cached))
            hit = pool.lookup([h])
            pool.touch(hit)
            held += hit
        _check(pool)


def test_bad_eviction_name_is_refused():
    with pytest.raises(ValueError, match="eviction must be one of lru, fifo"):
        BlockPool(4, 4, eviction="random")
    with pytest.raises(ConfigError, match="prefix_cache_eviction must be lru or fifo"):
        EngineConfig(prefix_cache_eviction="mru")
