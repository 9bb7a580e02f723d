"""Batch-1 linear (GEMV) in Triton: ``y [1, N] = x [1, K] @ W[N, K]^T``, streaming W once.

An experiment for the batch-1 decode bound: every decode step reads all weights once, so the
step time is the GEMVs' bandwidth. ``TritonGemvLinear`` wraps an ``nn.Linear`` and uses the
kernel when the input has one row on CUDA (static per CUDA-graph bucket), cuBLAS otherwise.
``swap_linear_for_gemv(model)`` swaps modules in place and returns a function that undoes it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _gemv_kernel(X, W, B, Y, N, K, stride_wn, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < N
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    w_rows = W + n.to(tl.int64)[:, None] * stride_wn
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        km = k < K
        x = tl.load(X + k, mask=km, other=0.0).to(tl.float32)
        w = tl.load(w_rows + k[None, :], mask=nm[:, None] & km[None, :], other=0.0, eviction_policy="evict_first")
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, 1)
    if HAS_BIAS:
        y += tl.load(B + n, mask=nm, other=0.0).to(tl.float32)
    tl.store(Y + n, y.to(Y.dtype.element_ty), mask=nm)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, block_n: int = 8,
         block_k: int = 512, num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """x [1, K] (or [K]) @ weight [N, K]^T (+ bias) -> [1, N] in x.dtype; fp32 accumulation."""
    N, K = weight.shape
    xf = x.reshape(-1)
    assert xf.numel() == K and weight.stride(1) == 1
    y = torch.empty((1, N), dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(N, block_n),)](xf, weight, bias if bias is not None else weight, y, N, K, weight.stride(0),
                                             HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k,
                                             num_warps=num_warps, num_stages=num_stages)
    return y


class TritonGemvLinear(nn.Module):
    """``nn.Linear`` whose one-row CUDA inputs go through :func:`gemv` (same parameters, shared)."""

    def __init__(self, linear: nn.Linear, config: dict | None = None):
        super().__init__()
        self.inner = linear
        self.config = config or {}

    @property
    def weight(self) -> torch.Tensor:  # callers that read ``.weight`` (e.g. the logits projection) keep working
        return self.inner.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.inner.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and x.dim() == 2 and x.shape[0] == 1:
            return gemv(x, self.inner.weight, self.inner.bias, **self.config)
        return self.inner(x)


def swap_linear_for_gemv(model: nn.Module, config_for=None):
    """Wrap ``nn.Linear`` modules of ``model`` in :class:`TritonGemvLinear`; returns an undo function.

    ``config_for(linear) -> dict | None`` picks the launch config per module (``None`` keeps cuBLAS);
    a plain dict applies to every module; ``None`` wraps all with the default config.
    """
    pick = config_for if callable(config_for) else (lambda lin: dict(config_for or {}))
    swapped = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                cfg = pick(child)
                if cfg is None:
                    continue
                setattr(parent, name, TritonGemvLinear(child, cfg))
                swapped.append((parent, name, child))

    def undo():
        for parent, name, child in swapped:
            setattr(parent, name, child)

    return undo
