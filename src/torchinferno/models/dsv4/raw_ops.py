"""Reference ops of the dsv4 family: plain torch, readable, the oracle for every variant.

An ops module is passed to the model at construction (``DSv4ForCausalLM(config, ops=...)``);
every ops module of this family exposes these names with these contracts. Latent attention and
MoE compute come from ``models/common/{mla,moe}.py``.
"""

from __future__ import annotations

import torch

from torchinferno.models.common import mla, moe
from torchinferno.models.common.norm_act_ops import Raw
from torchinferno.models.common.rope import apply_rope_interleaved, apply_rope_neox

rms_norm = Raw.rms_norm
add_rms_norm = Raw.add_rms_norm
silu_and_mul = Raw.silu_and_mul

NAME = "raw"


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
