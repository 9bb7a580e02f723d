"""Same contract as ``raw_ops`` routed to ``torchinferno.kernels`` (Triton on CUDA, fused torch on CPU).

Indexer scoring is the Triton kernel on CUDA (``kernels.indexer_scores``: no [Q, Hi, S] logits). Interleaved rope
and absorbed MLA attention have no kernel entry yet and use the reference implementations (a later variant swaps
them for kernels behind this contract). The grouped MoE is the fused Triton MoE on CUDA (``moe.fused_expert_mlp``: no
host sync), the grouped reference elsewhere.
"""

from __future__ import annotations

import torch

from torchinferno import kernels
from torchinferno.kernels import indexer_scores as indexer_kernel
from torchinferno.kernels import mla_decode, mla_prefill
from torchinferno.models.common import mla, moe
from torchinferno.models.common.attention import gather_kv
from torchinferno.models.common.norm_act_ops import Fused
from torchinferno.models.common.rope import apply_rope_interleaved

rms_norm = Fused.rms_norm
add_rms_norm = Fused.add_rms_norm
silu_and_mul = Fused.silu_and_mul

NAME = "fused"
# MLA decode through kernels.mla_decode on CUDA (paged latent cache, device-only inputs: CUDA-graph capturable)
PAGED_MLA_DECODE = True
# SparseMoE's shared experts served by the fused MoE's two launches on CUDA (moe.fused_shared_count)
FUSE_SHARED_EXPERTS = True
# SigmoidRouter on a decode-sized step: fp32 logits (x read in its dtype, no cast launch) and the routing in one
# Triton launch (kernels.triton.moe_routing.router_route)
ROUTER_GEMV = True
# MLA latent norm + both ropes + latent cache append as one Triton launch (kernels.triton.mla_prologue)
FUSED_MLA_PROLOGUE = True


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    return apply_rope_interleaved(x, cos, sin) if interleaved else kernels.rotary_neox(x, cos, sin)


mla_expanded_attention = mla_prefill.expanded_attention  # flash-eligible on CUDA (values padded), else the reference
# prompt chunks over a cached context call mla_expanded_attention(..., None, context_len=ctx): lower-right causal
# through the flash kernel instead of a [Q, S] boolean mask
MLA_PREFILL_CONTEXT = True
mla_absorbed_attention = mla.mla_absorbed_attention
# DSA decode over the indexer's selected latent rows (flat slots [B, k]): the Triton sparse kernel on CUDA
mla_sparse_absorbed_attention = mla_decode.sparse_absorbed_decode


def indexer_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, limits: torch.Tensor | None = None) -> torch.Tensor:
    """``mla.indexer_scores``' contract: the Triton kernel on CUDA (``kernels.indexer_scores``: no [..., Q, Hi, S]
    logits; the scales are folded into ``w``, so ``scale=1``), ``mla.indexer_scores`` itself elsewhere."""
    if indexer_kernel.usable(q, k):
        return indexer_kernel.indexer_scores(q, k, w, 1.0, limits)
    return mla.indexer_scores(q, k, w, limits)


def indexer_scores_paged(q: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor, num_keys: int,
                         w: torch.Tensor, limits: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`indexer_scores` over a paged key cache [N, page, Di] (the first ``num_keys`` keys of each row's
    blocks): the Triton kernel reads the cache in place on CUDA (same scores as over the gathered keys), elsewhere
    the keys are gathered and :func:`indexer_scores` runs."""
    if indexer_kernel.paged_usable(q, k_cache):
        return indexer_kernel.indexer_scores_paged(q, k_cache, block_tables, num_keys, w, 1.0, limits)
    return indexer_scores(q, gather_kv(k_cache, block_tables, num_keys), w, limits)


route = moe.route_fused  # one Triton launch on CUDA, the reference elsewhere
grouped_expert_mlp = moe.fused_expert_mlp  # fused Triton MoE on CUDA, the grouped reference elsewhere
