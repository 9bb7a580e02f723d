"""Reference ops of the deepseek-v3.2 family: plain torch, written for readability and as the oracle.

An ops module is passed to the model at construction (``DeepSeekV32ForCausalLM(config, ops=...)``).
Every ops module of this family exposes the same functions with the same contracts; the MLA,
indexer and MoE compute comes from ``models/common/{mla,moe}.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torchinferno.models.common import mla, moe
from torchinferno.models.common.rope import apply_rope_interleaved, apply_rope_neox

NAME = "raw"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, D] -> [T, D]; normalizes in fp32 and casts back before the weight (as HF does)."""
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
    """x [T, H, r], cos/sin [T, r/2] -> rotated; ``interleaved`` rotates adjacent pairs, else halves.

    transformers' interleaved path returns the rotated pairs de-interleaved ([evens | odds]);
    we keep the pairs in place. q and k are permuted alike, so every q.k (and the logits) agree.
    """
    return apply_rope_interleaved(x, cos, sin) if interleaved else apply_rope_neox(x, cos, sin)


mla_expanded_attention = mla.mla_expanded_attention
mla_absorbed_attention = mla.mla_absorbed_attention
indexer_scores = mla.indexer_scores
route = moe.route_sigmoid_grouped
grouped_expert_mlp = moe.grouped_expert_mlp
