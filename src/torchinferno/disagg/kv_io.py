"""Pack and unpack a request's live KV rows: the payload of a prefill -> decode handoff.

Every family's cache is ``PagedKVCache.tensors[layer][i]`` of shape ``[num_blocks, block_size, *per_token]``
(``models.protocol.KVSpec``: GQA k/v, MLA latent + rope key, DSA indexer keys, DeepSeek-V4's per-token rows and
window entries at their closing slot; FP8 caches as stored). Token ``p`` of a request lives at slot
``block_ids[p // block_size] * block_size + p % block_size`` of every tensor. A handoff moves token rows
``[start, stop)`` of every tensor of every layer, in ``(layer, tensor)`` order, as raw bytes in one contiguous
``uint8`` buffer; nothing else (no padding, no unused slots): ``len(buffer) == (stop - start) * bytes_per_token``.
Both sides hold the same model, so the layout is implied by the ``KVSpec`` and only the byte count travels.

``which``: the ``(layer, tensor)`` indices a call covers (default: all, in that order) -- a tensor-parallel pair moves
only its rank's part (``disagg.sharding``).

Hybrid specs (``KVSpec.is_hybrid``): the whole group's tensors move rows ``[start, stop)`` through ``block_ids``, the
sliding group's only the blocks a later step can read: rows ``[max(start, s), stop)`` with ``s = stop - W`` rounded
down to a block start (``W = spec.sliding_window``), through ``sliding_block_ids``; a tensor with a rate m (one
row per window: V4's entries, packed or not) moves only the rows of the windows closing in ``[start, stop)``.
``payload_bytes`` is the size.

What the receiver's prefix cache then serves (``Scheduler.add_prefilled`` registers every full block it holds): the
whole group's blocks ``[0, stop)`` and the sliding blocks from ``max(start, s)`` on, all complete. A later handoff
there (``reserve_prefilled``, ``SlidingGroup.trim_handoff_hit``) computes nothing, so a hit of ``k`` blocks needs only
the sliding blocks of its own last window that lie before ``k`` (none for a prompt longer than ``k`` blocks plus a
window): a long shared prefix reuses the whole group (the entries, the bulk of a long V4 prompt) wherever it is. What
it cannot reuse: sliding rows the receiver never held -- a prompt whose last window reaches back before an earlier
handoff's ``s`` (e.g. a prompt shorter than a window plus a block, sharing a prefix whose window was not sent) trims
the hit to the first sliding block of that window it lacks and moves the rest, at most a window plus a block of rows
more than a colocated engine, which keeps every row it computed. Sending every sliding row instead would give that
back for the whole prompt's sliding bytes, which this layout exists to avoid.
"""

from __future__ import annotations

import torch

from torchinferno.cache.kv_cache import PagedKVCache
from torchinferno.models.protocol import packed_slot

__all__ = ["all_tensors", "live_kv_bytes", "pack_kv", "payload_bytes", "token_slots", "unpack_kv"]

Which = tuple[tuple[int, int], ...]  # (layer, tensor index) pairs, in pack order


def token_slots(block_ids: list[int], block_size: int, start: int, stop: int, device) -> torch.Tensor:
    """Flat slot index of tokens ``start..stop-1`` -> ``[stop - start]`` int64 on ``device``."""
    pos = torch.arange(start, stop, dtype=torch.long)
    blocks = torch.tensor(block_ids, dtype=torch.long)[pos // block_size]
    return (blocks * block_size + pos % block_size).to(device)


def all_tensors(kv: PagedKVCache) -> Which:
    """Every cache tensor's ``(layer, index)``, in pack order."""
    return tuple((li, ti) for li, layer in enumerate(kv.tensors) for ti in range(len(layer)))


def _selected(kv: PagedKVCache, which: Which | None) -> list[torch.Tensor]:
    return [kv.tensors[li][ti] for li, ti in (all_tensors(kv) if which is None else which)]


def live_kv_bytes(kv: PagedKVCache, num_tokens: int, which: Which | None = None) -> int:
    """Bytes of ``num_tokens`` tokens' KV over every layer and tensor (or ``which``): what one handoff moves."""
    return num_tokens * sum(t[0, 0].numel() * t.element_size() for t in _selected(kv, which))


def _sliding_start(kv: PagedKVCache, start: int, stop: int) -> int:
    """First sliding row moved: the window's, rounded down to its block (every sliding block the receiver holds is
    then complete: it may go into its prefix cache)."""
    return max(start, (stop - kv.spec.sliding_window) // kv.block_size * kv.block_size)


def _closing(start: int, stop: int, m: int) -> torch.Tensor:
    """Positions in ``[start, stop)`` where a window of ``m`` tokens closes (``(p + 1) % m == 0``)."""
    return torch.arange(start // m + 1, stop // m + 1, dtype=torch.long) * m - 1


def _entries(kv: PagedKVCache, which: Which | None):
    """(layer spec, tensor name, cache tensor) of every cache tensor (or ``which``), in pack order."""
    return [(kv.spec.layers[li], kv.spec.layers[li].tensors[ti][0], kv.tensors[li][ti])
            for li, ti in (all_tensors(kv) if which is None else which)]


def _tensors(kv: PagedKVCache, block_ids, sliding_block_ids, start: int, stop: int, which: Which | None = None):
    """(tensor, its slots) of every cache tensor (or ``which``), in pack order. Only the slot lists the selected
    tensors use are built, each once (a tensor-parallel pair moving only sliding tensors builds no whole-group
    slots, and the reverse)."""
    if not kv.spec.is_hybrid:
        tensors = _selected(kv, which)
        if not tensors:
            return []
        whole = token_slots(block_ids, kv.block_size, start, stop, kv.device)
        return [(t, whole) for t in tensors]
    if sliding_block_ids is None or len(sliding_block_ids) != len(block_ids):
        raise ValueError("a hybrid KV cache moves the sliding group through sliding_block_ids (one per block)")
    bs = kv.block_size
    memo: dict[tuple, torch.Tensor] = {}

    def slots(key: tuple, make) -> torch.Tensor:
        if key not in memo:
            memo[key] = make()
        return memo[key]

    out = []
    for spec, name, t in _entries(kv, which):
        rates = dict(spec.rates)
        if spec.is_sliding(name):
            out.append((t, slots(("sliding",), lambda: token_slots(
                sliding_block_ids, bs, _sliding_start(kv, start, stop), stop, kv.device))))
        elif name in rates:  # one row per window: only the closing tokens' rows (packed or not)
            m, rows = rates[name], t.shape[1]

            def closing(m=m, rows=rows) -> torch.Tensor:
                pos = _closing(start, stop, m)
                ids = torch.tensor(block_ids, dtype=torch.long)[pos // bs]
                return packed_slot(ids, pos, bs, rows).to(kv.device)
            out.append((t, slots(("rate", m, rows), closing)))
        else:
            out.append((t, slots(("whole",), lambda: token_slots(block_ids, bs, start, stop, kv.device))))
    return out


def payload_bytes(kv: PagedKVCache, start: int, stop: int, which: Which | None = None) -> int:
    """Bytes one handoff of rows ``[start, stop)`` of every tensor (or ``which``) moves (``live_kv_bytes`` unless the
    spec is hybrid)."""
    if not kv.spec.is_hybrid:
        return live_kv_bytes(kv, stop - start, which)
    s0 = _sliding_start(kv, start, stop)
    total = 0
    for spec, name, t in _entries(kv, which):
        rates = dict(spec.rates)
        if spec.is_sliding(name):
            n = stop - s0
        elif name in rates:
            n = stop // rates[name] - start // rates[name]
        else:
            n = stop - start
        total += n * t[0, 0].numel() * t.element_size()
    return total


def _rows(t: torch.Tensor) -> torch.Tensor:
    """The cache tensor as raw bytes, one row per token slot: ``[num_blocks * block_size, values * itemsize]``
    ``uint8``, a view (writes land in the cache). Byte rows make every dtype (FP8 included) move the same way."""
    return t.view(t.shape[0] * t.shape[1], -1).view(torch.uint8)


def pack_kv(kv: PagedKVCache, block_ids: list[int], start: int, stop: int, which: Which | None = None,
            sliding_block_ids: list[int] | None = None) -> torch.Tensor:
    """Gather rows ``[start, stop)`` of every cache tensor (or ``which``) -> one ``uint8 [bytes]`` buffer on the
    cache's device."""
    parts = [_rows(t).index_select(0, slots).reshape(-1)  # [n * row bytes]
             for t, slots in _tensors(kv, block_ids, sliding_block_ids, start, stop, which)]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=kv.device)


def unpack_kv(kv: PagedKVCache, block_ids: list[int], start: int, stop: int, buf: torch.Tensor,
              which: Which | None = None, sliding_block_ids: list[int] | None = None) -> None:
    """Scatter a ``pack_kv`` buffer (any device; same ``which``) into rows ``[start, stop)`` of ``block_ids``;
    checks its size."""
    want = payload_bytes(kv, start, stop, which)
    if buf.dtype != torch.uint8 or buf.numel() != want:
        raise ValueError(f"KV payload has {buf.numel()} {buf.dtype} values, expected {want} uint8 "
                         f"({stop - start} tokens of this cache's layout)")
    buf = buf.to(kv.device, non_blocking=True)
    off = 0
    for t, slots in _tensors(kv, block_ids, sliding_block_ids, start, stop, which):
        rows = _rows(t)  # [slots, row bytes]
        n = slots.numel()
        size = n * rows.shape[1]
        rows.index_copy_(0, slots, buf[off:off + size].view(n, rows.shape[1]))
        off += size
