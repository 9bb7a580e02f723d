"""MLA decode over the paged latent cache on CUDA: absorbed attention with device-only inputs (CUDA-graph safe).

The latent cache of a layer is ``[num_blocks, block_size, R + r]`` (``c_kv`` then the rotated ``k_pe``: 576 values
at DeepSeek's shape). With W_UK folded into the query, every head of a request attends over the same latent rows:
one shared KV "head" with 576-dim keys and 512-dim values (``c_kv`` itself, a view of the same rows). That is the
GQA layout the split-K paged decode kernel (``kernels.triton.decode_attention``) already runs, with all ``H``
query heads in one group; its lengths and block tables are device tensors, so nothing here reads a host value.

* :func:`paged_absorbed_decode` — ``q_nope [B, H, dn], q_pe [B, H, r]`` -> ``[B, H, dv]`` (W_UV folded in after).
  At most :data:`MAX_HEADS_PER_LAUNCH` heads per launch (a program holds its heads' 576-wide query rows).
  Reference: ``models.common.mla.mla_absorbed_attention`` over the gathered latent (tests/kernels/test_mla_decode.py).
* :func:`write_latent` — the new tokens' latent rows into the cache; ``slot_mapping = -1`` (a padded row of a
  CUDA-graph bucket) writes nothing, without the boolean indexing (a host sync) the torch path needs for that.

Both are Triton launches (CUDA tensors; the interpreter runs them on CPU in tests). FP8 latent caches work as in
the GQA kernel (values stored unscaled, saturated; tiles upcast for the dot).
"""

from __future__ import annotations

import torch

from torchinferno.kernels import triton as _tri
from torchinferno.models.common.mla import split_kv_b

MAX_HEADS_PER_LAUNCH = 16  # heads per kernel launch (V2-Lite: one launch; V3's 128 heads: 8, each re-reading the rows)


def usable(q: torch.Tensor) -> bool:
    return _tri.usable(q)


def paged_absorbed_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, latent_cache: torch.Tensor,
                          w_kv_b: torch.Tensor, scale: float, block_tables: torch.Tensor,
                          seq_lens: torch.Tensor) -> torch.Tensor:
    """q_nope [B, H, dn], q_pe [B, H, r], latent_cache [N, bs, R + r], w_kv_b [H*(dn+dv), R],
    block_tables [B, max_blocks] int32, seq_lens [B] int32 (>= 1) -> [B, H, dv] in q_nope.dtype."""
    from torchinferno.kernels.triton.decode_attention import (
        batched_paged_decode_attention,
    )

    H, dn = q_nope.shape[1], q_nope.shape[2]
    r = q_pe.shape[-1]
    R = latent_cache.shape[-1] - r
    w_uk, w_uv = split_kv_b(w_kv_b, H, dn, w_kv_b.shape[0] // H - dn)
    q_lat = torch.einsum("bhd,hdr->bhr", q_nope, w_uk)  # [B, H, R]
    q = torch.cat([q_lat, q_pe.to(q_lat.dtype)], dim=-1).contiguous()  # [B, H, R + r]
    kc = latent_cache.unsqueeze(2)  # [N, bs, 1, R + r]: one KV head
    vc = kc[..., :R]  # values: c_kv, the first R of the same rows
    lens = seq_lens.to(torch.int32)
    o_lat = torch.empty(q.shape[0], H, R, dtype=q.dtype, device=q.device)  # [B, H, R]
    for h0 in range(0, H, MAX_HEADS_PER_LAUNCH):  # a program holds all its heads' [576-wide] query rows
        h1 = min(H, h0 + MAX_HEADS_PER_LAUNCH)
        batched_paged_decode_attention(q[:, h0:h1], kc, vc, block_tables, lens, scale, out=o_lat[:, h0:h1])
    return torch.einsum("bhr,hvr->bhv", o_lat, w_uv)


def write_latent(latent_cache: torch.Tensor, latent: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """latent_cache [N, bs, R + r] <- latent [T, R + r] at flat slots; slot -1 writes nothing. In place."""
    from torchinferno.kernels.triton.kv_cache import write_kv_cache

    rows = latent[:, None, :]  # [T, 1, R + r]
    cache = latent_cache.unsqueeze(2)  # [N, bs, 1, R + r]
    write_kv_cache(rows, rows, cache, cache, slot_mapping)  # K and V are the same rows: written twice, same values
