"""Small-M FP8 W8A8 linear in Triton: ``y [M, N] = s_x * s_w * (x_q [M, K] @ W_q [N, K]^T)`` for M <= 4.

Decode at low concurrency is a weight stream: rowwise-scaled ``torch._scaled_mm`` picks tiles
made for large M and reads the FP8 weight at 0.9-2.4 TB/s on H200 at M = 1 (runs 9-10), slower than
the bf16 GEMV reading twice the bytes. (At M = 4 it is the other way round: ``Fp8Linear`` sends only
one-row inputs here.) This kernel streams ``W_q`` once for all M rows, multiplying in
fp32 (E4M3 values are exact in fp32) and accumulating in fp32, so it computes the torch
reference's sum (``kernels.fp8_linear.fp8_linear_reference``) in another order. Inputs are
quantized by the same per-token rule (``kernels.triton.fp8_quant``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 4


@triton.jit
def _fp8_gemv_kernel(XQ, XS, W, WS, Y, N, K, stride_x, stride_wn, stride_y, M: tl.constexpr, M_PAD: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < N
    rows = tl.arange(0, M_PAD)
    rm = rows < M
    acc = tl.zeros([M_PAD, BLOCK_N, BLOCK_K], tl.float32)
    w_rows = W + n.to(tl.int64)[:, None] * stride_wn
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        km = k < K
        x = tl.load(XQ + rows[:, None] * stride_x + k[None, :], mask=rm[:, None] & km[None, :], other=0.0)
        w = tl.load(w_rows + k[None, :], mask=nm[:, None] & km[None, :], other=0.0, eviction_policy="evict_first")
        acc += w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :]
    y = tl.sum(acc, 2)  # [M_PAD, BLOCK_N]
    xs = tl.load(XS + rows, mask=rm, other=0.0)
    ws = tl.load(WS + n, mask=nm, other=0.0)
    y = y * xs[:, None] * ws[None, :]
    tl.store(Y + rows[:, None] * stride_y + n[None, :], y.to(Y.dtype.element_ty), mask=rm[:, None] & nm[None, :])


@triton.jit
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
                   out_dtype: torch.dtype, block_n: int = 32, block_k: int = 256, num_warps: int = 4,
                   num_stages: int = 4) -> torch.Tensor:
    """Like :func:`fp8_gemv` for M <= 16 rows, on FP8 tensor cores (``tl.dot`` of e4m3 tiles, fp32 accumulation)."""
    M, K = xq.shape
    N = weight_fp8.shape[0]
    assert M <= 16 and weight_fp8.stride(1) == 1 and xq.stride(1) == 1
    y = torch.empty((M, N), dtype=out_dtype, device=xq.device)
    _fp8_skinny_dot_kernel[(triton.cdiv(N, block_n),)](xq, xs, weight_fp8, weight_scale, y, M, N, K, xq.stride(0),
                                                        weight_fp8.stride(0), y.stride(0), BLOCK_M=16, BLOCK_N=block_n,
                                                        BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages)
    return y


def default_config(n: int, k: int) -> tuple[int, int, int]:
    """(block_n, block_k at M = 1, num_warps) by weight shape, from the run-10 sweep on H200 (M = 1):
    square or long-K weights (o_proj 4096x4096, down_proj 4096x14336) stream best with 1024-wide K
    tiles and 8 warps, wide ones (qkv, gate_up) with 512-wide tiles and 4 warps."""
    return (16, 1024, 8) if n <= k else (16, 512, 4)


def fp8_gemv(xq: torch.Tensor, xs: torch.Tensor, weight_fp8: torch.Tensor, weight_scale: torch.Tensor,
             out_dtype: torch.dtype, block_n: int | None = None, block_k: int | None = None,
             num_warps: int | None = None) -> torch.Tensor:
    """xq [M, K] e4m3 with xs [M, 1] fp32, weight_fp8 [N, K] with weight_scale [N] fp32 -> [M, N] out_dtype.

    Launch parameters left ``None`` come from :func:`default_config`."""
    M, K = xq.shape
    N = weight_fp8.shape[0]
    dn, dk, dw = default_config(N, K)
    block_n, block_k, num_warps = block_n or dn, block_k or dk, num_warps or dw
    assert M <= MAX_ROWS and weight_fp8.stride(1) == 1 and xq.stride(1) == 1
    y = torch.empty((M, N), dtype=out_dtype, device=xq.device)
    m_pad = triton.next_power_of_2(max(M, 1))
    bk = block_k // m_pad  # registers: M_PAD * BLOCK_N * BLOCK_K accumulators per program
    _fp8_gemv_kernel[(triton.cdiv(N, block_n),)](xq, xs, weight_fp8, weight_scale, y, N, K, xq.stride(0),
                                                  weight_fp8.stride(0), y.stride(0), M=M, M_PAD=m_pad,
                                                  BLOCK_N=block_n, BLOCK_K=bk, num_warps=num_warps)
    return y
