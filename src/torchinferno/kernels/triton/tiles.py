"""Tile scheduling shared by the GEMM-class Triton kernels (dense, grouped MoE, FP8 block): ``@triton.jit`` helpers
inlined into their callers, so sharing them changes no kernel's arithmetic.

* :func:`grouped_tile` — a 1-D program id -> its (row tile, column tile) in the grouped order: ``GROUP_M`` row tiles
  walk the column tiles together, so a weight tile is still in L2 when the next row tile needs it.
* :func:`moe_tile` — a fused-MoE GEMM program's tile: its expert (-1: nothing to do) and column offsets.
* :func:`moe_tile_rows` — the rows of one sorted MoE row tile (``kernels.fused_moe.align_pairs``' layout).
* :func:`sum_terms` — the launch that finishes a GEMM whose fp32 output came in terms: ``out[t] = sum_j y[t, j]
  (+ bias)`` in term order, rounded once (the MoE's top-k rows of a token; a split-K GEMM's shares).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def grouped_tile(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """-> (first_m, pid_m, pid_n) of program ``pid`` over ``num_m`` x ``num_n`` tiles. Invariant: every program
    with ``first_m < num_m`` gets a distinct (pid_m < num_m, pid_n < num_n), and ``num_m * num_n`` programs cover
    every tile. ``first_m >= num_m`` (a static grid sized for more rows than a step uses) means no tile: the
    caller returns; pid_m / pid_n are then meaningless (the group size is floored at 1 so nothing divides by 0)."""
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    group_size = tl.maximum(tl.minimum(num_m - first_m, GROUP_M), 1)
    pid_m = first_m + (pid % in_group) % group_size
    pid_n = (pid % in_group) // group_size
    return first_m, pid_m, pid_n


@triton.jit
def moe_tile(pid, num_padded, block_expert, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program ``pid`` of a fused-MoE GEMM (grid: the static bound of row tiles x column tiles, grouped order over
    the row tiles actually used, ``num_padded``) -> (e, pid_m, rn [BN], ok_n [BN]). ``e`` is the row tile's expert,
    -1 when the program has no tile (past the used length) or the tile is padding: the caller returns then, before
    reading any row or weight."""
    num_m = tl.cdiv(tl.load(num_padded), BLOCK_M)
    first_m, pid_m, pid_n = grouped_tile(pid, num_m, tl.cdiv(N, BLOCK_N), GROUP_M)
    e = tl.load(block_expert + pid_m, mask=first_m < num_m, other=-1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return e, pid_m, rn, rn < N


@triton.jit
def moe_tile_rows(sorted_pairs, pid_m, num_pairs, row_div, BLOCK_M: tl.constexpr):
    """Row tile ``pid_m`` of the expert-sorted pairs -> (pair [BM] ids, ok_m [BM]: a real pair, not padding
    (``num_pairs`` marks padding), row [BM] int64: the A row, ``pair // row_div``: the token for gate_up
    (``row_div`` = top_k), the pair itself for down (1); 0 for padding, so loads stay in bounds)."""
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_pairs + rm)
    ok_m = pair < num_pairs
    row = tl.where(ok_m, pair // row_div, 0).to(tl.int64)
    return pair, ok_m, row


@triton.jit
def _sum_terms_kernel(Y, OUT, BIAS, D, terms, stride_row, stride_term, stride_out, HAS_BIAS: tl.constexpr,
                      BLOCK: tl.constexpr):
    # grid (rows, cdiv(D, BLOCK)): OUT[t] = sum_j Y[t * stride_row + j * stride_term] (fp32, j ascending) + bias
    t = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = rn < D
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in range(0, terms):
        acc += tl.load(Y + t * stride_row + j * stride_term + rn, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(BIAS + rn, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + t * stride_out + rn, acc.to(OUT.dtype.element_ty), mask=ok)


def sum_terms(y: torch.Tensor, out: torch.Tensor, terms: int, stride_row: int, stride_term: int,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """``out [R, D]`` (any float dtype, unit stride in D) <- the sum of ``terms`` fp32 rows of ``y`` per output
    row: row ``t``'s term ``j`` starts at element ``t * stride_row + j * stride_term`` of ``y`` (contiguous over D),
    summed in ``j`` order, plus ``bias [D]``, rounded once. Deterministic (no atomics)."""
    R, D = out.shape
    assert y.dtype == torch.float32 and out.stride(1) == 1
    if R and D:
        blk = min(1024, triton.next_power_of_2(D))
        _sum_terms_kernel[(R, triton.cdiv(D, blk))](y, out, out if bias is None else bias, D, terms, stride_row,
                                                    stride_term, out.stride(0), HAS_BIAS=bias is not None,
                                                    BLOCK=blk, num_warps=4)
    return out
