"""Tensor-parallel roles of a prefill/decode pair: one KV transport pair per TP rank, inside the TP workers.

Design (the simpler correct one of the two the issue allows): prefill TP rank ``i`` pairs with decode TP rank ``i``
through its own two-rank transport group (``disagg.transport``, one store port per pair). Both roles run the same
tensor-parallel size, so rank ``i``'s cache on both sides holds the same shard (same model, same plan). Each
transport lives in its TP worker process (``engine.multiproc_executor``) and packs / unpacks there; the engine
cores keep the control messages and reach their workers through the executor's ``collective_rpc`` (ordered with the
steps on each worker's pipe). ``ShardedTransport`` is the core-side stand-in with ``KVTransport``'s interface: a
transfer is done when every pair has finished it (they run in the same order everywhere), and its bytes are the
sum over the pairs. Cost: while transfers are pending the core polls its workers once per loop turn (one pipe round
trip per rank; a step in flight is collected first, so async scheduling does not overlap those turns).
Both roles must have the same TP size (one ``--tensor-parallel-size``); different sizes per role would need
re-sharding on the wire and are not supported.

What each pair moves (``kv_part``), per cache tensor (comparing the rank's per-token shape with the full model's):

* sharded (GQA K/V heads split over the ranks): every pair moves its own rank's rows;
* replicated on every rank (the MLA latent + rope key, DSA indexer keys, V4's rows; a single KV head): each such
  tensor has one owner rank (greedy by bytes per token, so the pairs carry about equal shares), only the owner's
  pair moves it, and decode rank ``owner`` broadcasts it to the other decode ranks over the decode role's fan-out
  group (``FanoutConfig``) -- so the bytes crossing between the roles are exactly the live tokens' KV bytes (the
  broadcast is intra-role traffic, not counted in the transfer bytes);
* partly replicated (fewer KV heads than ranks, but more than one): every pair moves its rank's copy, so those
  tensors cross ``ranks / kv_heads`` times (reported in ``describe``, ``duplicate bytes/token``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from torchinferno.disagg.kv_io import Which
from torchinferno.disagg.transport import FanoutConfig, KVPart, KVTransport, TransferDone, TransportConfig

__all__ = ["PairLayout", "ShardedTransport", "kv_part"]


@dataclass(frozen=True)
class PairLayout:
    """What one TP rank's pair moves, per token (reported by the worker when its transport starts)."""

    rank: int
    device: str
    backend: str
    moved_bytes_per_token: int  # crosses this pair
    fanned_bytes_per_token: int  # replicated tensors this rank owns: they cross here, then are broadcast
    duplicate_bytes_per_token: int  # partly replicated tensors whose copies cross several pairs


def kv_part(model, kv, rank: int, world: int) -> tuple[Which, tuple[Which, ...], int]:
    """``(moved, fanned, duplicate bytes/token)`` of TP rank ``rank`` (module docstring). ``kv``: its cache;
    ``fanned[o]``: the replicated tensors rank ``o`` owns (the same table on every rank)."""
    full = model.family.kv_spec(getattr(model, "full_config", model.config))
    moved, owned, load, dup = [], [[] for _ in range(world)], [0] * world, 0
    for li, (local_layer, full_layer) in enumerate(zip(kv.spec.layers, full.layers)):
        for ti, ((_, shape), (_, full_shape)) in enumerate(zip(local_layer.tensors, full_layer.tensors)):
            local_n, full_n = math.prod(shape), math.prod(full_shape)
            nbytes = local_n * kv.tensors[li][ti].element_size()
            if world > 1 and local_n == full_n:  # every rank holds all of it: one owner moves it
                owner = load.index(min(load))
                load[owner] += nbytes
                owned[owner].append((li, ti))
                if owner == rank:
                    moved.append((li, ti))
                continue
            moved.append((li, ti))
            if world * local_n > full_n:  # this rank's share of the copies beyond one
                dup += (world * local_n - full_n) * kv.tensors[li][ti].element_size() // world
    fanned = tuple(tuple(o) for o in owned) if any(owned) else ()
    return tuple(moved), fanned, dup


# ------------------------------------------------------------------ worker side (collective_rpc targets)
def start_pair(worker, rank: int, pairs: tuple[TransportConfig, ...], fanout: FanoutConfig | None) -> PairLayout:
    """Build this rank's transport (its connection runs on its own thread) and say what it moves."""
    from torchinferno.disagg.kv_io import live_kv_bytes

    kv = worker.kv_cache
    moved, fanned, dup = kv_part(worker.model, kv, rank, len(pairs))
    fan = FanoutConfig(rank, len(pairs), fanout.host, fanout.port, fanout.timeout_s) if fanout is not None else None
    worker.kv_transport = KVTransport(pairs[rank], kv, KVPart(moved, fanned, fan))
    mine = fanned[rank] if fanned else ()
    return PairLayout(rank, str(kv.device), pairs[rank].backend, live_kv_bytes(kv, 1, moved),
                      live_kv_bytes(kv, 1, mine), dup)


def submit_pair(worker, rank: int, job: tuple) -> None:
    worker.kv_transport.submit(*job)


def poll_pair(worker, rank: int) -> list[TransferDone]:
    return worker.kv_transport.poll()


def close_pair(worker, rank: int) -> None:
    t = getattr(worker, "kv_transport", None)
    if t is not None:
        t.close()


# ------------------------------------------------------------------ core side
class ShardedTransport:
    """``KVTransport``'s interface over the TP workers' pairs (module docstring). ``executor``: a
    ``MultiprocExecutor``; ``pairs[i]``: pair ``i``'s config on this side; ``fanout``: the decode side's group."""

    def __init__(self, executor, pairs: tuple[TransportConfig, ...], fanout: FanoutConfig | None):
        if executor.world != len(pairs):
            raise ValueError(f"{len(pairs)} KV transport pairs for {executor.world} tensor-parallel ranks")
        self.executor = executor
        self.layouts: list[PairLayout] = executor.collective_rpc(start_pair, pairs, fanout)
        self._done: list[deque[TransferDone]] = [deque() for _ in pairs]
        self._pending = 0

    def submit(self, request_id: str, transfer_id: int, block_ids: list[int], start: int, stop: int,
               missing: bool = False, sliding_block_ids: list[int] | None = None) -> None:
        self._pending += 1
        sliding = None if sliding_block_ids is None else list(sliding_block_ids)
        self.executor.collective_rpc(submit_pair, (request_id, transfer_id, list(block_ids), start, stop, missing,
                                                   sliding))

    @property
    def pending(self) -> int:
        return self._pending

    def poll(self) -> list[TransferDone]:
        """Transfers every pair has finished, in order: ok when all are, bytes summed, the slowest pair's times."""
        if self._pending == 0:
            return []
        for q, dones in zip(self._done, self.executor.collective_rpc(poll_pair)):
            q.extend(dones)
        out = []
        while all(self._done):
            parts = [q.popleft() for q in self._done]
            first = parts[0]
            if any(p.transfer_id != first.transfer_id for p in parts):  # cannot happen: one order everywhere
                raise RuntimeError(f"KV transfer pairs out of step: {[p.transfer_id for p in parts]}")
            bad = [p for p in parts if not p.ok]
            out.append(TransferDone(first.request_id, first.transfer_id, not bad, sum(p.nbytes for p in parts),
                                    bad[0].error if bad else None, max(p.pack_s for p in parts),
                                    max(p.wire_s for p in parts)))
        self._pending -= len(out)
        return out

    def describe(self) -> str:
        per = [p.moved_bytes_per_token for p in self.layouts]
        fan = sum(p.fanned_bytes_per_token for p in self.layouts)
        dup = sum(p.duplicate_bytes_per_token for p in self.layouts)
        return (f"KV over {len(self.layouts)} tensor-parallel pairs ({', '.join(p.backend for p in self.layouts)}): "
                f"{sum(per)} bytes/token cross (per pair {'/'.join(map(str, per))}; {fan} of them replicated tensors, "
                f"each moved by one pair and broadcast among the decode ranks)"
                + (f", duplicate bytes/token {dup}" if dup else ""))

    def close(self) -> None:
        try:
            self.executor.collective_rpc(close_pair)
        except Exception:  # noqa: BLE001 - the workers are going away anyway
            pass
