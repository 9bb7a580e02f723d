"""Decode attention over selected cache rows with an optional per-head sink: dispatch and torch reference.

Serves DeepSeek-V4 (K = V rows, a sink per head) and V3.2's DSA decode (absorbed MLA over the indexer's selected
latent rows: keys the whole ``[c_kv | k_pe]`` row, values its first ``dv`` dims, no sink; ``kernels.mla_decode``).

``sparse_sink_decode(q [B, H, hd], kv_cache [N, bs, hd], win_slots [B, W], ent_cache [N, bs, hd] | None,
ent_slots [B, K] | None, sinks [H], scale) -> [B, H, hd]``: each sequence's one query attends the rows at its
flat cache slots (window rows of ``kv_cache``, then compressed entries of ``ent_cache``; slot ``-1`` = masked,
``valid`` masks fold into that) with ``softmax([logits, sink])`` minus the sink column; rows are K and V both
(the interleaved partial rope already applied when they were cached, as the torch model path does). With ``dv``
the values are the first ``dv`` dims of each row (out ``[B, H, dv]``); ``sinks=None``: no sink column, and a
sequence with no valid slot gives 0 (not NaN).

The Triton kernel (``kernels.triton.sparse_sink_decode``) runs on CUDA when the caller opts in (``use_triton``)
and the caches are row-flat; :func:`reference` everywhere else: it is the same arithmetic as
``V4Attention._attend`` (logits in the activation dtype, softmax in fp32 with the fp32 sink). Both read only
device tensors with shapes fixed by the batch (CUDA-graph capturable).
"""

from __future__ import annotations

import torch

from torchinferno.kernels import triton as _tri

def config_key(num_heads: int, head_dim: int, dtype: torch.dtype) -> str:
    return f"H{num_heads}-D{head_dim}-{str(dtype).removeprefix('torch.')}"


def fold_valid(slots: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """slots [B, K] with a validity mask [B, K] -> slots with ``-1`` where not valid."""
    return slots if valid is None else torch.where(valid, slots, -1)


def usable(q: torch.Tensor, *caches) -> bool:
    """The Triton kernel applies: Triton on q's device, caches in a float dtype the kernel loads, row-flat."""
    if not _tri.usable(q):
        return False
    for c in caches:
        if c is None:
            continue
        if c.dtype not in (torch.float32, torch.float16, torch.bfloat16) or c.stride(-1) != 1 \
                or c.stride(0) != c.shape[1] * c.stride(1):
            return False
    return True


def sparse_sink_decode(q, kv_cache, win_slots, ent_cache, ent_slots, sinks, scale: float, use_triton: bool = True,
                       win_valid=None, ent_valid=None, config: dict | None = None, dv: int | None = None) -> torch.Tensor:
    """See the module docstring. ``use_triton=False`` forces the reference; ``config``: the kernel's tiles (BLOCK_H,
    BLOCK_N, num_warps; prepared offline by ``kernels.v4_artifacts``), its defaults when None."""
    win_slots = fold_valid(win_slots, win_valid)
    if ent_slots is not None:
        ent_slots = fold_valid(ent_slots, ent_valid)
    if use_triton and usable(q, kv_cache, ent_cache):
        from torchinferno.kernels.triton import sparse_sink_decode as k

        return k.sparse_sink_decode(q, kv_cache, win_slots, ent_cache, ent_slots, sinks, scale, config, dv=dv)
    return reference(q, kv_cache, win_slots, ent_cache, ent_slots, sinks, scale, dv)


def reference(q, kv_cache, win_slots, ent_cache, ent_slots, sinks, scale: float, dv: int | None = None) -> torch.Tensor:
    """Torch oracle: gather the rows, masked logits in q's dtype, fp32 softmax with the sink (if any), weighted sum
    of each row's first ``dv`` dims (all by default)."""
    slots = win_slots
    rows = kv_cache.flatten(0, 1)[win_slots.clamp(min=0)].to(q.dtype)  # [B, W, hd]
    if ent_cache is not None and ent_slots is not None and ent_slots.shape[-1]:
        rows = torch.cat([rows, ent_cache.flatten(0, 1)[ent_slots.clamp(min=0)].to(q.dtype)], dim=1)
        slots = torch.cat([win_slots, ent_slots], dim=1)
    logits = torch.einsum("bhd,bkd->bhk", q, rows) * scale  # [B, H, K]
    logits = logits.masked_fill((slots < 0)[:, None, :], float("-inf")).float()
    values = rows if dv is None else rows[..., :dv]
    if sinks is None:  # a row with no valid slot: softmax of all -inf is NaN; it gives 0 (as the kernel)
        probs = torch.softmax(logits, dim=-1).masked_fill(~(slots >= 0).any(-1)[:, None, None], 0.0)
        return torch.einsum("bhk,bkd->bhd", probs.to(rows.dtype), values)
    sink = sinks.float()[None, :, None].expand(q.shape[0], -1, 1)
    full = torch.cat([logits, sink], dim=-1)
    probs = torch.softmax(full - full.amax(dim=-1, keepdim=True), dim=-1)[..., :-1]
    return torch.einsum("bhk,bkd->bhd", probs.to(rows.dtype), values)
