"""RMSNorm and fused residual-add + RMSNorm: one program per row, fp32 math.

Semantics match ``kernels.api`` (and ``kernels.reference``): ``y = w * x * rsqrt(mean(x^2) + eps)``
computed in fp32 and cast once; the fused form first rounds ``h = x + residual`` to the input
dtype (what the torch path's ``x + residual`` does), returns it, and normalizes the rounded sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.triton import next_pow2


@triton.jit
def _rms_norm_kernel(X, R, W, Y, H, stride_x, stride_r, stride_y, stride_h, D, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0)
        h = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(H + row * stride_h + cols, h, mask=mask)
        xf = h.to(tl.float32)
    else:
        xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / D
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (xf * rstd * w).to(Y.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _launch(x, residual, weight, eps):
    D = x.shape[-1]
    x2 = _rows(x)
    n = x2.shape[0]
    y = torch.empty((n, D), dtype=x.dtype, device=x.device)
    block = next_pow2(D)
    warps = 4 if block <= 1024 else (8 if block <= 4096 else 16)
    if residual is None:
        if n:
            _rms_norm_kernel[(n,)](x2, x2, weight, y, y, x2.stride(0), 0, y.stride(0), 0, D, eps,
                                   HAS_RESIDUAL=False, BLOCK_D=block, num_warps=warps)
        return y.view(x.shape), None
    r2 = _rows(residual)
    h = torch.empty_like(y)
    if n:
        _rms_norm_kernel[(n,)](x2, r2, weight, y, h, x2.stride(0), r2.stride(0), y.stride(0), h.stride(0), D, eps,
                               HAS_RESIDUAL=True, BLOCK_D=block, num_warps=warps)
    return y.view(x.shape), h.view(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] -> [..., D] in x.dtype."""
    return _launch(x, None, weight, eps)[0]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """(rms_norm(x + residual), x + residual), one read of each input and one write of each output."""
    return _launch(x, residual, weight, eps)
