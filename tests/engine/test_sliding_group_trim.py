"""``SlidingGroup.trim_hit``'s single walk equals the old scan (every hit length from the longest down,
looking up every block of that length's window) on many random (hit, cached set, window, block size) cases,
and looks each block up at most once."""

import random
from types import SimpleNamespace

import pytest

from torchinferno.cache.block_pool import BlockPool
from torchinferno.engine.sliding_group import SlidingGroup


def lookup_all(pool: BlockPool, block_hashes):
    """Block ids of every one of ``block_hashes`` if all are cached, else None (the old BlockPool.lookup_all)."""
    ids = [pool.cached_id(h) for h in block_hashes]
    return None if None in ids else ids


def old_trim_hit(sg: SlidingGroup, req, hit):
    """The pre-issue-22-follow-up scan, kept as the reference."""
    for k in range(len(hit), 0, -1):
        j0 = sg.first_kept(k * sg.block_size)
        ids = lookup_all(sg.pool, req.block_hashes[j0:k])
        if ids is not None:
            return hit[:k], ids, j0
    return [], [], 0


class CountingPool(BlockPool):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.lookups = 0

    def cached_id(self, block_hash):
        self.lookups += 1
        return super().cached_id(block_hash)


def random_case(rng: random.Random):
    bs = rng.choice([1, 2, 3, 4, 8, 16])
    window = rng.randint(1, 6 * bs)
    n = rng.randint(0, 40)  # hit length (blocks)
    extra = rng.randint(0, 3)  # the request may hash more blocks than the hit covers
    hashes = [rng.getrandbits(48) for _ in range(n + extra)]
    pool = CountingPool(num_blocks=n + extra + 8, block_size=bs, enable_prefix_caching=rng.random() > 0.05)
    p = rng.choice([0.0, 0.3, 0.7, 0.9, 1.0])
    cached = [i for i in range(n + extra) if rng.random() < p]
    if rng.random() < 0.3 and n:  # a run of uncached blocks somewhere
        a = rng.randrange(n)
        cached = [i for i in cached if not a <= i < a + rng.randint(1, 5)]
    blocks = pool.allocate(len(cached))
    rng.shuffle(blocks)  # ids unrelated to positions
    for b, i in zip(blocks, cached):
        pool.cache_block(b, hashes[i])
    if rng.random() < 0.5:
        pool.free(blocks)  # evictable blocks still resolve
    hit = [rng.randrange(1000) for _ in range(n)]  # whole-group ids: only their prefix is returned
    return SlidingGroup(pool, window), SimpleNamespace(block_hashes=hashes), hit


@pytest.mark.parametrize("seed", range(8))
def test_trim_hit_equals_the_old_scan(seed):
    rng = random.Random(seed)
    nonempty = 0
    for _ in range(400):
        sg, req, hit = random_case(rng)
        want = old_trim_hit(sg, req, hit)
        sg.pool.lookups = 0
        got = sg.trim_hit(req, hit)
        assert got == want, (sg.block_size, sg.window, len(hit))
        assert sg.pool.lookups <= len(hit)  # each block at most once
        nonempty += bool(got[0])
    assert nonempty > 50  # the cases exercise real hits, not only misses


def test_trim_hit_cost_is_linear_in_the_hit():
    """One uncached block in every 8, a window of 8 blocks: every candidate length fails, the old scan pays up to
    a window of lookups per candidate, the walk looks each block up at most once."""
    bs, n = 4, 200
    pool = CountingPool(num_blocks=n, block_size=bs)
    hashes = list(range(1, n + 1))
    for i in range(n):
        if i % 8 != 7:
            pool.cache_block(pool.allocate(1)[0], hashes[i])
    sg = SlidingGroup(pool, 8 * bs)
    req = SimpleNamespace(block_hashes=hashes)
    hit = list(range(1000, 1000 + n))
    got = sg.trim_hit(req, hit)
    lookups = pool.lookups  # before the reference scan adds its own
    assert got == old_trim_hit(sg, req, hit)
    assert got[0] == hit[:7] and got[2] == 0  # only the first 7 blocks' window (blocks 0..6) is whole
    assert lookups <= n


def handoff_reference(sg: SlidingGroup, req, hit, num_tokens):
    """A receiver's hit (nothing computed there), by brute force: the longest ``k`` whose blocks from the last
    window's first (``first_kept(num_tokens)``) up to ``k`` all have a cached sliding copy."""
    fk = sg.first_kept(num_tokens)
    for k in range(len(hit), -1, -1):
        ids = lookup_all(sg.pool, req.block_hashes[fk:k])
        if ids is not None:
            return hit[:k], ids, min(fk, k)
    raise AssertionError("k = 0 always fits")


@pytest.mark.parametrize("seed", range(4))
def test_trim_handoff_hit_equals_brute_force_and_never_trims_more_than_trim_hit(seed):
    rng = random.Random(100 + seed)
    longer = 0
    for _ in range(400):
        sg, req, hit = random_case(rng)
        n = len(hit) * sg.block_size + rng.randint(0, 3 * sg.window)  # the prompt may run past the hit
        n = min(n, len(req.block_hashes) * sg.block_size + sg.block_size - 1)  # hashes cover its full blocks
        got = sg.trim_handoff_hit(req, hit, n)
        assert got == handoff_reference(sg, req, hit, n), (sg.block_size, sg.window, len(hit), n)
        whole, ids, j0 = got
        assert j0 + len(ids) == len(whole)  # admit's list: -1 * j0, the cached ids, then the rest
        assert len(whole) >= len(sg.trim_hit(req, hit)[0])  # its window's blocks include the last window's
        longer += len(whole) > len(sg.trim_hit(req, hit)[0])
    assert longer > 20  # cases where the receiver hits more than a computing engine could
