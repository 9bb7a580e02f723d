"""Grouped expert GEMMs of a fused MoE on CUDA (the fused_moe design: one launch per GEMM over all experts).

Input layout (from ``kernels.fused_moe.align_pairs``): the ``P = T * top_k`` (token, slot) pairs of a step are
sorted by expert and each expert's run is padded to a multiple of ``BLOCK_M``; ``sorted_pairs [P_max]`` holds pair
ids (``pair = token * top_k + slot``) with the sentinel ``P`` in padding, ``block_expert [P_max / BLOCK_M]`` the
expert of each row block (``-1``: unused block) and ``num_padded [1]`` the padded length actually used. ``P_max``
is a static bound (no host sync), so a program whose row block lies past ``num_padded`` or in an unused block
returns at once; every other program computes one ``[BLOCK_M, BLOCK_N]`` tile of one expert's GEMM.

* :func:`moe_gate_up` — ``act [P, I] = swiglu(x[pair // top_k] @ gate_up[e]^T)`` with the SwiGLU fused (two fp32
  accumulators, gate rows then up rows ``I`` below, as ``gemm_swiglu``); optional V4 clamp
  (``gate <= limit``, ``|up| <= limit``). Rows are stored at their pair id (unsorted), so the next GEMM reads
  them by pair id.
* :func:`moe_down` — ``out [P, D] = w[pair] * (act[pair] @ down[e]^T)`` in fp32, the routing weight fused; the
  caller sums the ``top_k`` rows of each token (:func:`moe_sum`: one launch with the cast; deterministic, no
  atomics). Batch-1 steps take ``kernels.triton.moe_small`` instead (no sort/pad, the sum inside the down kernel).

Shared experts (``HAS_SHARED``): expert ids ``>= E`` (the routed count) read shared expert ``j = id - E`` as a
strided slice of the shared MLP's own weights (``S``: gate_up ``[2 ns I, D]``, gate rows ``[jI, (j+1)I)`` and up rows
``ns I`` below; down ``[D, ns I]``, columns ``[jI, (j+1)I)``), so routed and shared experts share both launches and
no weight is copied.

:func:`align_pairs` is the sort/pad itself in one single-program launch (decode-sized steps; the torch version in
``kernels.fused_moe`` takes larger ones).

Weights keep transformers' layout (``gate_up [E, 2I, D]``, ``down [E, D, I]``, rows contiguous). Tile configs come
from the caller (``kernels.fused_moe.config_for``); launches never call ``torch.cuda`` APIs, so they also run under
Triton's CPU interpreter (tests/kernels/test_fused_moe.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.triton.tiles import moe_tile, moe_tile_rows, sum_terms


@triton.jit
def _moe_gemm_kernel(A, B, C, W, S, sorted_pairs, block_expert, num_padded, N, K, num_pairs, row_div, up_offset,
                     limit, stride_am, stride_be, stride_bn, stride_cm, num_routed, shared_step, stride_sn, shared_up,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                     SWIGLU: tl.constexpr, CLAMP: tl.constexpr, MUL_WEIGHT: tl.constexpr, EVEN_K: tl.constexpr,
                     PRECISION: tl.constexpr, HAS_SHARED: tl.constexpr):
    # grid = (num_m_blocks(static bound) * num_n_blocks,): grouped order, GROUP_M row blocks share a weight tile
    e, pid_m, rn, ok_n = moe_tile(tl.program_id(0), num_padded, block_expert, N, BLOCK_M, BLOCK_N, GROUP_M)
    if e < 0:
        return  # no tile (past the padded length actually used) or a padding tile
    pair, ok_m, row = moe_tile_rows(sorted_pairs, pid_m, num_pairs, row_div, BLOCK_M)  # [BM] each
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = A + row[:, None] * stride_am + rk[None, :]  # [BM, BK]
    e64 = e.to(tl.int64)
    b_base = B + e64 * stride_be  # routed expert e: rows of B[e]
    stride_n = stride_bn
    up_off = up_offset
    if HAS_SHARED:  # experts >= num_routed: shared expert j = e - num_routed, a slice of the shared MLP's weights
        sh = e >= num_routed
        b_base = tl.where(sh, S + tl.maximum(e64 - num_routed, 0) * shared_step, b_base)
        stride_n = tl.where(sh, stride_sn, stride_bn).to(tl.int64)
        up_off = tl.where(sh, shared_up, up_offset)
    b_ptrs = b_base + rn.to(tl.int64)[None, :] * stride_n + rk[:, None]  # [BK, BN]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if SWIGLU:
        u_ptrs = b_ptrs + up_off
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=ok_m[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=ok_n[None, :], other=0.0)
        else:
            ok_k = k0 + rk < K
            a = tl.load(a_ptrs, mask=ok_m[:, None] & ok_k[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=ok_k[:, None] & ok_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        if SWIGLU:
            if EVEN_K:
                u = tl.load(u_ptrs, mask=ok_n[None, :], other=0.0)
            else:
                u = tl.load(u_ptrs, mask=ok_k[:, None] & ok_n[None, :], other=0.0)
            acc_u = tl.dot(a, u, acc_u, input_precision=PRECISION)
            u_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if SWIGLU:
        gate = acc.to(C.dtype.element_ty).to(tl.float32)  # rounded where the unfused GEMM writes gate_up
        up = acc_u.to(C.dtype.element_ty).to(tl.float32)
        if CLAMP:
            gate = tl.minimum(gate, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit)
        acc = gate / (1.0 + tl.exp(-gate)) * up
    if MUL_WEIGHT:
        w = tl.load(W + pair, mask=ok_m, other=0.0).to(tl.float32)
        acc = acc.to(A.dtype.element_ty).to(tl.float32) * w[:, None]  # rounded where the reference's GEMM is
    c_ptrs = C + pair.to(tl.int64)[:, None] * stride_cm + rn[None, :]
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=ok_m[:, None] & ok_n[None, :])


@triton.jit
def _align_kernel(IDS, SORTED, BLOCK_EXPERT, NUM_PADDED, P, E, P_MAX, NB, BM: tl.constexpr, E_PAD: tl.constexpr,
                  CHUNK: tl.constexpr):
    # One program: the whole sort/pad of kernels.fused_moe.align_pairs (same outputs, bit for bit) in one launch.
    _align_body(IDS, SORTED, BLOCK_EXPERT, NUM_PADDED, P, E, P_MAX, NB, BM, E_PAD, CHUNK)


@triton.jit
def _align_body(IDS, SORTED, BLOCK_EXPERT, NUM_PADDED, P, E, P_MAX, NB, BM: tl.constexpr, E_PAD: tl.constexpr,
                CHUNK: tl.constexpr):
    """The sort/pad by one program (also run by the last program of ``moe_routing.router_route``; ids read with
    ``.cg``: other programs of that launch wrote them)."""
    e_idx = tl.arange(0, E_PAD)
    j = tl.arange(0, CHUNK)
    counts = tl.zeros([E_PAD], dtype=tl.int32)
    for c0 in range(0, P, CHUNK):  # pairs per expert
        offs = c0 + j
        ids = tl.load(IDS + offs, mask=offs < P, other=-1, cache_modifier=".cg").to(tl.int32)
        ids = tl.where((ids >= 0) & (ids < E), ids, E_PAD)  # dropped pairs match no expert
        counts += tl.sum((ids[:, None] == e_idx[None, :]).to(tl.int32), axis=0)
    padded = (counts + BM - 1) // BM * BM
    pad_end = tl.cumsum(padded, axis=0)  # [E_PAD]
    pad_start = pad_end - padded
    run_end = pad_start + counts  # end of each expert's real pairs; padding up to pad_end
    total = tl.sum(padded, axis=0)
    tl.store(NUM_PADDED, total)
    for s0 in range(0, P_MAX, CHUNK):  # sentinels into every padding slot (disjoint from the pair slots below)
        s = s0 + j
        e_of = tl.sum((pad_end[None, :] <= s[:, None]).to(tl.int32), axis=1)  # expert whose padded run holds s
        end_of = tl.sum(tl.where(e_of[:, None] == e_idx[None, :], run_end[None, :], 0), axis=1)
        tl.store(SORTED + s, P, mask=(s < P_MAX) & ((s >= total) | (s >= end_of)))
    for b0 in range(0, NB, CHUNK):  # expert of each row block, -1 past the used length
        b = b0 + j
        first = b * BM
        e_of = tl.sum((pad_end[None, :] <= first[:, None]).to(tl.int32), axis=1)
        tl.store(BLOCK_EXPERT + b, tl.where(first < total, e_of, -1), mask=b < NB)
    cursor = pad_start
    for c0 in range(0, P, CHUNK):  # pair ids into their slots, stable (ascending pair id within an expert)
        offs = c0 + j
        ids = tl.load(IDS + offs, mask=offs < P, other=-1, cache_modifier=".cg").to(tl.int32)
        ids = tl.where((ids >= 0) & (ids < E), ids, E_PAD)
        hot = ids[:, None] == e_idx[None, :]  # [CHUNK, E_PAD]
        base = tl.sum(tl.where(hot, cursor[None, :], 0), axis=1)
        rank = tl.sum(((ids[:, None] == ids[None, :]) & (j[None, :] < j[:, None])).to(tl.int32), axis=1)
        tl.store(SORTED + base + rank, offs, mask=(offs < P) & (ids < E_PAD))
        cursor += tl.sum(hot.to(tl.int32), axis=0)


@triton.jit
def _align_count_kernel(IDS, COUNTS, P, E, E_PAD: tl.constexpr, CHUNK: tl.constexpr):
    # grid (num_chunks,): COUNTS[c, e] = pairs of chunk c routed to expert e (dropped ids match none)
    c = tl.program_id(0)
    e_idx = tl.arange(0, E_PAD)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(IDS + offs, mask=offs < P, other=-1).to(tl.int32)
    ids = tl.where((ids >= 0) & (ids < E), ids, E_PAD)
    tl.store(COUNTS + c * E_PAD + e_idx, tl.sum((ids[:, None] == e_idx[None, :]).to(tl.int32), axis=0))


@triton.jit
def _align_plan_kernel(COUNTS, BASE, BLOCK_EXPERT, NUM_PADDED, NCH, NB, BM: tl.constexpr, E_PAD: tl.constexpr,
                       CHUNK: tl.constexpr):
    # one program: the padded layout from the per-chunk counts; BASE[c, e] = the first slot of chunk c's pairs of
    # expert e (its expert's padded start + the pairs of e in earlier chunks: ascending pair id within an expert)
    e_idx = tl.arange(0, E_PAD)
    counts = tl.zeros([E_PAD], dtype=tl.int32)
    for c in range(0, NCH):
        counts += tl.load(COUNTS + c * E_PAD + e_idx)
    padded = (counts + BM - 1) // BM * BM
    pad_end = tl.cumsum(padded, axis=0)  # [E_PAD]
    total = tl.sum(padded, axis=0)
    tl.store(NUM_PADDED, total)
    cursor = pad_end - padded
    for c in range(0, NCH):
        tl.store(BASE + c * E_PAD + e_idx, cursor)
        cursor += tl.load(COUNTS + c * E_PAD + e_idx)
    j = tl.arange(0, CHUNK)
    for b0 in range(0, NB, CHUNK):  # expert of each row block, -1 past the used length
        b = b0 + j
        first = b * BM
        e_of = tl.sum((pad_end[None, :] <= first[:, None]).to(tl.int32), axis=1)
        tl.store(BLOCK_EXPERT + b, tl.where(first < total, e_of, -1), mask=b < NB)


@triton.jit
def _align_place_kernel(IDS, BASE, SORTED, P, E, E_PAD: tl.constexpr, CHUNK: tl.constexpr):
    # grid (num_chunks,): chunk c's pair ids into their slots (BASE + rank among the chunk's pairs of that expert)
    c = tl.program_id(0)
    e_idx = tl.arange(0, E_PAD)
    j = tl.arange(0, CHUNK)
    offs = c * CHUNK + j
    ids = tl.load(IDS + offs, mask=offs < P, other=-1).to(tl.int32)
    ids = tl.where((ids >= 0) & (ids < E), ids, E_PAD)
    base_e = tl.load(BASE + c * E_PAD + e_idx)  # [E_PAD]
    base = tl.sum(tl.where(ids[:, None] == e_idx[None, :], base_e[None, :], 0), axis=1)
    rank = tl.sum(((ids[:, None] == ids[None, :]) & (j[None, :] < j[:, None])).to(tl.int32), axis=1)
    tl.store(SORTED + base + rank, offs, mask=(offs < P) & (ids < E_PAD))


def moe_sum(y: torch.Tensor, top_k: int, dtype: torch.dtype) -> torch.Tensor:
    """y [T * top_k, D] fp32 (moe_down's per-pair rows) -> [T, D] in ``dtype``: the sum over each token's top-k rows
    and the cast in one launch (``y.view(T, k, D).sum(1).to(dtype)``; ``tiles.sum_terms``)."""
    P, D = y.shape
    assert y.dtype == torch.float32 and y.stride(1) == 1 and P % max(1, top_k) == 0
    out = torch.empty((P // max(1, top_k), D), dtype=dtype, device=y.device)
    return sum_terms(y, out, top_k, top_k * y.stride(0), y.stride(0))


def align_outputs(num_experts: int, block_m: int, p_max: int, device) -> tuple:
    """(sorted_pairs [p_max], block_expert [p_max / block_m], num_padded [1]) int32 buffers and the align body's
    (E_PAD, CHUNK) constants."""
    e_pad = max(16, 1 << (num_experts - 1).bit_length())
    chunk = max(16, min(128, 8192 // e_pad))
    return (torch.empty(p_max, dtype=torch.int32, device=device),
            torch.empty(p_max // block_m, dtype=torch.int32, device=device),
            torch.empty(1, dtype=torch.int32, device=device)), (e_pad, chunk)


def align_pairs(ids: torch.Tensor, num_experts: int, block_m: int, p_max: int):
    """One-launch version of ``kernels.fused_moe.align_pairs`` (same contract; ``p_max`` its static bound)."""
    P = ids.numel()
    (sorted_pairs, block_expert, num_padded), (e_pad, chunk) = align_outputs(num_experts, block_m, p_max, ids.device)
    _align_kernel[(1,)](ids.reshape(-1), sorted_pairs, block_expert, num_padded, P, num_experts, p_max,
                        p_max // block_m, BM=block_m, E_PAD=e_pad, CHUNK=chunk, num_warps=4)
    return sorted_pairs, block_expert, num_padded


def align_pairs_chunked(ids: torch.Tensor, num_experts: int, block_m: int, p_max: int):
    """``align_pairs`` for many pairs (prefill): the same outputs bit for bit in four launches whatever P is (a fill
    of the padding sentinel, per-chunk expert counts, one program for the padded layout, per-chunk placement),
    instead of the torch version's ~20 small ops and a radix sort of int64 keys."""
    P = ids.numel()
    (sorted_pairs, block_expert, num_padded), (e_pad, chunk) = align_outputs(num_experts, block_m, p_max, ids.device)
    nch = triton.cdiv(P, chunk)
    flat = ids.reshape(-1)
    counts = torch.empty((nch, e_pad), dtype=torch.int32, device=ids.device)
    base = torch.empty_like(counts)
    sorted_pairs.fill_(P)  # padding and unused slots; the placement writes every real pair over it
    _align_count_kernel[(nch,)](flat, counts, P, num_experts, E_PAD=e_pad, CHUNK=chunk, num_warps=4)
    _align_plan_kernel[(1,)](counts, base, block_expert, num_padded, nch, p_max // block_m, BM=block_m, E_PAD=e_pad,
                             CHUNK=chunk, num_warps=4)
    _align_place_kernel[(nch,)](flat, base, sorted_pairs, P, num_experts, E_PAD=e_pad, CHUNK=chunk, num_warps=4)
    return sorted_pairs, block_expert, num_padded


def _launch(a, b, c, w, sorted_pairs, block_expert, num_padded, n, row_div, up_offset, limit, cfg, swiglu, clamp,
            mul_weight, shared=None) -> None:
    """``shared`` = (tensor, step between shared experts, its row stride, its up-row offset) in elements, or None."""
    K = a.shape[1]
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    grid = (triton.cdiv(sorted_pairs.numel(), bm) * triton.cdiv(n, bn),)
    s, step, stride_sn, s_up = shared if shared is not None else (b, 0, 0, 0)
    _moe_gemm_kernel[grid](
        a, b, c, w, s, sorted_pairs, block_expert, num_padded, n, K, c.shape[0], row_div, up_offset, float(limit),
        a.stride(0), b.stride(0), b.stride(1), c.stride(0), b.shape[0], step, stride_sn, s_up, BLOCK_M=bm,
        BLOCK_N=bn, BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"], SWIGLU=swiglu, CLAMP=clamp,
        MUL_WEIGHT=mul_weight, EVEN_K=K % cfg["BLOCK_K"] == 0, PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        HAS_SHARED=shared is not None, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def moe_gate_up(x: torch.Tensor, gate_up: torch.Tensor, sorted_pairs: torch.Tensor, block_expert: torch.Tensor,
                num_padded: torch.Tensor, top_k: int, cfg: dict, limit: float | None = None,
                shared_gate_up: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, D], gate_up [E, 2I, D] -> act [T * top_k, I] in x.dtype, row = pair id (rows of dropped pairs unset).

    ``shared_gate_up [2 * ns * I, D]`` (a shared-experts MLP's merged weight: all gate rows, then all up rows):
    expert ids ``E + j`` read shared expert ``j``'s gate rows ``[j I, (j+1) I)`` and up rows ``ns I`` below them."""
    assert x.stride(1) == 1 and gate_up.stride(2) == 1 and gate_up.shape[2] == x.shape[1]
    inter = gate_up.shape[1] // 2
    shared = None
    if shared_gate_up is not None:
        assert shared_gate_up.stride(1) == 1 and shared_gate_up.shape[1] == x.shape[1]
        assert shared_gate_up.shape[0] % (2 * inter) == 0 and shared_gate_up.dtype == gate_up.dtype
        row = shared_gate_up.stride(0)
        shared = (shared_gate_up, inter * row, row, shared_gate_up.shape[0] // 2 * row)
    act = torch.empty((x.shape[0] * top_k, inter), dtype=x.dtype, device=x.device)
    if act.numel():
        _launch(x, gate_up, act, act, sorted_pairs, block_expert, num_padded, inter, top_k,
                inter * gate_up.stride(1), 0.0 if limit is None else limit, cfg, True, limit is not None, False, shared)
    return act


def moe_down(act: torch.Tensor, down: torch.Tensor, weights: torch.Tensor, sorted_pairs: torch.Tensor,
             block_expert: torch.Tensor, num_padded: torch.Tensor, cfg: dict, zero: bool = True,
             shared_down: torch.Tensor | None = None) -> torch.Tensor:
    """act [P, I], down [E, D, I], weights [P] fp32 -> fp32 [P, D] = weights[p] * act[p] @ down[e(p)]^T
    (rows of dropped pairs: 0 with ``zero``, unset without: only when no pair is dropped).

    ``shared_down [D, ns * I]``: expert ids ``E + j`` read its columns ``[j I, (j+1) I)``."""
    assert act.stride(1) == 1 and down.stride(2) == 1 and down.shape[2] == act.shape[1]
    shared = None
    if shared_down is not None:
        inter = down.shape[2]
        assert shared_down.stride(1) == 1 and shared_down.shape[0] == down.shape[1]
        assert shared_down.shape[1] % inter == 0 and shared_down.dtype == down.dtype
        shared = (shared_down, inter, shared_down.stride(0), 0)
    alloc = torch.zeros if zero else torch.empty
    out = alloc((act.shape[0], down.shape[1]), dtype=torch.float32, device=act.device)
    if out.numel():
        _launch(act, down, out, weights, sorted_pairs, block_expert, num_padded, down.shape[1], 1, 0, 0.0, cfg,
                False, False, True, shared)
    return out
