"""Reference ops of the dsv4 family: plain torch, readable, the oracle for every variant.

An ops module is passed to the model at construction (``DSv4ForCausalLM(config, ops=...)``);
every ops module of this family exposes these names with these contracts. Latent attention and
MoE compute come from ``models/common/{mla,moe}.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torchinferno.models.common import mla, moe
from torchinferno.models.common.rope import apply_rope_interleaved, apply_rope_neox

NAME = "raw"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, D] -> [T, D]; normalizes in fp32 and casts back before the weight."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """(x + residual) -> (rms_norm(sum), sum). ``residual=None`` means the sum is ``x`` itself."""
    h = x if residual is None else x + residual
    return rms_norm(h, weight, eps), h


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] (gate first) -> silu(gate) * up [T, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x [T, H, r], cos/sin [T, r/2] -> rotated (adjacent pairs if ``interleaved``, else halves)."""
    return apply_rope_interleaved(x, cos, sin) if interleaved else apply_rope_neox(x, cos, sin)


# [Q, H, dn], [Q, H, r], latent [S, R + r], kv_b [H*(dn+dv), R], scale, mask [Q, S] | None -> [Q, H, dv]
latent_expanded_attention = mla.mla_expanded_attention
# [B, H, dn], [B, H, r], latent [B, L, R + r], kv_b, scale, mask [B, L] | None -> [B, H, dv]
latent_absorbed_attention = mla.mla_absorbed_attention
# router logits [T, E] fp32, bias [E], top_k, n_group, topk_group, norm, scale -> (weights, ids) [T, k]
route = moe.route_sigmoid_grouped
# x [T, D], ids [T, k], weights [T, k], gate_up [E, 2I, D], down [E, D, I], act -> [T, D]
grouped_expert_mlp = moe.grouped_expert_mlp
