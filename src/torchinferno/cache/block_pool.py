"""Paged KV block pool: reference counts, free queue and automatic prefix caching.

A block holds the KV of ``block_size`` consecutive tokens of one sequence. Blocks are shared
between sequences through reference counts; a *full* block whose KV has been written can be
registered under a chained hash (``hash(parent_hash, its token ids)``), so the hash of block
``i`` identifies the whole token prefix ``0 .. (i+1)*block_size``. A new prompt then reuses the
longest run of leading blocks whose hashes are cached.

Free blocks live in two queues:

* ``plain``: never hashed (or evicted) blocks, handed out first;
* ``evictable``: unreferenced blocks that still carry a hash, in LRU order (oldest first). They
  stay reusable by a prefix lookup until an allocation needs the space and evicts them.

Eviction order (``eviction``): ``lru`` (default: the least recently freed evictable block first) or ``fifo`` (the
block registered in the cache longest ago first, however often it was reused since: for policy research).

Invariants: every block is in exactly one of {referenced (ref_count > 0), plain, evictable};
``num_free == len(plain) + len(evictable)``; a hash maps to at most one block and that block
carries the hash.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from array import array
from collections import OrderedDict, deque
from typing import Iterable, Sequence

__all__ = ["EVICTION_POLICIES", "BlockPool", "NoFreeBlocksError", "cdiv", "hash_block_tokens", "hash_token_blocks"]

EVICTION_POLICIES = ("lru", "fifo")


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative ints: blocks of ``b`` tokens that hold ``a`` tokens."""
    return -(-a // b)


def hash_block_tokens(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """Chained 64-bit hash of one full block: depends on the block's tokens and its whole prefix.

    blake2b rather than Python's ``hash`` so values are stable across processes (a router in
    another process can compute the same keys) and collisions are negligible.
    """
    h = hashlib.blake2b(digest_size=8)
    h.update((parent_hash if parent_hash is not None else 0).to_bytes(8, "little", signed=False))
    h.update(b"\x01" if parent_hash is not None else b"\x00")
    h.update(array("q", token_ids).tobytes())
    return int.from_bytes(h.digest(), "little", signed=False)


def hash_token_blocks(token_ids: Sequence[int], block_size: int, start: int = 0, parent_hash: int | None = None) -> list[int]:
    """Hashes of the full blocks ``start, start+1, ...`` of ``token_ids`` (partial tail ignored).

    ``parent_hash`` must be the hash of block ``start - 1`` (``None`` when ``start == 0``).
    """
    out: list[int] = []
    for b in range(start, len(token_ids) // block_size):
        parent_hash = hash_block_tokens(parent_hash, token_ids[b * block_size : (b + 1) * block_size])
        out.append(parent_hash)
    return out


class NoFreeBlocksError(RuntimeError):
    """``allocate`` was asked for more blocks than are free (a scheduler bug: it checks first)."""


class BlockPool:
    """Owns ``num_blocks`` block ids, their reference counts and the prefix-cache hash table."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, eviction: str = "lru"):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        if eviction not in EVICTION_POLICIES:
            raise ValueError(f"eviction must be one of {', '.join(EVICTION_POLICIES)}, got {eviction!r}")
        self.eviction = eviction
        self._registered = [0] * num_blocks  # fifo: registration sequence number of each hashed block
        self._seq = itertools.count(1)
        self._fifo: list[tuple[int, int]] = []  # fifo: heap of (registration seq, block) of evictable blocks (lazy)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self._plain: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # LRU first
        self._cached: dict[int, int] = {}  # hash -> block id
        self.prefix_queries = 0  # prompt tokens looked up (tokens)
        self.prefix_hits = 0  # of which found in the cache (tokens)
        self.num_evictions = 0

    # ----------------------------------------------------------------------------- queries
    @property
    def num_free(self) -> int:
        """Blocks an ``allocate`` can hand out now (plain + evictable cached)."""
        return len(self._plain) + len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by a live sequence (cached-but-free blocks count as free)."""
        return self.num_used / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def cached_hashes(self) -> set[int]:
        """Every hash currently resolvable by a lookup (referenced or evictable blocks)."""
        return set(self._cached)

    def lookup(self, block_hashes: Sequence[int]) -> list[int]:
        """Block ids of the longest cached run of leading ``block_hashes`` (takes no reference)."""
        out: list[int] = []
        if not self.enable_prefix_caching:
            return out
        for h in block_hashes:
            b = self._cached.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def cached_id(self, block_hash: int) -> int | None:
        """Block id cached under ``block_hash``, else None (takes no reference)."""
        return self._cached.get(block_hash) if self.enable_prefix_caching else None

    def num_reclaimed_by(self, block_ids: Iterable[int]) -> int:
        """How many of ``block_ids`` are currently free (``touch`` would take them off the free queue)."""
        return sum(1 for b in block_ids if self.ref_counts[b] == 0)

    def record_prefix_query(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_queries += num_query_tokens
        self.prefix_hits += num_hit_tokens

    # ----------------------------------------------------------------------------- changes
    def touch(self, block_ids: Iterable[int]) -> None:
        """Take one more reference on each of ``block_ids`` (cached blocks being reused)."""
        for b in block_ids:
            if self.ref_counts[b] == 0:
                if b in self._evictable:
                    del self._evictable[b]
                else:  # a plain free block being re-referenced (should not happen for cached ones)
                    self._plain.remove(b)
            self.ref_counts[b] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks with ``ref_count == 1``: plain ones first, then LRU eviction."""
        if n > self.num_free:
            raise NoFreeBlocksError(f"asked for {n} blocks, {self.num_free} free")
        out: list[int] = []
        for _ in range(n):
            if self._plain:
                b = self._plain.popleft()
            elif self.eviction == "fifo":
                b = self._pop_fifo()
                self._evict(b)
            else:
                b, _ = self._evictable.popitem(last=False)
                self._evict(b)
            self.ref_counts[b] = 1
            out.append(b)
        return out

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference on each block; at zero a hashed block becomes evictable (MRU end).

        Callers free a sequence's blocks tail first, so when they all reach zero the tail is
        evicted before the head (the head is the part other prompts are likely to share).
        """
        for b in block_ids:
            if self.ref_counts[b] <= 0:
                raise RuntimeError(f"block {b} freed more times than referenced")
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                if self.block_hash[b] is not None:
                    self._evictable[b] = None
                    if self.eviction == "fifo":
                        heapq.heappush(self._fifo, (self._registered[b], b))
                else:
                    self._plain.append(b)

    def cache_block(self, block_id: int, block_hash: int) -> bool:
        """Register a full, written block under ``block_hash``; False if the hash is already taken.

        A duplicate (two sequences computed the same prefix independently) keeps the first block;
        the second stays unhashed and returns to the plain queue when freed.
        """
        if not self.enable_prefix_caching or self.block_hash[block_id] is not None:
            return False
        if block_hash in self._cached:
            return False
        self._cached[block_hash] = block_id
        self.block_hash[block_id] = block_hash
        self._registered[block_id] = next(self._seq)
        return True

    def reset_prefix_cache(self) -> None:
        """Forget every hash (evictable blocks become plain free blocks)."""
        for b in list(self._evictable):
            self._evict(b)
            self._plain.append(b)
        self._evictable.clear()
        self._fifo.clear()
        for b in range(self.num_blocks):
            self.block_hash[b] = None
        self._cached.clear()

    def _pop_fifo(self) -> int:
        """The evictable block registered longest ago (heap entries of blocks reused or re-registered since are
        stale and skipped; the heap is rebuilt when stale entries dominate)."""
        if len(self._fifo) > 4 * self.num_blocks:
            self._fifo = [(self._registered[b], b) for b in self._evictable]
            heapq.heapify(self._fifo)
        while True:
            seq, b = heapq.heappop(self._fifo)
            if b in self._evictable and self._registered[b] == seq:
                del self._evictable[b]
                return b

    def _evict(self, b: int) -> None:
        h = self.block_hash[b]
        if h is not None:
            self._cached.pop(h, None)
            self.block_hash[b] = None
            self.num_evictions += 1
