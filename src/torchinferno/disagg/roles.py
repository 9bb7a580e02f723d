"""Each engine core's side of a prefill/decode pair, driven by the engine-core process loop (``engine/core_proc``).

``handle(msg)`` takes the pair's control messages (``disagg.messages``; True when consumed) and sees every
``FinishRequests`` first; ``poll()`` advances transfers and returns the messages for the API process. Both run on
the engine loop's thread, between steps; the wire work runs on the transport's thread.

Prefill role: requests arrive with ``hold_kv`` (their blocks stay held when they finish); ``KVSend`` queues a
send of the held rows, and the blocks are released when it completes (kept in the prefix cache);
``KVRelease`` releases held KV without sending (an unknown id is ignored; one with a send queued is released when
the send ends).

Decode role: ``KVDecode`` requests queue (FIFO) until ``Scheduler.reserve_prefilled`` finds blocks for them
(back-pressure: nothing is dropped; a request waits while the pool is full), then a receive is queued and
``KVReady`` tells the API process which rows to send. When the rows have landed the request joins the running
batch (``Scheduler.add_prefilled``). An abort of a queued request answers ``KVDropped``; of a reserved one, it is
dropped when its transfer ends.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from torchinferno.disagg.messages import (
    TO_DECODE,
    TO_PREFILL,
    KVDecode,
    KVDropped,
    KVPrefill,
    KVReady,
    KVReceived,
    KVRelease,
    KVSend,
    KVSent,
)
from torchinferno.disagg.transport import FanoutConfig, KVTransport, TransportConfig
from torchinferno.engine.core_types import FinishRequests

__all__ = ["DecodeRole", "PrefillRole", "RoleConfig"]


def _sliding(sched, req) -> list[int] | None:
    """A hybrid KV cache's sliding-group blocks of ``req`` (kv_io moves that group through them), else None."""
    return None if sched.sliding_pool is None else req.sliding_block_ids


@dataclass(frozen=True)
class RoleConfig:
    """What an engine-core process needs to play one role (picklable). ``pairs``: with tensor parallelism, pair
    ``i``'s transport config for TP rank ``i`` (``disagg.sharding``; ``transport`` is then pair 0's); ``fanout``:
    the decode role's broadcast group over its ranks (rank field ignored: each worker uses its own)."""

    role: str  # "prefill" | "decode"
    transport: TransportConfig
    pairs: tuple[TransportConfig, ...] = ()
    fanout: FanoutConfig | None = None

    @property
    def message_types(self) -> tuple:
        return TO_PREFILL if self.role == "prefill" else TO_DECODE

    def make(self, core):
        if len(self.pairs) > 1:
            from torchinferno.disagg.sharding import ShardedTransport

            transport = ShardedTransport(core.executor, self.pairs, self.fanout)
        else:
            transport = KVTransport(self.transport, core.executor.kv_cache)
        return PrefillRole(core, transport) if self.role == "prefill" else DecodeRole(core, transport)


def describe_transport(transport) -> str:
    if hasattr(transport, "describe"):
        return transport.describe()
    return f"KV over one pair ({transport.cfg.backend})"


class PrefillRole:
    def __init__(self, core, transport: KVTransport):
        self.core = core
        self.transport = transport
        self._sending: set[str] = set()
        self._release_after_send: set[str] = set()

    def busy(self) -> bool:
        return self.transport.pending > 0

    def describe(self) -> str:
        return describe_transport(self.transport)

    def handle(self, msg) -> bool:
        sched = self.core.scheduler
        if isinstance(msg, KVPrefill):
            self.core.add_request(msg.request, hold_kv=True)
        elif isinstance(msg, KVSend):
            req = sched.held.get(msg.request_id)
            if req is None or msg.request_id in self._sending:
                self.transport.submit(msg.request_id, msg.transfer_id, [], msg.start, msg.stop, missing=True)
            else:
                self._sending.add(msg.request_id)
                self.transport.submit(msg.request_id, msg.transfer_id, req.block_ids, msg.start, msg.stop,
                                      sliding_block_ids=_sliding(sched, req))
        elif isinstance(msg, KVRelease):
            for rid in msg.request_ids:
                if rid in self._sending:
                    continue  # released when its send ends
                sched.release_held(rid)
        else:
            return False
        return True

    def poll(self) -> list:
        out = []
        for d in self.transport.poll():
            if d.request_id in self._sending:
                self._sending.discard(d.request_id)
                self.core.scheduler.release_held(d.request_id)
            out.append(KVSent(d.request_id, d.ok, d.nbytes, d.pack_s, d.wire_s, d.error))
        return out

    def close(self) -> None:
        self.transport.close()


class DecodeRole:
    def __init__(self, core, transport: KVTransport):
        self.core = core
        self.transport = transport
        self._queue: deque = deque()  # (Request, transfer_id), waiting for blocks
        self._aborted: set[str] = set()  # reserved, then aborted: dropped when the transfer ends
        self._waited: set[str] = set()  # found no free blocks at first: they waited (reported in KVReceived)
        self._dropped: list[str] = []  # aborted while queued: their held KV on the prefill side can go

    def busy(self) -> bool:
        return bool(self._queue) or self.transport.pending > 0

    def describe(self) -> str:
        return describe_transport(self.transport)

    def handle(self, msg) -> bool:
        if isinstance(msg, KVDecode):
            req = self.core.make_request(msg.request)
            req.output_token_ids.append(msg.first_token)
            req.num_prior_draws = 1  # the prefill role's seeded generator drew once for the first token
            self._queue.append((req, msg.transfer_id))
            return True
        if isinstance(msg, FinishRequests):  # not consumed: the core finishes running ones
            ids = set(msg.request_ids)
            for item in [q for q in self._queue if q[0].request_id in ids]:
                self._queue.remove(item)
                self._waited.discard(item[0].request_id)
                self._dropped.append(item[0].request_id)
            self._aborted |= ids & set(self.core.scheduler.reserved)
        return False

    def poll(self) -> list:
        out: list = [KVDropped(rid) for rid in self._dropped]
        self._dropped = []
        sched = self.core.scheduler
        for d in self.transport.poll():
            req = sched.reserved.get(d.request_id)
            start = req.num_cached_tokens if req is not None else 0
            n = req.num_prompt_tokens - start if req is not None else 0
            if d.ok and d.request_id not in self._aborted:
                sched.add_prefilled(d.request_id)
            else:  # aborted, or the transfer failed: KVReceived(ok=False) tells the API process why
                sched.drop_reserved(d.request_id)
            self._aborted.discard(d.request_id)
            out.append(KVReceived(d.request_id, d.ok, d.nbytes, d.pack_s, d.wire_s, d.error, n, start,
                                  d.request_id in self._waited))
            self._waited.discard(d.request_id)
        while self._queue:  # FIFO: a request that does not fit blocks the ones behind it (no starvation)
            req, tid = self._queue[0]
            rows = sched.reserve_prefilled(req)
            if rows is None:
                self._waited.add(req.request_id)
                break
            self._queue.popleft()
            self.transport.submit(req.request_id, tid, req.block_ids, rows[0], rows[1],
                                  sliding_block_ids=_sliding(sched, req))
            out.append(KVReady(req.request_id, tid, rows[0], rows[1]))
        return out

    def close(self) -> None:
        self.transport.close()
