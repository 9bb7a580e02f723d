"""Kernel custom ops in the ``torchinferno`` namespace (``torch.ops.torchinferno.*``), via ``torch.library``.

Each op has a default implementation in plain torch (registered for every backend, i.e.
CompositeExplicitAutograd; it is what CPU runs) whose numerics match ``kernels/reference.py``,
and a fake (meta) implementation so the op traces under ``make_fx`` / FakeTensor / torch.compile
as one opaque node. GPU kernels plug in without touching callers (``register_kernel("cuda")``):
``fused_rmsnorm_swiglu`` has its Triton kernels registered for CUDA below.

Ops (shapes for a flattened batch of ``T`` tokens, hidden ``D``, intermediate ``I``):

* ``rms_norm(x [.., D], weight [D], eps) -> [.., D]`` (fp32 math, result in ``x.dtype``);
* ``swiglu_activation(gate_up [.., 2I]) -> [.., I]`` (``silu(gate) * up``, gate first);
* ``fused_rmsnorm_swiglu(x [T, D], residual [T, D], norm_weight [D], gate_up_weight [2I, D], eps)
  -> (act [T, I], new_residual [T, D])`` where ``new_residual = x + residual`` and
  ``act = swiglu(rms_norm(new_residual) @ gate_up_weight.T)``: the residual add, the post-attention
  norm, the MLP's merged gate/up projection and its activation in one call.

Invariant: outputs never alias inputs (required by ``torch.library.custom_op``). Importing this
module registers the ops once; it is imported only by offline tools and by variants that use it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torchinferno.kernels.reference import ref_rms_norm, ref_swiglu

__all__ = ["rms_norm", "swiglu_activation", "fused_rmsnorm_swiglu", "reference_fused_rmsnorm_swiglu", "OPS"]


@torch.library.custom_op("torchinferno::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return ref_rms_norm(x, weight, eps)  # a fresh tensor (the fp32 product), never a view of x


@rms_norm.register_fake
def _rms_norm_fake(x, weight, eps):
    return torch.empty_like(x)


@torch.library.custom_op("torchinferno::swiglu_activation", mutates_args=())
def swiglu_activation(gate_up: torch.Tensor) -> torch.Tensor:
    return ref_swiglu(gate_up).contiguous()


@swiglu_activation.register_fake
def _swiglu_fake(gate_up):
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


def reference_fused_rmsnorm_swiglu(x, residual, norm_weight, gate_up_weight, eps: float):
    """The torch oracle of ``fused_rmsnorm_swiglu`` built from ``kernels/reference.py`` pieces."""
    h = x + residual
    gate_up = F.linear(ref_rms_norm(h, norm_weight, eps), gate_up_weight)
    return ref_swiglu(gate_up), h


def _fused_torch(x, residual, norm_weight, gate_up_weight, eps: float):
    act, h = reference_fused_rmsnorm_swiglu(x, residual, norm_weight, gate_up_weight, eps)
    return act.contiguous(), h


@torch.library.custom_op("torchinferno::fused_rmsnorm_swiglu", mutates_args=())
def fused_rmsnorm_swiglu(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                         gate_up_weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _fused_torch(x, residual, norm_weight, gate_up_weight, eps)


@fused_rmsnorm_swiglu.register_kernel("cuda")
def _fused_cuda(x, residual, norm_weight, gate_up_weight, eps):
    """Triton on CUDA (``kernels/triton/gemm_swiglu.py``: add+norm kernel, GEMM with a SwiGLU epilogue);
    the torch form when Triton is missing. Triton is imported at the first call, not at registration."""
    from torchinferno.kernels import triton as tk

    if not tk.available():
        return _fused_torch(x, residual, norm_weight, gate_up_weight, eps)
    from torchinferno.kernels.triton.gemm_swiglu import fused_rmsnorm_swiglu as triton_fused

    return triton_fused(x.contiguous(), residual.contiguous(), norm_weight, gate_up_weight.contiguous(), eps,
                        epilogue="auto")


@fused_rmsnorm_swiglu.register_fake
def _fused_fake(x, residual, norm_weight, gate_up_weight, eps):
    torch._check(gate_up_weight.shape[0] % 2 == 0, lambda: "gate_up_weight must have 2*I rows")
    inter = gate_up_weight.shape[0] // 2
    return x.new_empty((*x.shape[:-1], inter)), torch.empty_like(x)


# name -> (op overload used in graphs, torch oracle) for tests and the kernel workbench.
OPS = {
    "rms_norm": (torch.ops.torchinferno.rms_norm.default, ref_rms_norm),
    "swiglu_activation": (torch.ops.torchinferno.swiglu_activation.default, ref_swiglu),
    "fused_rmsnorm_swiglu": (torch.ops.torchinferno.fused_rmsnorm_swiglu.default, reference_fused_rmsnorm_swiglu),
}
