"""The scheduler's prefill/decode disaggregation hooks: requests whose prompt KV another engine computed.

A mixin of ``engine.scheduler.Scheduler`` (which owns every attribute used here: ``requests``, ``running``,
``held``, ``reserved``, ``pool``, ``sliding``, ``block_size``, ``_arrivals`` and the block helpers). The prefill role
holds a finished prefill's blocks until its KV is sent (``release_held``); the decode role reserves blocks for an
incoming prompt (``reserve_prefilled``), turns it into a running request when the KV has arrived
(``add_prefilled``) or frees it (``drop_reserved``). Only the scheduler changes ``Request`` state.
"""

from __future__ import annotations

from torchinferno.cache.block_pool import cdiv
from torchinferno.engine.request import Request, RequestStatus


class HandoffMixin:
    def release_held(self, request_id: str) -> bool:
        """Prefill role: drop a held request's blocks (its KV was sent, or nobody wants it). False if not held.
        Full blocks stay in the prefix cache, so a later prompt sharing the prefix skips their prefill."""
        req = self.held.pop(request_id, None)
        if req is None:
            return False
        self._free_blocks(req)
        return True

    def reserve_prefilled(self, req: Request) -> tuple[int, int] | None:
        """Decode role: allocate blocks for ``req``'s prompt, whose KV another engine computed.

        Reuses the longest cached prefix of the prompt's full blocks (their KV is already here; hybrid specs: and
        those of the last window's sliding blocks it covers, ``SlidingGroup.trim_handoff_hit``), allocates the
        rest and returns ``(start, stop)``: the token rows ``[start, stop)`` (``stop`` = prompt length) to receive.
        ``None`` (nothing changed) when the free blocks do not suffice, keeping one spare block per running
        request: the caller retries later, in order.
        Invariant: a reserved request is in ``reserved`` only, neither waiting nor running (not scheduled)."""
        if req.request_id in self.requests or req.request_id in self.reserved:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        n = req.num_prompt_tokens
        hit: list[int] = []
        if self.pool.enable_prefix_caching:
            self._ensure_hashes(req, (n // self.block_size) * self.block_size)
            hit = self.pool.lookup(req.block_hashes[: n // self.block_size])
        sg, shit, j0 = self.sliding, [], 0
        if hit and sg is not None:  # nothing is computed here: only the last window's sliding blocks must be cached
            hit, shit, j0 = sg.trim_handoff_hit(req, hit, n)
        need = cdiv(n, self.block_size) - len(hit)
        # Leave one free block per running request (its next decode block), so a handoff does not simply
        # preempt a running request to make room: it waits instead (back-pressure).
        if need + self.pool.num_reclaimed_by(hit) + len(self.running) > self.pool.num_free:
            return None
        # Hybrid: sliding blocks only from the block holding row n - W on (kv_io sends the window's blocks)
        js = max(len(hit), sg.first_kept(n)) if sg is not None else 0
        s_need = cdiv(n, self.block_size) - js
        if sg is not None and not sg.has_room(s_need, shit, len(self.running)):
            return None
        self.pool.touch(hit)
        req.block_ids = hit + self.pool.allocate(need)
        if sg is not None:
            sg.admit(req, shit, j0, skip=js - len(hit), need=s_need)
        req.num_registered_blocks = len(hit)
        req.num_cached_tokens = len(hit) * self.block_size
        self.pool.record_prefix_query(n, req.num_cached_tokens)
        req.arrival_index = next(self._arrivals)
        req.status = RequestStatus.WAITING
        self.reserved[req.request_id] = req
        return req.num_cached_tokens, n

    def add_prefilled(self, request_id: str) -> Request:
        """Decode role: the reserved request's prompt KV has arrived: it runs as if prefilled here
        (``num_computed_tokens`` = prompt length, its first output token already appended), so the next
        ``schedule()`` decodes it like any other running request."""
        req = self.reserved.pop(request_id)
        req.num_computed_tokens = req.num_prompt_tokens
        req.status = RequestStatus.RUNNING
        self.requests[request_id] = req
        self.running.append(req)
        self._register_full_blocks(req)
        return req

    def drop_reserved(self, request_id: str) -> bool:
        """Decode role: free a reserved request's blocks (aborted, or its transfer failed)."""
        req = self.reserved.pop(request_id, None)
        if req is None:
            return False
        req.status = RequestStatus.FINISHED_ABORTED
        self._free_blocks(req)
        return True
