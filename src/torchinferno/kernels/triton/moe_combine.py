"""The MoE's combine over expert-sorted per-pair rows: ``out[t] = sum_j w[t, j] * y[rank[t, j]] (+ extra[t])``.

``kernels.grouped_mm_moe`` computes the experts' rows in expert order; this launch reads each token's ``k`` rows
back by their rank in that order, weights them and sums them in slot order in fp32, adds an optional per-token row
(the shared experts' output) and rounds once. Deterministic (no atomics). Reference: the torch branch of
``kernels.grouped_mm_moe.combine`` (tests/kernels/test_grouped_mm_moe.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _weighted_gather_sum_kernel(Y, RANK, W, EXTRA, OUT, D, K, stride_y, stride_e, stride_o, HAS_EXTRA: tl.constexpr,
                                BLOCK: tl.constexpr):
    # grid (T, cdiv(D, BLOCK)): OUT[t, cols] = sum_j W[t, j] * Y[RANK[t, j], cols] (+ EXTRA[t, cols]), fp32
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < D
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in range(0, K):
        r = tl.load(RANK + t * K + j).to(tl.int64)
        w = tl.load(W + t * K + j)
        acc += w * tl.load(Y + r * stride_y + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_EXTRA:
        acc += tl.load(EXTRA + t * stride_e + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + t * stride_o + cols, acc.to(OUT.dtype.element_ty), mask=ok)


def weighted_gather_sum(y: torch.Tensor, rank: torch.Tensor, weights: torch.Tensor, out: torch.Tensor,
                        extra: torch.Tensor | None = None) -> torch.Tensor:
    """y [P, D] (unit stride in D), rank [T, k] int (rows of y, contiguous), weights [T, k] fp32 (contiguous),
    out [T, D], extra [T, D] or None -> out (written in place and returned)."""
    T, k = rank.shape
    D = out.shape[1]
    assert y.stride(1) == 1 and out.stride(1) == 1 and rank.is_contiguous() and weights.is_contiguous()
    assert weights.dtype == torch.float32 and weights.shape == (T, k) and y.shape[1] == D
    if extra is not None:
        assert extra.shape == (T, D) and extra.stride(1) == 1
    if T and D:
        blk = min(1024, triton.next_power_of_2(D))
        _weighted_gather_sum_kernel[(T, triton.cdiv(D, blk))](
            y, rank, weights, out if extra is None else extra, out, D, k, y.stride(0),
            0 if extra is None else extra.stride(0), out.stride(0), HAS_EXTRA=extra is not None, BLOCK=blk,
            num_warps=4)
    return out
