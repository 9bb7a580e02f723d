"""Tile scheduling shared by the GEMM-class Triton kernels (dense, grouped MoE, FP8 block): ``@triton.jit`` helpers
inlined into their callers, so sharing them changes no kernel's arithmetic.

* :func:`grouped_tile` — a 1-D program id -> its (row tile, column tile) in the grouped order: ``GROUP_M`` row tiles
  walk the column tiles together, so a weight tile is still in L2 when the next row tile needs it.
* :func:`moe_tile_rows` — the rows of one sorted MoE row tile (``kernels.fused_moe.align_pairs``' layout).
"""

from __future__ import annotations

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
def moe_tile_rows(sorted_pairs, pid_m, num_pairs, row_div, BLOCK_M: tl.constexpr):
    """Row tile ``pid_m`` of the expert-sorted pairs -> (pair [BM] ids, ok_m [BM]: a real pair, not padding
    (``num_pairs`` marks padding), row [BM] int64: the A row, ``pair // row_div``: the token for gate_up
    (``row_div`` = top_k), the pair itself for down (1); 0 for padding, so loads stay in bounds)."""
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_pairs + rm)
    ok_m = pair < num_pairs
    row = tl.where(ok_m, pair // row_div, 0).to(tl.int64)
    return pair, ok_m, row
