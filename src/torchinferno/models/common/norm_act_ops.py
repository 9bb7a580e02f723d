"""Norm and activation ops shared by every family's ops modules (one implementation, many folders).

Four flavours with one contract each:
``rms_norm(x [T, D], weight [D], eps) -> [T, D]``;
``add_rms_norm(x, residual | None, weight, eps) -> (rms_norm(x + residual), x + residual)``;
``silu_and_mul(gate_up [T, 2I]) -> [T, I]`` (gate first).

* ``Raw``: readable reference (fp32 normalization, cast back before the weight, as HF does);
* ``Fused``: routed to ``torchinferno.kernels`` (Triton on CUDA, fused torch on CPU);
* ``TorchRewrite``: ``kernels.reference`` oracles (fp32 math), the runtime form of torch-rewrite candidates;
* ``CustomOp``: ``torch.ops.torchinferno.*`` (``kernels/custom_ops.py``), the runtime form of custom-op
  candidates; importing that module registers the ops, so it is only imported when used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Dispatch-only module (imports no Triton); bound once because Fused is on the per-layer hot path.
from torchinferno import kernels


class Raw:
    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * xf.to(x.dtype)

    @staticmethod
    def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
        h = x if residual is None else x + residual
        return Raw.rms_norm(h, weight, eps), h

    @staticmethod
    def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class Fused:
    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return kernels.rms_norm(x, weight, eps)

    @staticmethod
    def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
        if residual is None:
            return kernels.rms_norm(x, weight, eps), x
        return kernels.add_rms_norm(x, residual, weight, eps)

    @staticmethod
    def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
        return kernels.swiglu_activation(gate_up)


class TorchRewrite:
    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        from torchinferno.kernels.reference import ref_rms_norm

        return ref_rms_norm(x, weight, eps)

    @staticmethod
    def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
        from torchinferno.kernels.reference import ref_add_rms_norm, ref_rms_norm

        if residual is None:
            return ref_rms_norm(x, weight, eps), x
        return ref_add_rms_norm(x, residual, weight, eps)

    @staticmethod
    def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
        from torchinferno.kernels.reference import ref_swiglu

        return ref_swiglu(gate_up)


class CustomOp:
    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        from torchinferno.kernels import custom_ops  # noqa: F401  (registers torch.ops.torchinferno.*)

        return torch.ops.torchinferno.rms_norm(x, weight, eps)

    @staticmethod
    def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
        h = x if residual is None else x + residual
        return CustomOp.rms_norm(h, weight, eps), h

    @staticmethod
    def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
        from torchinferno.kernels import custom_ops  # noqa: F401

        return torch.ops.torchinferno.swiglu_activation(gate_up)
