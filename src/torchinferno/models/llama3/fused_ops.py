"""Same contract as ``raw_ops`` routed to ``torchinferno.kernels`` (Triton on CUDA, fused torch on CPU)."""

from __future__ import annotations

import torch

from torchinferno import kernels
from torchinferno.kernels import api
from torchinferno.models.common.norm_act_ops import Fused

rms_norm = Fused.rms_norm
add_rms_norm = Fused.add_rms_norm
silu_and_mul = Fused.silu_and_mul

NAME = "fused"


def prepare_rope(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype):
    # Once per forward instead of once per layer (cast for Triton, full-width tables for torch).
    return api.rotary_tables_neox(cos, sin, dtype)


def rope(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return kernels.rotary_neox(qk, cos, sin)
