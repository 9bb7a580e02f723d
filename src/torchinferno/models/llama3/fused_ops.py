"""Same contract as ``raw_ops`` routed to ``torchinferno.kernels`` (Triton on CUDA, fused torch on CPU)."""

from __future__ import annotations

import torch

from torchinferno import kernels

NAME = "fused"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return kernels.rms_norm(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    if residual is None:
        return kernels.rms_norm(x, weight, eps), x
    return kernels.add_rms_norm(x, residual, weight, eps)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    return kernels.swiglu_activation(gate_up)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    return kernels.rotary_neox(q, cos, sin), kernels.rotary_neox(k, cos, sin)
