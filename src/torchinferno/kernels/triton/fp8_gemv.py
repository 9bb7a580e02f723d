"""Skinny FP8 W8A8 linear in Triton: ``y [M, N] = s_x * s_w * (x_q [M, K] @ W_q [N, K]^T)`` for M <= 16.

Decode at low concurrency is a weight stream: rowwise-scaled ``torch._scaled_mm`` picks tiles made
for large M and reads the FP8 weight at 1.2-2.4 TB/s on H200 at M = 1-16 (runs 9-12), slower than
the bf16 GEMV reading twice the bytes. This kernel streams ``W_q`` once for all rows through FP8
tensor cores (``tl.dot`` of e4m3 tiles, rows padded to the 16-row MMA tile, fp32 accumulation; E4M3
products are exact), so it computes the torch reference's sum
(``kernels.fp8_linear.fp8_linear_reference``) in another order. An earlier CUDA-core form (fp32 FMAs
over upcast tiles) was slower at every shape and M (run 12: e.g. gate_up 44 vs 32 us at M = 1, 103 vs
32 us at M = 4) and was removed. Inputs are quantized by the same per-token rule
(``kernels.triton.fp8_quant``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 16  # the MMA's row tile: inputs of up to 16 rows share one pass over the weight


@triton.jit(do_not_specialize=["M"])  # M = tokens in the step: no recompile per step shape
def _fp8_skinny_dot_kernel(XQ, XS, W, WS, Y, M, N, K, stride_x, stride_wn, stride_y, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # The same sum on FP8 tensor cores: x_q [M (padded to 16), BK] @ W_q^T [BK, BN] tiles into fp32.
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    x_ptrs = XQ + rm[:, None] * stride_x + rk[None, :]  # [BM, BK]
    w_ptrs = W + rn.to(tl.int64)[None, :] * stride_wn + rk[:, None]  # [BK, BN]: W^T, K-major as FP8 MMAs need
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = k0 + rk < K
        x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0, eviction_policy="evict_first")
        acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    xs = tl.load(XS + rm, mask=m_ok, other=0.0)
    ws = tl.load(WS + rn, mask=n_ok, other=0.0)
    y = acc * xs[:, None] * ws[None, :]
    tl.store(Y + rm[:, None] * stride_y + rn[None, :], y.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def fp8_skinny_dot(xq: torch.Tensor, xs: torch.Tensor, weight_fp8: torch.Tensor, weight_scale: torch.Tensor,
                   out_dtype: torch.dtype, block_n: int = 32, block_k: int = 512, num_warps: int = 4,
                   num_stages: int = 3) -> torch.Tensor:
    """xq [M, K] e4m3 with xs [M, 1] fp32, weight_fp8 [N, K] with weight_scale [N] fp32 -> [M, N] out_dtype,
    M <= 16. Default tiles: the best or within 4% of the best of a 7-config sweep on every Llama-3-8B shape
    at M = 1, 4 and 16 (run 12)."""
    M, K = xq.shape
    N = weight_fp8.shape[0]
    assert M <= MAX_ROWS and weight_fp8.stride(1) == 1 and xq.stride(1) == 1
    y = torch.empty((M, N), dtype=out_dtype, device=xq.device)
    _fp8_skinny_dot_kernel[(triton.cdiv(N, block_n),)](xq, xs, weight_fp8, weight_scale, y, M, N, K, xq.stride(0),
                                                        weight_fp8.stride(0), y.stride(0), BLOCK_M=16, BLOCK_N=block_n,
                                                        BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages)
    return y
