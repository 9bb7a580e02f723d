"""Per-token FP8 quantization: ``x [M, K]`` -> ``(q [M, K] e4m3, scale [M, 1] fp32)`` in one launch.

Torch reference: ``kernels.fp8_linear.quantize_fp8_rows`` (same rule, bitwise: exact fp32 amax,
the scale as an fp32 product, IEEE division ``div_rn``, round-to-nearest-even saturating cast).
One program per row; a row of up to 16384 values stays in registers, a longer one is read twice
(amax, then scale and store, the second pass from L2). The torch form costs three to four
kernels per linear.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.fp8_rule import E4M3_MAX, EPS, INV_E4M3_MAX


@triton.jit
def _quant_rows_kernel(X, Q, S, stride_x, stride_q, K, QMAX: tl.constexpr, INV_QMAX: tl.constexpr,
                       FLOOR: tl.constexpr, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    q_row = Q + row * stride_q
    cols = tl.arange(0, BLOCK)
    if ONE_PASS:  # the whole row fits one tile: keep it in registers
        x = tl.load(x_row + cols, mask=cols < K, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=0)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            x = tl.load(x_row + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
            acc = tl.maximum(acc, tl.abs(x))
        amax = tl.max(acc, axis=0)
    scale = tl.maximum(amax, FLOOR) * INV_QMAX  # an fp32 product, as the torch rule's
    tl.store(S + row, scale)
    if ONE_PASS:
        q = tl.clamp(tl.math.div_rn(x, scale), -QMAX, QMAX)
        tl.store(q_row + cols, q.to(tl.float8e4nv), mask=cols < K)
    else:
        for k0 in range(0, K, BLOCK):
            x = tl.load(x_row + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
            q = tl.clamp(tl.math.div_rn(x, scale), -QMAX, QMAX)
            tl.store(q_row + k0 + cols, q.to(tl.float8e4nv), mask=k0 + cols < K)


def quantize_fp8_rows_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (last dim contiguous) -> (q [M, K] float8_e4m3fn, scale [M, 1] fp32)."""
    M, K = x.shape
    q = torch.empty((M, K), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((M, 1), dtype=torch.float32, device=x.device)
    if M:
        one_pass = K <= 16384  # a row in registers: at most 32 fp32 per thread (16 warps over 16384)
        block = triton.next_power_of_2(K) if one_pass else 4096
        _quant_rows_kernel[(M,)](x, q, s, x.stride(0), q.stride(0), K, QMAX=E4M3_MAX, INV_QMAX=INV_E4M3_MAX, FLOOR=EPS,
                                 BLOCK=block, ONE_PASS=one_pass,
                                 num_warps=16 if block > 8192 else (8 if block >= 4096 else 4))
    return q, s
