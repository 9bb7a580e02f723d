"""nn.Module building blocks shared by every family (the ops module is chosen by the family variant)."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn


class RMSNorm(nn.Module):
    """RMSNorm whose math comes from the variant's ops module; optionally fuses the residual add."""

    def __init__(self, dim: int, eps: float, ops: ModuleType):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Without residual: rms_norm(x). With: (rms_norm(x + residual), x + residual)."""
        if residual is None:
            return self.ops.rms_norm(x, self.weight, self.eps)
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)


class GatedMLP(nn.Module):
    """SwiGLU MLP with a merged gate/up projection: x [T, D] -> down(silu(gate) * up) [T, D]."""

    def __init__(self, hidden: int, inter: int, ops: ModuleType, bias: bool = False):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)
        self.ops = ops

    def forward(self, x):
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))
