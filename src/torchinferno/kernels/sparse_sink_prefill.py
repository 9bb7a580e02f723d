"""DeepSeek-V4 prefill attention (one sequence's new queries) with a per-head sink: dispatch and torch reference.

``sparse_sink_prefill(q [Q, H, hd], pos [Q], keys [S - lo, hd], lo, ent [n, hd] | None, vis [Q, n] | None, sinks
[H], scale, window, ...) -> [Q, H, hd]``: query ``i`` (at position ``pos[i]``) attends the K=V rows of positions
``lo .. S-1`` inside its sliding window (key ``j`` visible iff ``j <= pos`` and ``pos - j < window``) and the
compressed entries ``w`` with ``vis[i, w]`` (HCA: every closed window, ``visible_entries``; CSA: the indexer's
top-k among them, ``Indexer.select``), softmax over ``[logits, sink]`` with the sink column dropped.

:func:`reference` is ``V4Attention._attend`` (the model's torch path and the oracle): it materializes the logits
``[H, Q, S - lo + n]`` (fp32 after the activation-dtype einsum), gigabytes for a 4k-token prompt at V4-Flash's
shape (64 heads, 1k compressed entries). The Triton path never does: every query becomes one row of the decode
kernel (``kernels.triton.sparse_sink_decode``) with its own slot lists, ``window`` slots into ``keys`` (-1 before
position 0) and up to ``width`` entry slots into ``ent`` (the true columns of its ``vis`` row, compacted, -1
padded), with ``round_logits`` so each logit is rounded in the activation dtype as the reference rounds it (the
softmax stays fp32). Extra memory: the slot lists, ``Q * (window + width)`` int64.

Design trade-off (option (i) of the issue): one kernel, already tested for decode, and exact per-query selection
of the CSA entries at ``width = index_topk`` (no dense pass over all ``n`` entries). Its cost: every query reads
its ``window + width`` rows itself (once per head block), so neighbouring queries re-read the shared window rows
(L2 hits at these sizes) where a flash-style kernel with query tiles over the window would read them once per
tile; the head block is the MMA's M dimension (all heads share the one K=V head), so the tensor cores stay busy
without query tiling. A packed batch of sequences is the same call over the concatenated rows (slots index one
shared ``keys`` / ``ent`` buffer); the model calls it per sequence, as ``_attend``.

Used where the decode kernel is (``V4Attention.sparse_kernel``: the v1 ops module, turned off by a mismatching
kernel artifact; never in batch-invariant mode), on CUDA with Triton; the reference everywhere else.
"""

from __future__ import annotations

import torch

from torchinferno.kernels import sparse_sink_decode as ssd

# per-query rows: enough of them that split-K is never needed; tiles for the decode kernel at prefill's row counts
PREFILL_CONFIG = {"BLOCK_H": 16, "BLOCK_N": 32, "num_warps": 4, "SPLITS": "auto"}


def reference(q, pos, keys, lo: int, ent, vis, sinks, scale: float, window: int) -> torch.Tensor:
    """The torch path (``V4Attention._attend``): q [Q, H, hd] at positions pos [Q]; keys [S - lo, hd] = K=V rows of
    positions lo..S-1; ent [n, hd] compressed entries with their visibility/selection vis [Q, n] (None: sliding
    only) -> [Q, H, hd]. Logits in the activation dtype, softmax in fp32 with the fp32 sink."""
    j = lo + torch.arange(keys.shape[0], device=q.device)
    mask = (j[None, :] <= pos[:, None]) & (pos[:, None] - j[None, :] < window)  # [Q, S - lo]
    if ent is not None:
        keys = torch.cat([keys, ent.to(keys.dtype)], dim=0)
        mask = torch.cat([mask, vis], dim=1)
    logits = torch.einsum("qhd,kd->hqk", q, keys) * scale  # [H, Q, K] in the activation dtype
    logits = logits.masked_fill(~mask[None], float("-inf")).float()
    sinks = sinks.float()[:, None, None].expand(-1, logits.shape[1], 1)
    full = torch.cat([logits, sinks], dim=-1)  # softmax in fp32 with the fp32 sink (as transformers promotes)
    probs = torch.softmax(full - full.amax(dim=-1, keepdim=True), dim=-1)[..., :-1]
    return torch.einsum("hqk,kd->qhd", probs.to(keys.dtype), keys)


def window_slots(pos: torch.Tensor, lo: int, window: int) -> torch.Tensor:
    """pos [Q] -> [Q, window] int64 rows of ``keys`` (row r = position lo + r): positions pos - window + 1 .. pos,
    -1 before ``lo`` (as the reference, which has no key there). Invariant: every pos < lo + len(keys)."""
    p = pos.long()[:, None] - window + 1 + torch.arange(window, device=pos.device)  # [Q, W]
    return torch.where(p >= lo, p - lo, -1)


def entry_slots(vis: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """vis [Q, n] bool -> [Q, width] int64: each row's true columns in ascending order, then -1. ``width`` (default
    n) must be at least every row's count of true columns (CSA: ``index_topk``; those past it would be dropped)."""
    Q, n = vis.shape
    width = n if width is None else min(int(width), n)
    cols = torch.arange(n, device=vis.device)
    if width == n:
        return torch.where(vis, cols, -1)  # HCA (and CSA before top-k bites): every column, masked ones -1
    order = torch.sort((~vis).to(torch.uint8), dim=1, stable=True).indices[:, :width]  # true columns first
    return torch.where(vis.gather(1, order), order, -1)


def sparse_sink_prefill(q, pos, keys, lo: int, ent, vis, sinks, scale: float, window: int, use_triton: bool = True,
                        width: int | None = None, config: dict | None = None) -> torch.Tensor:
    """See the module docstring. ``use_triton=False`` (or no Triton for q's device) -> :func:`reference`.
    ``width``: the most entries any query selects (CSA: ``min(index_topk, n)``; None: n)."""
    kv = keys.contiguous()[:, None, :]  # [S - lo, 1, hd]: one row per "block", flat slot = row
    if not (use_triton and ssd.usable(q, kv)):
        return reference(q, pos, keys, lo, ent, vis, sinks, scale, window)
    from torchinferno.kernels.triton import sparse_sink_decode as k

    win = window_slots(pos, lo, window)
    ent_cache = ent_s = None
    if ent is not None and ent.shape[0]:
        ent_cache = ent.to(kv.dtype).contiguous()[:, None, :]  # [n, 1, hd]: one row per "block"
        ent_s = entry_slots(vis, width)
    return k.sparse_sink_decode(q, kv, win, ent_cache, ent_s, sinks, scale,
                                {**PREFILL_CONFIG, **(config or {})}, round_logits=True)
