"""The sliding-window KV cache group of a hybrid KV spec (``KVSpec.is_hybrid``, e.g. deepseek-v4), as the scheduler
keeps it: its own ``BlockPool`` and, per request, ``Request.sliding_block_ids``.

Invariants (the scheduler calls these and nothing else touches the lists):

* ``sliding_block_ids`` runs parallel to ``block_ids`` (same length, block ``i`` = tokens ``i*bs .. i*bs+bs-1``);
  entry ``i`` is -1 when that block lies wholly before the window (given back, or never needed);
* ``slide`` gives back, oldest first, every block whose tokens all lie before ``num_computed_tokens - window``;
  a step at context ``c`` reads no sliding row before ``c - window`` (``KVLayerSpec.window``), so nothing reads
  a -1 entry (the runner's table keeps a stale id there);
* a sliding block is offered to the prefix cache under the same chained hash as its whole-group block, only while
  the request still holds it; every held sliding block has all its rows written (computed, hit or received whole),
  so a cached one is complete;
* a prefix hit of ``k`` blocks needs the sliding blocks ``j0 .. k-1`` (``j0 = (k*bs - window) // bs``) cached:
  ``trim_hit`` takes the longest such ``k``;
* a handoff's receiver (P/D decode side, ``Scheduler.reserve_prefilled``) computes no prompt token: its first step
  reads sliding rows from block ``first_kept(n)`` on (``n`` = prompt length) and the rows after the hit arrive
  (``disagg.kv_io`` moves sliding rows from ``max(k*bs, first_kept(n)*bs)``), so a hit of ``k`` blocks there needs
  only the sliding blocks ``first_kept(n) .. k-1`` cached (none when ``k <= first_kept(n)``): ``trim_handoff_hit``.
"""

from __future__ import annotations

from torchinferno.cache.block_pool import BlockPool
from torchinferno.engine.request import Request

__all__ = ["SlidingGroup"]


class SlidingGroup:
    """The sliding group's pool and its per-request block lists (module docstring)."""

    def __init__(self, pool: BlockPool, window: int):
        if window <= 0:
            raise ValueError(f"a sliding group needs a window > 0, got {window}")
        self.pool = pool
        self.window = window
        self.block_size = pool.block_size

    def first_kept(self, num_computed_tokens: int) -> int:
        """Index of the first block a step at context ``num_computed_tokens`` may read."""
        return max(0, (num_computed_tokens - self.window) // self.block_size)

    def free_all(self, req: Request) -> None:
        """Give back every block of ``req`` (tail first: the shareable head is evicted last)."""
        self.pool.free([b for b in reversed(req.sliding_block_ids) if b >= 0])
        req.sliding_block_ids = []
        req.num_slid_blocks = 0

    def slide(self, req: Request) -> None:
        """Give back the blocks wholly before ``num_computed_tokens - window`` (oldest first: the LRU end, so they
        are evicted before the window's blocks a prefix hit needs)."""
        n = min(len(req.sliding_block_ids), self.first_kept(req.num_computed_tokens))
        if n <= req.num_slid_blocks:
            return
        ids = req.sliding_block_ids
        self.pool.free([b for b in ids[req.num_slid_blocks : n] if b >= 0])
        ids[req.num_slid_blocks : n] = [-1] * (n - req.num_slid_blocks)
        req.num_slid_blocks = n

    def extend(self, req: Request, need: int) -> None:
        """Append ``need`` fresh blocks (in lockstep with the whole group's)."""
        if need:
            req.sliding_block_ids.extend(self.pool.allocate(need))

    def trim_hit(self, req: Request, hit: list[int]) -> tuple[list[int], list[int], int]:
        """Trim a whole-group prefix hit to the longest ``k`` blocks whose window is cached too -> (whole ids [k],
        sliding ids of blocks ``j0 .. k-1``, ``j0``); ``req.block_hashes`` covers the hit.

        One walk from the end, each block looked up at most once: candidate ``k`` checks blocks ``k-1, k-2, ..``
        down to ``j0(k)``; the first uncached block ``i`` rules out every ``k'`` with ``j0(k') <= i < k'``, so the
        next candidate is ``k = i`` (its blocks all lie below ``i``: none is looked up twice)."""
        hashes = req.block_hashes
        k = len(hit)
        while k > 0:
            j0 = self.first_kept(k * self.block_size)
            ids: list[int] = []  # sliding ids of blocks k-1, k-2, .. (reversed on success)
            i = k - 1
            while i >= j0:
                b = self.pool.cached_id(hashes[i])
                if b is None:
                    break
                ids.append(b)
                i -= 1
            if i < j0:
                ids.reverse()
                return hit[:k], ids, j0
            k = i
        return [], [], 0

    def trim_handoff_hit(self, req: Request, hit: list[int], num_tokens: int) -> tuple[list[int], list[int], int]:
        """``trim_hit`` for a receiver of ``num_tokens`` prompt rows (module docstring) -> (whole ids [k], sliding ids
        of blocks ``j0 .. k-1``, ``j0``) with ``j0 = min(k, first_kept(num_tokens))``: ``k`` = the first block in
        ``first_kept .. len(hit)-1`` whose sliding copy is not cached, else ``len(hit)``."""
        fk = self.first_kept(num_tokens)
        ids: list[int] = []
        for i in range(fk, len(hit)):
            b = self.pool.cached_id(req.block_hashes[i])
            if b is None:
                return hit[:i], ids, fk
            ids.append(b)
        return hit, ids, min(fk, len(hit))

    def has_room(self, need: int, hit_ids: list[int], spare: int = 0) -> bool:
        """``need`` fresh blocks fit after touching ``hit_ids``, leaving ``spare`` free."""
        return need + self.pool.num_reclaimed_by(hit_ids) + spare <= self.pool.num_free

    def admit(self, req: Request, hit_ids: list[int], j0: int, skip: int = 0, need: int = 0) -> None:
        """A new block list: -1 for blocks ``< j0``, the cached ``hit_ids`` (referenced), ``skip`` more -1 entries
        (blocks no step will read: a handoff receives only the window), then ``need`` fresh blocks."""
        self.pool.touch(hit_ids)
        req.sliding_block_ids = [-1] * j0 + list(hit_ids) + [-1] * skip
        req.num_slid_blocks = j0
        self.extend(req, need)

    def register(self, req: Request, i: int) -> None:
        """Offer block ``i`` to the prefix cache (under ``req.block_hashes[i]``) if the request still holds it."""
        b = req.sliding_block_ids[i]
        if b >= 0:
            self.pool.cache_block(b, req.block_hashes[i])
