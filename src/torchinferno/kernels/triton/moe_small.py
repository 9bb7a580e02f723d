"""Fused MoE for a handful of tokens (batch-1 decode): two launches, no sort/pad, the top-k sum in the down kernel.

At one token every (token, slot) pair has its own expert, so the grouped GEMMs of ``kernels.triton.fused_moe``
(row blocks of >= 16 pairs, one real row each) need the sort/pad launch, a per-pair fp32 output and a reshape-sum
and cast for nothing. Here:

* :func:`_pair_gate_up_kernel` — grid ``(P, cdiv(I, BLOCK_N))``, one program per pair and ``BLOCK_N`` columns:
  ``act[pair] = swiglu(x[pair // k] @ gate_up[e]^T)`` as a GEMV (fp32 products of the bf16 rows, summed), gate and
  up rounded to x's dtype before the SwiGLU (where the unfused GEMM writes them), V4's clamp optional.
* :func:`_token_down_kernel` — grid ``(T, cdiv(D, BLOCK_N))``: ``out[t] = sum_j w[t, j] * round(act[t, j] @
  down[e_j]^T)`` over the token's ``k`` slots in slot order, fp32 accumulation, one rounding to x's dtype at the end:
  the grouped path's per-pair rows (rounded, then weighted) and its sum over the top-k, in one launch. Slots are
  unrolled; a ``BLOCK_K`` of at least ``I`` reads each slot's weight rows as one tile (no K loop).

A batch-1 decode step (``models.common.moe.fused_decode_moe``) also fuses its layer's ends: the pre-MoE RMSNorm
into the gate/up kernel (``RMS``: every program reads all of ``x``, so it gathers ``sum(x^2)`` and scales its finished
sums by 1/rms, the normalized input never rounded) and the residual add into the down kernel (``ADD``).

Ids ``E + j`` read shared expert ``j`` from the shared MLP's own weights (same slices as ``kernels.triton.fused_moe``);
with ``MAY_DROP`` ids outside ``[0, E + ns)`` contribute 0 (expert parallelism). Every pair reads its expert's weight
rows itself, so this only pays while pairs rarely share an expert (``kernels.fused_moe.MoEPolicy.small_m_max_tokens``).
Reference: ``models.common.moe.grouped_expert_mlp`` (tests/kernels/fused_moe_checks.py ``check_small``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.triton.decode_gemv import _input_tile, _inv_rms, _wait_for_previous_kernel, pdl_kwargs


@triton.jit
def _expert_rows(B, S, e, num_routed, stride_be, stride_bn, up_offset, shared_step, stride_sn, shared_up,
                 HAS_SHARED: tl.constexpr):
    """(base pointer, row stride, up-row offset) of expert ``e``: routed ``B[e]`` or shared ``e - num_routed``."""
    base = B + e * stride_be
    stride_n = stride_bn + 0 * e
    up = up_offset + 0 * e
    if HAS_SHARED:
        sh = e >= num_routed
        base = tl.where(sh, S + tl.maximum(e - num_routed, 0) * shared_step, base)
        stride_n = tl.where(sh, stride_sn, stride_bn)
        up = tl.where(sh, shared_up, up_offset)
    return base, stride_n, up


@triton.jit
def _pair_gate_up_kernel(X, B, S, IDS, ACT, NW, D, INTER, top_k, num_routed, num_valid, stride_xt, stride_be,
                         stride_bn, up_offset, shared_step, stride_sn, shared_up, stride_at, limit, eps,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CLAMP: tl.constexpr, HAS_SHARED: tl.constexpr,
                         MAY_DROP: tl.constexpr, RMS: tl.constexpr, PDL: tl.constexpr = False):
    # PDL: wait first (the expert ids come from the routing launch); no early launch of the down kernel, whose
    # waiting programs would hold SM slots this launch's later waves need
    _wait_for_previous_kernel(PDL, False)
    pair = tl.program_id(0).to(tl.int64)
    e = tl.load(IDS + pair).to(tl.int64)
    if MAY_DROP:
        if (e < 0) | (e >= num_valid):
            return  # another rank's expert: the down kernel skips this pair
    t = pair // top_k
    base, stride_n, up = _expert_rows(B, S, e, num_routed, stride_be, stride_bn, up_offset, shared_step, stride_sn,
                                      shared_up, HAS_SHARED)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok_n = rn < INTER
    rk = tl.arange(0, BLOCK_K)
    g_ptrs = base + rn.to(tl.int64)[:, None] * stride_n + rk[None, :]  # [BN, BK]
    acc_g = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    ss = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        kk = k0 + rk
        ok_k = kk < D
        xv, x = _input_tile(X + t * stride_xt, NW, kk, ok_k, RMS)  # RMS: x * NW; the 1/rms scales the sums
        if RMS:
            ss += x * x
        m = ok_n[:, None] & ok_k[None, :]
        wg = tl.load(g_ptrs + k0, mask=m, other=0.0, eviction_policy="evict_first")
        wu = tl.load(g_ptrs + up + k0, mask=m, other=0.0, eviction_policy="evict_first")
        acc_g += wg.to(tl.float32) * xv[None, :]
        acc_u += wu.to(tl.float32) * xv[None, :]
    inv = _inv_rms(ss, D, eps, RMS)
    gate, upv = tl.sum(acc_g, 1) * inv, tl.sum(acc_u, 1) * inv
    gate = gate.to(ACT.dtype.element_ty).to(tl.float32)  # rounded where the unfused GEMM writes them
    upv = upv.to(ACT.dtype.element_ty).to(tl.float32)
    if CLAMP:
        gate = tl.minimum(gate, limit)
        upv = tl.minimum(tl.maximum(upv, -limit), limit)
    act = gate / (1.0 + tl.exp(-gate)) * upv
    tl.store(ACT + pair * stride_at + rn, act.to(ACT.dtype.element_ty), mask=ok_n)


@triton.jit
def _token_down_kernel(ACT, B, S, IDS, W, OUT, RES, D, INTER, num_routed, num_valid, stride_be, stride_bn, shared_step,
                       stride_sn, stride_at, stride_ot, stride_rt, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, ONE_K: tl.constexpr, HAS_SHARED: tl.constexpr, MAY_DROP: tl.constexpr,
                       ADD: tl.constexpr, PDL: tl.constexpr = False):
    _wait_for_previous_kernel(PDL, False)  # PDL: before any access (ids, act, the residual)
    t = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok_n = rn < D
    rk = tl.arange(0, BLOCK_K)
    out = tl.zeros([BLOCK_N], dtype=tl.float32)
    # Slots unrolled (TOP_K constexpr) and, with ONE_K (BLOCK_K >= INTER), one weight tile per slot: straight-line
    # loads with no loop between them, so every slot's tile can be in flight at once (a batch-1 step has only
    # D / BLOCK_N programs per token).
    for j in tl.static_range(TOP_K):  # slot order: the grouped path's sum over the top-k rows of a token
        pair = t * TOP_K + j
        e = tl.load(IDS + pair).to(tl.int64)
        if MAY_DROP:
            ok = (e >= 0) & (e < num_valid)
        else:
            ok = e == e  # every id in range (a router's output)
        e = tl.where(ok, e, 0)
        base, stride_n, _up = _expert_rows(B, S, e, num_routed, stride_be, stride_bn, 0, shared_step, stride_sn, 0,
                                           HAS_SHARED)
        w_ptrs = base + rn.to(tl.int64)[:, None] * stride_n + rk[None, :]  # [BN, BK]
        if ONE_K:
            ok_k = (rk < INTER) & ok
            b = tl.load(w_ptrs, mask=ok_n[:, None] & ok_k[None, :], other=0.0, eviction_policy="evict_first")
            a = tl.load(ACT + pair * stride_at + rk, mask=ok_k, other=0.0).to(tl.float32)
            dot = tl.sum(b.to(tl.float32) * a[None, :], 1)
        else:
            acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
            for k0 in range(0, INTER, BLOCK_K):
                kk = k0 + rk
                ok_k = (kk < INTER) & ok
                a = tl.load(ACT + pair * stride_at + kk, mask=ok_k, other=0.0).to(tl.float32)
                b = tl.load(w_ptrs + k0, mask=ok_n[:, None] & ok_k[None, :], other=0.0, eviction_policy="evict_first")
                acc += b.to(tl.float32) * a[None, :]
            dot = tl.sum(acc, 1)
        wt = tl.load(W + pair).to(tl.float32)
        y = dot.to(ACT.dtype.element_ty).to(tl.float32) * wt  # rounded, then weighted (the grouped path)
        out += tl.where(ok, y, 0.0)
    if ADD:  # the residual stream's add: the MoE output rounded, then the sum rounded (the unfused x + moe(x))
        out = out.to(OUT.dtype.element_ty).to(tl.float32) + tl.load(RES + t * stride_rt + rn, mask=ok_n).to(tl.float32)
    tl.store(OUT + t * stride_ot + rn, out.to(OUT.dtype.element_ty), mask=ok_n)


def small_m_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                    down: torch.Tensor, cfg_gate_up: dict, cfg_down: dict, limit: float | None = None,
                    may_drop: bool = False, shared: tuple[torch.Tensor, torch.Tensor] | None = None,
                    rms: tuple[torch.Tensor, float] | None = None, residual: torch.Tensor | None = None,
                    out: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """x [T, D], ids [T, k], weights [T, k] fp32, gate_up [E, 2I, D], down [E, D, I] -> [T, D] in x.dtype.

    ``kernels.fused_moe.fused_experts``'s contract (``shared = (shared_gate_up [2 ns I, D], shared_down [D, ns I])``,
    ids ``E + j``); two launches. Inputs contiguous (the caller's job). A decoder layer's ends fused in (a batch-1
    step): ``rms = (norm_weight [D], eps)`` runs the experts on ``rms_norm(x) * norm_weight`` (never rounded);
    ``residual [T, D]`` is added to the output (``round(residual + round(moe))``); ``out`` [T, D] receives it (must
    not alias ``residual``: another program may still read the row). ``pdl``: both launches with programmatic
    dependent launch (Hopper; CUDA only)."""
    T, top_k = ids.shape
    E, two_i, D = gate_up.shape
    inter = two_i // 2
    assert x.stride(1) == 1 and gate_up.stride(2) == 1 and down.stride(2) == 1 and ids.is_contiguous()
    assert weights.dtype == torch.float32 and weights.is_contiguous() and down.shape == (E, D, inter)
    assert residual is None or (residual.shape == (T, D) and residual.stride(1) == 1)
    assert out is None or residual is None or out.data_ptr() != residual.data_ptr()
    out = torch.empty((T, D), dtype=x.dtype, device=x.device) if out is None else out
    if T == 0:
        return out
    act = torch.empty((T * top_k, inter), dtype=x.dtype, device=x.device)
    s_gu, s_dn = shared if shared is not None else (gate_up, down)
    n_valid = E
    if shared is not None:
        assert s_gu.stride(1) == 1 and s_gu.shape[1] == D and s_gu.shape[0] % two_i == 0 and s_gu.dtype == gate_up.dtype
        assert s_dn.stride(1) == 1 and s_dn.shape == (D, s_gu.shape[0] // 2) and s_dn.dtype == down.dtype
        n_valid = E + s_gu.shape[0] // two_i
    row = s_gu.stride(0)
    c1, c2 = cfg_gate_up, cfg_down
    _pair_gate_up_kernel[(T * top_k, triton.cdiv(inter, c1["BLOCK_N"]))](
        x, gate_up, s_gu, ids, act, x if rms is None else rms[0], D, inter, top_k, E, n_valid, x.stride(0),
        gate_up.stride(0), gate_up.stride(1), inter * gate_up.stride(1), inter * row, row, s_gu.shape[0] // 2 * row,
        act.stride(0), 0.0 if limit is None else float(limit), 0.0 if rms is None else float(rms[1]),
        BLOCK_N=c1["BLOCK_N"], BLOCK_K=c1["BLOCK_K"], CLAMP=limit is not None, HAS_SHARED=shared is not None,
        MAY_DROP=may_drop, RMS=rms is not None, num_warps=c1["num_warps"], num_stages=c1["num_stages"],
        **pdl_kwargs(pdl))
    _token_down_kernel[(T, triton.cdiv(D, c2["BLOCK_N"]))](
        act, down, s_dn, ids, weights, out, out if residual is None else residual, D, inter, E, n_valid,
        down.stride(0), down.stride(1), inter, s_dn.stride(0), act.stride(0), out.stride(0),
        0 if residual is None else residual.stride(0), TOP_K=top_k, BLOCK_N=c2["BLOCK_N"], BLOCK_K=c2["BLOCK_K"],
        ONE_K=c2["BLOCK_K"] >= inter, HAS_SHARED=shared is not None, MAY_DROP=may_drop, ADD=residual is not None,
        num_warps=c2["num_warps"], num_stages=c2["num_stages"], **pdl_kwargs(pdl))
    return out
