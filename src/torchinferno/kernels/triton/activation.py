"""SwiGLU activation: ``silu(gate) * up`` over ``gate_up [..., 2I]`` (gate first), fp32 math."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _swiglu_kernel(GU, OUT, stride_gu, stride_out, I, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    g = tl.load(GU + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + row * stride_gu + I + cols, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(OUT + row * stride_out + cols, y.to(OUT.dtype.element_ty), mask=mask)


def swiglu_activation(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2I] -> [..., I]."""
    two_i = gate_up.shape[-1]
    inter = two_i // 2
    x = gate_up.reshape(-1, two_i)
    if x.stride(-1) != 1:
        x = x.contiguous()
    n = x.shape[0]
    out = torch.empty((n, inter), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    if n:
        _swiglu_kernel[(n, triton.cdiv(inter, block))](x, out, x.stride(0), out.stride(0), inter, BLOCK=block, num_warps=4)
    return out.view(*gate_up.shape[:-1], inter)
