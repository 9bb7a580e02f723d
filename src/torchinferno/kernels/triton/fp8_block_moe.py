"""Grouped expert GEMMs of a fused MoE over block-scaled FP8 expert weights (``kernels.triton.fused_moe``'s design).

Same pair layout as ``kernels.triton.fused_moe`` (``sorted_pairs`` / ``block_expert`` / ``num_padded`` from
``kernels.fused_moe.align_pairs``); the operands are FP8 with per-128-group scales instead of bf16:

* :func:`moe_gate_up_fp8` — ``act [P, I] = swiglu(gate, up)`` where ``gate_up = x_q[pair // top_k] . W_q[e]^T``
  block-scaled as ``kernels.triton.fp8_block`` does (``x_q [T, D]`` e4m3, ``s_x [T, D/128]``; ``W_q [E, 2I, D]`` e4m3,
  ``s_w [E, 2I/128, D/128]``); gate and up are rounded to the activation dtype before ``silu(gate) * up`` in fp32
  (where the unfused reference's GEMM writes them), the product rounded once. Up rows start ``I`` rows below the
  gate rows; their scale rows are ``(I + n) // 128``, so ``I`` need not be a multiple of 128.
* :func:`moe_down_fp8` — ``out [P, D] = w[pair] * round(act_q[pair] . W_q[e]^T)`` fp32 (``act`` quantized per pair
  and 128-group by the caller), rounded to the activation dtype before the routing weight as the reference is.

The caller sums each token's ``top_k`` rows (``kernels.triton.fused_moe.moe_sum``). No host sync: static grids.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.triton.fp8_block import quantize_e4m3_rows
from torchinferno.kernels.triton.tiles import moe_tile, moe_tile_rows

GROUP = 128


@triton.jit
def _moe_fp8_kernel(A, AS, B, BS, C, W, sorted_pairs, block_expert, num_padded, N, K, num_pairs, row_div, up_rows,
                    stride_am, stride_asm, stride_be, stride_bn, stride_bse, stride_bsn, stride_cm,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    EVEN_K: tl.constexpr, SWIGLU: tl.constexpr, MUL_WEIGHT: tl.constexpr, ROUND: tl.constexpr,
                    QUANT_A: tl.constexpr = False):
    # QUANT_A: A is the unquantized activation; each program quantizes its rows per 128-group in registers with the
    # quantizer's exact rule (kernels.triton.fp8_block), so decode-sized steps need no quantizer launches
    e, pid_m, rn, ok_n = moe_tile(tl.program_id(0), num_padded, block_expert, N, BLOCK_M, BLOCK_N, GROUP_M)
    if e < 0:
        return  # no tile (past the padded length actually used) or a padding tile
    pair, ok_m, row = moe_tile_rows(sorted_pairs, pid_m, num_pairs, row_div, BLOCK_M)  # [BM] each
    rn_c = tl.where(ok_n, rn, 0).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    e64 = e.to(tl.int64)
    a_ptrs = A + row[:, None] * stride_am + rk[None, :]  # [BM, BK]
    as_ptrs = AS + row * stride_asm  # [BM]
    b_ptrs = B + e64 * stride_be + rn_c[None, :] * stride_bn + rk[:, None]  # [BK, BN]
    bs_ptrs = BS + e64 * stride_bse + (rn_c // BLOCK_K) * stride_bsn  # [BN]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if SWIGLU:
        u_ptrs = b_ptrs + up_rows * stride_bn
        us_ptrs = BS + e64 * stride_bse + ((rn_c + up_rows) // BLOCK_K) * stride_bsn
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            ok_k = kb * BLOCK_K + rk < K
            a = tl.load(a_ptrs, mask=ok_k[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=ok_k[:, None], other=0.0)
        if QUANT_A:
            a, a_s = quantize_e4m3_rows(a.to(tl.float32))
            a_s = a_s[:, None]
        else:
            a_s = tl.load(as_ptrs + kb)[:, None]
        acc += tl.dot(a, b) * a_s * tl.load(bs_ptrs + kb)[None, :]
        if SWIGLU:
            if EVEN_K:
                u = tl.load(u_ptrs)
            else:
                u = tl.load(u_ptrs, mask=ok_k[:, None], other=0.0)
            acc_u += tl.dot(a, u) * a_s * tl.load(us_ptrs + kb)[None, :]
            u_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if SWIGLU:
        gate = acc.to(C.dtype.element_ty).to(tl.float32)  # rounded where the reference's GEMM writes gate_up
        up = acc_u.to(C.dtype.element_ty).to(tl.float32)
        acc = gate / (1.0 + tl.exp(-gate)) * up
    if MUL_WEIGHT:
        w = tl.load(W + pair, mask=ok_m, other=0.0).to(tl.float32)
        if ROUND == 1:
            acc = acc.to(tl.bfloat16).to(tl.float32)
        elif ROUND == 2:
            acc = acc.to(tl.float16).to(tl.float32)
        acc = acc * w[:, None]
    c_ptrs = C + pair.to(tl.int64)[:, None] * stride_cm + rn[None, :]
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=ok_m[:, None] & ok_n[None, :])


def _launch(a, a_s, b, b_s, c, w, sorted_pairs, block_expert, num_padded, n, row_div, up_rows, cfg, swiglu,
            mul_weight, round_to: int) -> None:
    """``a_s=None``: ``a`` is unquantized and the kernel quantizes it (``QUANT_A``)."""
    K = a.shape[1]
    quant_a = a_s is None
    if quant_a:
        a_s = b_s  # unused by the kernel
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    grid = (triton.cdiv(sorted_pairs.numel(), bm) * triton.cdiv(n, bn),)
    _moe_fp8_kernel[grid](
        a, a_s, b, b_s, c, w, sorted_pairs, block_expert, num_padded, n, K, c.shape[0], row_div, up_rows,
        a.stride(0), a_s.stride(0), b.stride(0), b.stride(1), b_s.stride(0), b_s.stride(1), c.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=GROUP, GROUP_M=cfg["GROUP_M"], EVEN_K=K % GROUP == 0, SWIGLU=swiglu,
        MUL_WEIGHT=mul_weight, ROUND=round_to, QUANT_A=quant_a, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def _check(a, a_s, b, b_s) -> None:
    E, N, K = b.shape
    G = triton.cdiv(K, GROUP)
    assert a.stride(1) == 1 and b.stride(2) == 1 and b_s.stride(2) == 1 and a.shape[1] == K
    if a_s is not None:
        assert a_s.stride(1) == 1 and tuple(a_s.shape) == (a.shape[0], G) and a.dtype == torch.float8_e4m3fn
    assert tuple(b_s.shape) == (E, triton.cdiv(N, GROUP), G), (tuple(b_s.shape), (E, N, K))


def moe_gate_up_fp8(xq: torch.Tensor, xs: torch.Tensor | None, gate_up: torch.Tensor, gate_up_s: torch.Tensor,
                    sorted_pairs: torch.Tensor, block_expert: torch.Tensor, num_padded: torch.Tensor, top_k: int,
                    cfg: dict, out_dtype: torch.dtype, zero: bool = False) -> torch.Tensor:
    """xq [T, D] e4m3, xs [T, D/128] fp32, gate_up [E, 2I, D] e4m3, gate_up_s [E, 2I/128, D/128] fp32 ->
    act [T * top_k, I] in ``out_dtype``, row = pair id (rows of dropped pairs: 0 with ``zero``, else unset).
    ``xs=None``: ``xq`` is the unquantized ``x [T, D]``, quantized inside the kernel (the same codes)."""
    _check(xq, xs, gate_up, gate_up_s)
    inter = gate_up.shape[1] // 2
    act = (torch.zeros if zero else torch.empty)((xq.shape[0] * top_k, inter), dtype=out_dtype, device=xq.device)
    if act.numel():
        _launch(xq, xs, gate_up, gate_up_s, act, act, sorted_pairs, block_expert, num_padded, inter, top_k, inter,
                cfg, True, False, 0)
    return act


def moe_down_fp8(aq: torch.Tensor, a_s: torch.Tensor | None, down: torch.Tensor, down_s: torch.Tensor,
                 weights: torch.Tensor, sorted_pairs: torch.Tensor, block_expert: torch.Tensor,
                 num_padded: torch.Tensor, cfg: dict, act_dtype: torch.dtype, zero: bool = True) -> torch.Tensor:
    """aq [P, I] e4m3, a_s [P, I/128], down [E, D, I] e4m3, down_s [E, D/128, I/128], weights [P] fp32 ->
    fp32 [P, D] = weights[p] * round_{act_dtype}(aq[p] . down[e(p)]^T) (rows of dropped pairs: 0 with ``zero``).
    ``a_s=None``: ``aq`` is the unquantized ``act [P, I]``, quantized inside the kernel."""
    _check(aq, a_s, down, down_s)
    assert act_dtype in (torch.bfloat16, torch.float16, torch.float32)
    alloc = torch.zeros if zero else torch.empty
    out = alloc((aq.shape[0], down.shape[1]), dtype=torch.float32, device=aq.device)
    if out.numel():
        round_to = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}[act_dtype]
        _launch(aq, a_s, down, down_s, out, weights, sorted_pairs, block_expert, num_padded, down.shape[1], 1, 0,
                cfg, False, True, round_to)
    return out
