"""Reference ops of the llama3 family: plain torch, written for readability and as the oracle.

An ops module is passed to the model at construction (``Llama3ForCausalLM(config, ops=...)``).
Every ops module of this family exposes the same five functions with the same contracts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torchinferno.models.common.rope import apply_rope_neox

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


def prepare_rope(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype):
    """Once per forward: the cos/sin [T, D/2] tables each layer uses (the reference keeps fp32)."""
    return cos, sin


def rope(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """qk [T, H + Hkv, D] (queries and keys side by side), cos/sin [T, D/2] -> rotated (neox layout)."""
    return apply_rope_neox(qk, cos, sin)
