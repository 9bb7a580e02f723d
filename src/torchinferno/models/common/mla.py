"""Multi-head latent attention (MLA) over a latent-only KV cache, plus DSA indexer selection.

Cache layout (per layer, per token): ``latent = [c_kv (kv_lora_rank) | k_pe (rope_dim)]`` — the
normalized compressed KV and the single rope key shared by all heads; nothing per head is ever
cached. ``kv_b_proj`` (weight ``[H * (dn + dv), R]``) expands ``c_kv`` into per-head ``k_nope``
(first ``dn`` rows of each head) and ``v`` (last ``dv`` rows).

Two equivalent ways to attend:

* **expanded** (prefill, chunked prefill): ``k = [c_kv @ W_UK^T | k_pe]``, ``v = c_kv @ W_UV^T``
  per head, then ordinary attention. Cost grows with ``S x H x (dn + dv)``.
* **absorbed** (decode): ``q_nope . (W_UK c) = (W_UK^T q_nope) . c``, so the query is folded into
  latent space (``q_lat [H, R]``) and attends directly over the cached ``[c_kv | k_pe]`` as one
  shared "KV head"; the output ``sum_s p_s c_s`` is mapped back per head with ``W_UV``. The cache
  is never expanded.

DeepSeek Sparse Attention (V3.2): a lightning indexer scores every (query, key) pair as
``score = sum_h w_h * ReLU(q_h . k)`` and each query keeps its ``top_k`` causal keys; MLA then
attends only to those. The vectorized scoring here is checked against ``reference_indexer_topk``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def split_kv_b(w_kv_b: torch.Tensor, num_heads: int, nope_dim: int, v_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_b_proj weight [H*(dn+dv), R] -> (W_UK [H, dn, R], W_UV [H, dv, R]) (views)."""
    w = w_kv_b.view(num_heads, nope_dim + v_dim, -1)
    return w[:, :nope_dim], w[:, nope_dim:]


def mla_expanded_attention(
    q_nope: torch.Tensor,  # [Q, H, dn]
    q_pe: torch.Tensor,  # [Q, H, r] (rope applied)
    latent: torch.Tensor,  # [S, R + r] keys/values of the context (rope applied to k_pe)
    w_kv_b: torch.Tensor,  # [H*(dn+dv), R]
    scale: float,
    mask: torch.Tensor | None,  # [Q, S] bool (True = attend) or None for plain causal (Q == S)
) -> torch.Tensor:  # [Q, H, dv]
    """Reference MLA: expand the latent into per-head K/V with ``kv_b_proj`` and attend."""
    H, dn = q_nope.shape[1], q_nope.shape[2]
    r = q_pe.shape[-1]
    S = latent.shape[0]
    c_kv, k_pe = latent.split([latent.shape[-1] - r, r], dim=-1)
    kv = F.linear(c_kv, w_kv_b).view(S, H, -1)  # [S, H, dn+dv]
    k_nope, v = kv.split([dn, kv.shape[-1] - dn], dim=-1)
    k = torch.cat([k_nope, k_pe[:, None, :].expand(S, H, r)], dim=-1)  # [S, H, dn+r]
    q = torch.cat([q_nope, q_pe], dim=-1)
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=mask, is_causal=mask is None, scale=scale,
    )
    return o[0].transpose(0, 1)


def mla_absorbed_attention(
    q_nope: torch.Tensor,  # [B, H, dn]  one query per sequence
    q_pe: torch.Tensor,  # [B, H, r]
    latent: torch.Tensor,  # [B, L, R + r] cached latent of each sequence (padded to L)
    w_kv_b: torch.Tensor,  # [H*(dn+dv), R]
    scale: float,
    mask: torch.Tensor | None,  # [B, L] bool (True = attend) or None (all L valid)
) -> torch.Tensor:  # [B, H, dv]
    """Decode MLA with weight absorption: attend over the latent cache as one shared KV head."""
    H, dn = q_nope.shape[1], q_nope.shape[2]
    r = q_pe.shape[-1]
    R = latent.shape[-1] - r
    w_uk, w_uv = split_kv_b(w_kv_b, H, dn, w_kv_b.shape[0] // H - dn)
    q_lat = torch.einsum("bhd,hdr->bhr", q_nope, w_uk)  # fold W_UK into the query: [B, H, R]
    q = torch.cat([q_lat, q_pe], dim=-1)[:, :, None, :]  # [B, H, 1, R+r]
    k = latent[:, None]  # [B, 1, L, R+r]: one latent "head" shared by all query heads
    v = latent[:, None, :, :R]  # values are c_kv itself
    attn_mask = None if mask is None else mask[:, None, None, :]
    o_lat = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale, enable_gqa=True)  # [B, H, 1, R]
    return torch.einsum("bhr,hvr->bhv", o_lat[:, :, 0], w_uv)  # fold W_UV into the output


# ------------------------------------------------------------------------ DSA indexer


def indexer_scores(
    q: torch.Tensor,  # [..., Q, Hi, Di]
    k: torch.Tensor,  # [..., S, Di]
    weights: torch.Tensor,  # [..., Q, Hi] per-head weights, all scales folded in
    limits: torch.Tensor | None = None,  # [..., Q] int: key s visible iff s < limits[q] (None: all)
) -> torch.Tensor:  # [..., Q, S] fp32
    """``score[q, s] = sum_h weights[q, h] * ReLU(q_h . k_s)`` in fp32, -inf where ``s >= limits[q]``.
    (``kernels.indexer_scores`` computes the same without the [..., Q, Hi, S] logits; the fused ops use it.)"""
    logits = torch.einsum("...qhd,...sd->...qhs", q.float(), k.float())
    scores = torch.einsum("...qh,...qhs->...qs", weights.float(), F.relu(logits))
    if limits is not None:
        scores = scores.masked_fill(torch.arange(k.shape[-2], device=k.device) >= limits[..., None], float("-inf"))
    return scores


def topk_keep_mask(scores: torch.Tensor, valid: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Boolean keep-mask [..., Q, S]: selected ``indices`` [..., Q, k] that are also ``valid``."""
    sel = torch.zeros_like(valid).scatter_(-1, indices, True)
    return sel & valid


def selected_slots(positions: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                   block_size: int) -> torch.Tensor:
    """Flat cache slots [B, k] (int64) of selected token ``positions`` [B, k]: ``block_tables[b, p // bs] * bs +
    p % bs``, or -1 where ``p >= seq_lens[b]`` (not visible; top-k of fewer visible keys pads with those).
    Device-only: no host value is read, shapes are those of the inputs (CUDA-graph capturable)."""
    pos = positions.long()
    table = block_tables.long()
    blk = torch.gather(table, 1, (pos // block_size).clamp(max=table.shape[1] - 1))
    return torch.where(pos < seq_lens.to(pos.device)[:, None], blk * block_size + pos % block_size, -1)


def masked_scores(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """-inf where a key is not visible (future / beyond the sequence) so top-k never prefers it."""
    return scores.masked_fill(~valid, float("-inf"))


def reference_indexer_topk(q, k, weights, top_k: int, context_len: int = 0) -> list[set[int]]:
    """Exact dense reference, one query at a time: the set of keys each query keeps.

    q [Q, Hi, Di] (query j sits at position ``context_len + j``), k [S, Di], weights [Q, Hi].
    Query j sees keys ``0..context_len + j``; it keeps all of them when there are at most
    ``top_k``, else the ``top_k`` with the largest ``sum_h w_h * max(q_h . k_s, 0)``.
    """
    out = []
    for j in range(q.shape[0]):
        visible = context_len + j + 1
        scores = []
        for s in range(visible):
            total = 0.0
            for h in range(q.shape[1]):
                total += float(weights[j, h]) * max(float(q[j, h].double() @ k[s].double()), 0.0)
            scores.append((total, s))
        scores.sort(key=lambda t: -t[0])
        out.append({s for _, s in scores[:top_k]})
    return out
