"""Ops of promoted ``torch-rewrite`` variants of this family (``workbench/promotion.py`` names this module).

The runtime form of a ``torch-rewrite`` candidate: the partition's sites (RMSNorm with its
residual add, SwiGLU) as plain torch reference code (``kernels/reference.py``, fp32 math), no
custom op and no compiler. Every other op is ``fused_ops`` (the v1 ops).
"""

from __future__ import annotations

import torch

from torchinferno.kernels.reference import ref_add_rms_norm, ref_rms_norm, ref_swiglu
from torchinferno.models.deepseek_v32.fused_ops import *  # noqa: F401,F403  (the rest of the contract)

NAME = "torch-rewrite"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return ref_rms_norm(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    if residual is None:
        return ref_rms_norm(x, weight, eps), x
    return ref_add_rms_norm(x, residual, weight, eps)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    return ref_swiglu(gate_up)
