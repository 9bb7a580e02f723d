"""Per-head decode GEMVs: MLA's two absorption products at batch 1, one launch each, chained by PDL.

Absorbed MLA decode multiplies every head's query by that head's slice of ``kv_b_proj`` before the attention
(``q_lat[h] = q_nope[h] @ W_UK[h]``, ``W_UK[h]`` ``[dn, R]``) and its latent output by another slice after it
(``o[h] = o_lat[h] @ W_UV[h]^T``, ``W_UV[h]`` ``[dv, R]``). At one token these are batched GEMMs with one row per
head: cuBLAS runs them at a few microseconds each, far from the 2 MB they read (V2-Lite-like: 16 heads x 128 x
512 bf16). Here both are one kernel over strided weights: ``y[h, n] = sum_k W[h, n, k] x[h, k]``, grid
``(H, cdiv(N, BLOCK_N))``, a ``[BLOCK_N, BLOCK_K]`` tile of ``W[h]`` per step; the strides say which product it is
(``W_UK`` reads ``n`` contiguous, ``W_UV`` reads ``k`` contiguous; Triton specializes a stride of 1 so either way
the loads are vectorized along the contiguous axis).

PDL as in ``kernels.triton.decode_gemv``: with ``pdl=True`` a program loads its first weight tile (nothing earlier
writes weights), then waits for the previous kernel before reading ``x``; nothing is written before the wait.
fp32 accumulation, one rounding to ``y``'s dtype (the bmm's). Reference: ``torch.bmm`` of the same slices
(tests/kernels/test_head_gemv.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.triton.decode_gemv import _wait_for_previous_kernel

# [BLOCK_N, BLOCK_K] = 8192 elements: 16 KB of bf16 weights a program. Callers pick tiles per product (the deepseek
# step's ``absorb_q`` / ``absorb_o``: 128 programs each at 16 heads).
DEFAULT_CONFIG = {"block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 2, "early_launch": True}


@triton.jit
def _head_gemv_kernel(X, W, Y, N, K, stride_xh, stride_wh, stride_wn, stride_wk, stride_yh,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr, EARLY_LAUNCH: tl.constexpr):
    h = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    ok_n = rn < N
    w_ptrs = W + h * stride_wh + rn.to(tl.int64)[:, None] * stride_wn + rk[None, :] * stride_wk  # [BN, BK]
    w = tl.load(w_ptrs, mask=ok_n[:, None] & (rk < K)[None, :], other=0.0)  # the first tile: before the wait
    _wait_for_previous_kernel(PDL, EARLY_LAUNCH)
    x = tl.load(X + h * stride_xh + rk, mask=rk < K, other=0.0).to(tl.float32)
    acc = w.to(tl.float32) * x[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        kk = k0 + rk
        ok_k = kk < K
        w = tl.load(w_ptrs + k0 * stride_wk, mask=ok_n[:, None] & ok_k[None, :], other=0.0)
        x = tl.load(X + h * stride_xh + kk, mask=ok_k, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
    tl.store(Y + h * stride_yh + rn, tl.sum(acc, 1).to(Y.dtype.element_ty), mask=ok_n)


def head_gemv(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, *, pdl: bool = False,
              config: dict | None = None) -> torch.Tensor:
    """``x [H, K]`` (rows contiguous), ``w [H, N, K]`` (any strides), ``y [H, N]`` (rows contiguous) ->
    ``y[h] = w[h] @ x[h]`` in ``y``'s dtype, written in place and returned. ``config``: ``block_n``, ``block_k``,
    ``num_warps``, ``num_stages``, ``early_launch`` (merged over ``DEFAULT_CONFIG``)."""
    H, N, K = w.shape
    assert x.shape == (H, K) and y.shape == (H, N) and x.stride(1) == 1 and y.stride(1) == 1, (x.shape, w.shape)
    cfg = {**DEFAULT_CONFIG, **(config or {})}
    extra = {"launch_pdl": True} if pdl else {}
    _head_gemv_kernel[(H, triton.cdiv(N, cfg["block_n"]))](
        x, w, y, N, K, x.stride(0), w.stride(0), w.stride(1), w.stride(2), y.stride(0),
        BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], PDL=pdl, EARLY_LAUNCH=bool(cfg["early_launch"]),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **extra)
    return y
