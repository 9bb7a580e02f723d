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


def prepare_rope(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype):
    # Cast once per forward instead of once per layer.
    return cos.to(dtype), sin.to(dtype)


def rope(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return kernels.rotary_neox(qk, cos, sin)
