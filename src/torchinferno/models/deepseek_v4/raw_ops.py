"""Reference ops of the deepseek-v4 family: plain torch, written for readability and as the oracle.

Contracts: ``rms_norm`` / ``add_rms_norm`` / ``silu_and_mul`` as ``models/common/norm_act_ops.py``;
``clamped_experts(x [T, D], ids [T, k], weights [T, k], gate_up [E, 2I, D], down [E, D, I], limit) -> [T, D]``:
routed experts with SwiGLU on ``gate.clamp(max=limit)`` and ``up.clamp(-limit, limit)``, weighted and summed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torchinferno.models.common.norm_act_ops import Raw

rms_norm = Raw.rms_norm
add_rms_norm = Raw.add_rms_norm
silu_and_mul = Raw.silu_and_mul

NAME = "raw"


def clamped_experts(x, ids, weights, gate_up, down, limit: float) -> torch.Tensor:
    out = torch.zeros_like(x)
    for e in torch.unique(ids).tolist():
        tok, slot = torch.where(ids == e)
        g, u = F.linear(x[tok], gate_up[e]).chunk(2, dim=-1)
        y = F.silu(g.clamp(max=limit)) * u.clamp(min=-limit, max=limit)
        out.index_add_(0, tok, (F.linear(y, down[e]) * weights[tok, slot, None]).to(out.dtype))
    return out
