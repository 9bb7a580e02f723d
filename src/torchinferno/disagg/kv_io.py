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
"""

from __future__ import annotations

import torch

from torchinferno.cache.kv_cache import PagedKVCache

__all__ = ["all_tensors", "live_kv_bytes", "pack_kv", "token_slots", "unpack_kv"]

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


def _rows(t: torch.Tensor) -> torch.Tensor:
    """The cache tensor as raw bytes, one row per token slot: ``[num_blocks * block_size, values * itemsize]``
    ``uint8``, a view (writes land in the cache). Byte rows make every dtype (FP8 included) move the same way."""
    return t.view(t.shape[0] * t.shape[1], -1).view(torch.uint8)


def pack_kv(kv: PagedKVCache, block_ids: list[int], start: int, stop: int, which: Which | None = None) -> torch.Tensor:
    """Gather rows ``[start, stop)`` of every cache tensor (or ``which``) -> one ``uint8 [bytes]`` buffer on the
    cache's device."""
    slots = token_slots(block_ids, kv.block_size, start, stop, kv.device)
    parts = [_rows(t).index_select(0, slots).reshape(-1) for t in _selected(kv, which)]  # [n * row bytes]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=kv.device)


def unpack_kv(kv: PagedKVCache, block_ids: list[int], start: int, stop: int, buf: torch.Tensor,
              which: Which | None = None) -> None:
    """Scatter a ``pack_kv`` buffer (any device; same ``which``) into rows ``[start, stop)`` of ``block_ids``;
    checks its size."""
    n = stop - start
    want = live_kv_bytes(kv, n, which)
    if buf.dtype != torch.uint8 or buf.numel() != want:
        raise ValueError(f"KV payload has {buf.numel()} {buf.dtype} values, expected {want} uint8 "
                         f"({n} tokens of this cache's layout)")
    buf = buf.to(kv.device, non_blocking=True)
    slots = token_slots(block_ids, kv.block_size, start, stop, kv.device)
    off = 0
    for t in _selected(kv, which):
        rows = _rows(t)  # [slots, row bytes]
        size = n * rows.shape[1]
        rows.index_copy_(0, slots, buf[off:off + size].view(n, rows.shape[1]))
        off += size
