"""Save a cached prefix's KV blocks to a safetensors file, and restore them into another engine's prefix cache.

``save_prefix(core, token_ids, path)`` writes the KV of the longest run of leading full blocks of ``token_ids`` that
``core``'s prefix cache holds: for each layer ``l`` and cache tensor ``name`` (the model's ``KVSpec``), one tensor
``"{l}.{name}"`` of shape ``[n_blocks, block_size, *per_token_shape]``, plus metadata (the covered tokens, the block
size, the dtype and every tensor's per-block shape; format ``torchinferno-prefix-v1``).

``restore_prefix(core, path)`` checks the file against ``core``'s KV layout (block size, layers, names, shapes, dtype:
a mismatch is one ``ConfigError`` line naming what differs), writes each block the cache does not hold yet into a
freshly allocated block and registers it under the same chained hash (``cache.block_pool.hash_token_blocks``), then
releases it as an evictable cached block: a later prompt starting with those tokens reuses them exactly as if this
engine had computed them (same tokens: tests/cache/test_prefix_snapshot.py).

Hybrid KV caches (``KVSpec.is_hybrid``, deepseek-v4): the whole group's tensors are saved for every block, the
sliding group's only for the blocks of the prefix's last window (``sliding_first`` .. end, in the metadata; the
saved prefix is the longest one whose window is cached), so a restored snapshot serves a hit of its full length.

Both need an in-process, single-device engine (``UniprocExecutor``) with prefix caching on, between steps (no
request in flight).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from torchinferno.cache.block_pool import hash_token_blocks
from torchinferno.errors import ConfigError

__all__ = ["FORMAT", "PrefixSnapshot", "restore_prefix", "save_prefix"]

FORMAT = "torchinferno-prefix-v1"


@dataclass(frozen=True)
class PrefixSnapshot:
    path: Path
    num_tokens: int  # tokens covered (whole blocks)
    num_blocks: int  # blocks written (save) or newly registered (restore)


def _kv(core):
    kv = getattr(core.executor, "kv_cache", None)
    if kv is None or not hasattr(core.executor, "worker"):
        raise ConfigError("a prefix snapshot needs an in-process single-device engine (no tensor/pipeline parallel)")
    if not core.pool.enable_prefix_caching:
        raise ConfigError("a prefix snapshot needs prefix caching on")
    if core.has_unfinished():
        raise ConfigError("a prefix snapshot is taken or restored between requests (requests are in flight)")
    return kv


def _sliding(kv, spec, name: str) -> bool:
    return kv.num_sliding_blocks is not None and spec.is_sliding(name)


def _layout(kv) -> dict[str, list[int]]:
    out = {}
    for layer, (tensors, spec) in enumerate(zip(kv.tensors, kv.spec.layers)):
        for t, (name, _) in zip(tensors, spec.tensors):
            if t.shape[0] != (kv.num_sliding_blocks if _sliding(kv, spec, name) else kv.num_blocks):
                raise ConfigError(f"KV tensor {layer}.{name} is not paged by block (shape {tuple(t.shape)})")
            out[f"{layer}.{name}"] = list(t.shape[1:])
    return out


def save_prefix(core, token_ids: list[int], path: str | Path) -> PrefixSnapshot:
    """Write the cached leading blocks of ``token_ids`` (module docstring). Raises if none is cached."""
    from safetensors.torch import save_file

    kv = _kv(core)
    bs = core.pool.block_size
    hashes = hash_token_blocks(token_ids, bs)
    blocks = core.pool.lookup(hashes)
    sliding, first = [], 0
    if blocks and core.sliding_pool is not None:  # the longest prefix whose last window is cached too
        from torchinferno.engine.request import Request

        blocks, sliding, first = core.scheduler.sliding_hit(Request("", list(token_ids), None, block_hashes=hashes),
                                                            blocks)
    if not blocks:
        raise ConfigError(f"no block of this prefix is cached (needs >= {bs} tokens computed by this engine)")
    idx = torch.tensor(blocks, dtype=torch.long, device=kv.device)
    sidx = torch.tensor(sliding, dtype=torch.long, device=kv.device)
    layout = _layout(kv)
    tensors = {}
    for layer, (ts, spec) in enumerate(zip(kv.tensors, kv.spec.layers)):
        for t, (name, _) in zip(ts, spec.tensors):
            tensors[f"{layer}.{name}"] = t.index_select(0, sidx if _sliding(kv, spec, name) else idx).contiguous().cpu()
    n = len(blocks) * bs
    meta = {"format": FORMAT, "block_size": str(bs), "dtype": str(kv.dtype), "layout": json.dumps(layout),
            "token_ids": json.dumps([int(x) for x in token_ids[:n]])}
    if core.sliding_pool is not None:
        meta["sliding_first"] = str(first)
    p = Path(path)
    save_file(tensors, str(p), metadata=meta)
    return PrefixSnapshot(p, n, len(blocks))


def restore_prefix(core, path: str | Path) -> PrefixSnapshot:
    """Register the snapshot's blocks in ``core``'s prefix cache (module docstring); returns the blocks added."""
    from safetensors import safe_open

    kv = _kv(core)
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"prefix snapshot not found: {p}")
    with safe_open(str(p), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT:
            raise ConfigError(f"{p} is not a prefix snapshot ({FORMAT})")
        bs = core.pool.block_size
        if int(meta["block_size"]) != bs:
            raise ConfigError(f"prefix snapshot block size {meta['block_size']} != this engine's {bs}")
        if meta["dtype"] != str(kv.dtype):
            raise ConfigError(f"prefix snapshot KV dtype {meta['dtype']} != this engine's {kv.dtype}")
        mine, theirs = _layout(kv), json.loads(meta["layout"])
        if mine != theirs:
            k = min(x for x in set(mine) | set(theirs) if mine.get(x) != theirs.get(x))
            raise ConfigError(f"prefix snapshot KV layout differs from this engine's (tensor {k}: per-block shape "
                              f"{theirs.get(k)} in the file, {mine.get(k)} here)")
        if ("sliding_first" in meta) != (core.sliding_pool is not None):
            raise ConfigError("prefix snapshot and engine differ in their KV cache groups (sliding window or not)")
        tokens = json.loads(meta["token_ids"])
        data = {k: f.get_tensor(k) for k in mine}
    pool, sp = core.pool, core.sliding_pool
    hashes = hash_token_blocks(tokens, bs)
    have = pool.lookup(hashes)  # leading blocks already cached here: kept as they are
    missing = list(range(len(have), len(hashes)))
    if len(missing) > pool.num_free - pool.num_reclaimed_by(have):
        raise ConfigError(f"the KV pool has no room for {len(missing)} blocks ({pool.num_free} free)")
    s_have, s_missing, first = [], [], int(meta.get("sliding_first", 0))
    if sp is not None:  # the last window's sliding blocks: any of them may be cached here already
        for j in range(first, len(hashes)):
            b = sp.lookup([hashes[j]])
            (s_have if b else s_missing).append(b[0] if b else j)
        if len(s_missing) > sp.num_free - sp.num_reclaimed_by(s_have):
            raise ConfigError(f"the sliding KV pool has no room for {len(s_missing)} blocks ({sp.num_free} free)")
        sp.touch(s_have)
    pool.touch(have)  # hold them while allocating, so the allocation cannot evict them
    new = pool.allocate(len(missing))
    s_new = sp.allocate(len(s_missing)) if sp is not None else []
    copies = {False: (torch.tensor(missing, dtype=torch.long), torch.tensor(new, dtype=torch.long, device=kv.device)),
              True: (torch.tensor(s_missing, dtype=torch.long) - first, torch.tensor(s_new, dtype=torch.long,
                                                                                      device=kv.device))}
    for layer, (ts, spec) in enumerate(zip(kv.tensors, kv.spec.layers)):
        for t, (name, _) in zip(ts, spec.tensors):
            src, dst = copies[_sliding(kv, spec, name)]
            t.index_copy_(0, dst, data[f"{layer}.{name}"].index_select(0, src).to(t.device))
    added = 0
    for b, i in zip(new, missing):
        added += pool.cache_block(b, hashes[i])
    for b, j in zip(s_new, s_missing):
        sp.cache_block(b, hashes[j])
    pool.free(reversed(have + new))  # tail first: the head of the prefix is evicted last
    if sp is not None:
        sp.free(reversed(s_have + s_new))
    return PrefixSnapshot(p, len(hashes) * bs, added)
