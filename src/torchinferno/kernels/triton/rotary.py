"""Neox-style rotary embedding (rotate halves) for ``x [T, H, D]`` with ``cos/sin [T, D/2]``.

Reads strided views directly (q/k are column slices of the fused qkv projection), writes a
contiguous ``[T, H, D]`` result. fp32 math like ``kernels.reference.ref_rotary_neox``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.triton import next_pow2


@triton.jit
def _rotary_neox_kernel(X, COS, SIN, OUT, stride_xt, stride_xh, stride_ct, stride_st, stride_ot, stride_oh,
                        H, HALF, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_HALF)
    hm = heads < H
    cm = cols < HALF
    m = hm[:, None] & cm[None, :]
    c = tl.load(COS + t * stride_ct + cols, mask=cm, other=0.0).to(tl.float32)[None, :]
    s = tl.load(SIN + t * stride_st + cols, mask=cm, other=0.0).to(tl.float32)[None, :]
    base = X + t * stride_xt + heads[:, None] * stride_xh + cols[None, :]
    x1 = tl.load(base, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF, mask=m, other=0.0).to(tl.float32)
    obase = OUT + t * stride_ot + heads[:, None] * stride_oh + cols[None, :]
    tl.store(obase, (x1 * c - x2 * s).to(OUT.dtype.element_ty), mask=m)
    tl.store(obase + HALF, (x2 * c + x1 * s).to(OUT.dtype.element_ty), mask=m)


def rotary_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] (last dim contiguous), cos/sin [T, D/2] -> rotated [T, H, D] in x.dtype."""
    T, H, D = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    if cos.stride(-1) != 1:
        cos = cos.contiguous()
    if sin.stride(-1) != 1:
        sin = sin.contiguous()
    half = D // 2
    out = torch.empty((T, H, D), dtype=x.dtype, device=x.device)
    bh = min(next_pow2(H), 16)
    if T:
        _rotary_neox_kernel[(T, triton.cdiv(H, bh))](
            x, cos, sin, out, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0), out.stride(0), out.stride(1),
            H, half, BLOCK_H=bh, BLOCK_HALF=next_pow2(half), num_warps=4)
    return out
