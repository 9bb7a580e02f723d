"""Ops of promoted ``custom-op`` variants of this family (``workbench/promotion.py`` names this module).

The runtime form of a ``custom-op`` candidate for the ``fused-rmsnorm-swiglu`` / ``swiglu``
partitions: RMSNorm (with its residual add) and the SwiGLU activation are routed to the
``torch.ops.torchinferno`` custom ops (``kernels/custom_ops.py``; a registered CUDA kernel is used
without changing this module). The residual add + norm + gate/up GEMM fusion of the graph rewrite
spans two modules, so at runtime it stays as norm op -> Linear -> activation op. Every other op is
``fused_ops`` (the v1 ops). Imported only when a promoted variant names it.
"""

from __future__ import annotations

import torch

from torchinferno.kernels import custom_ops as _custom_ops  # noqa: F401  (registers torch.ops.torchinferno.*)
from torchinferno.models.llama3.fused_ops import *  # noqa: F401,F403  (the rest of the contract)

NAME = "custom-op"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.ops.torchinferno.rms_norm(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    h = x if residual is None else x + residual
    return torch.ops.torchinferno.rms_norm(h, weight, eps), h


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    return torch.ops.torchinferno.swiglu_activation(gate_up)
