"""Block-scaled FP8 GEMM (the DeepSeek-V3 / DeepGEMM recipe) and its per-token-group activation quantizer.

Torch reference and definition: ``kernels.fp8_block`` (``quantize_fp8_groups``, ``fp8_block_linear_reference``).

* :func:`quantize_fp8_groups_triton` — ``x [M, K]`` -> ``(q [M, K] e4m3, s [M, ceil(K/128)] fp32)``: one scale per
  row and 128-wide K group, bitwise the torch rule (exact amax, the scale as an fp32 product, IEEE division
  ``div_rn``, round-to-nearest-even). A partial last group is scaled by its own elements.
* :func:`fp8_block_matmul` — ``y [M, N] = sum_g (xq[:, g] . wq[:, g]^T) * s_x[:, g] * s_w[n // 128, g]`` with a
  fresh ``tl.dot`` per 128-wide K block promoted to the fp32 accumulator through both scales (as vLLM's
  ``w8a8_block_fp8_matmul`` and DeepGEMM do: Hopper's FP8 MMA accumulates imprecisely, so each dot spans only one
  scale group), rounded once to the output dtype. Edge blocks are masked, so any ``N`` and ``K`` work.

:func:`_e4m3_rne` rounds to the E4M3 grid in fp32 before the cast: the value cast is then exactly representable.
Triton's CPU interpreter converts fp32 to fp8 wrongly when rounding carries into the next binade (127.99 -> 64),
and with the rounding done here the interpreter and the GPU store the same bytes (tests/kernels/fp8_block_checks.py).

Tile configs come from the caller (``kernels.fp8_block.block_config``); ``BLOCK_K`` is the scale group (128).
Launches never call ``torch.cuda`` APIs, so they also run under Triton's CPU interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.fp8_rule import E4M3_MAX, EPS, INV_E4M3_MAX
from torchinferno.kernels.triton.tiles import grouped_tile, sum_terms

GROUP = 128  # the scale block of both operands along K, and of the weight along N
_QMAX = tl.constexpr(E4M3_MAX)  # the same three, as the jit functions read them
_INV_QMAX = tl.constexpr(INV_E4M3_MAX)
_FLOOR = tl.constexpr(EPS)


@triton.jit
def _e4m3_rne(v):
    """fp32 ``v`` already clamped to [-448, 448] -> the nearest E4M3 value (ties to even), still fp32, sign kept."""
    bits = v.to(tl.int32, bitcast=True)
    expo = tl.maximum((bits >> 23) & 0xFF, 121)  # below 2^-6 the subnormal spacing 2^-9 applies
    ulp = ((expo - 3) << 23).to(tl.float32, bitcast=True)  # 3 mantissa bits: spacing 2^(e - 3)
    inv_ulp = ((257 - expo) << 23).to(tl.float32, bitcast=True)  # 2^-(e - 3): a multiply, exact (no approx. divide)
    a = tl.abs(v) * inv_ulp
    r = ((a + 12582912.0) - 12582912.0) * ulp  # 1.5 * 2^23: fp32 addition rounds |a| to an integer, ties to even
    return (r.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def quantize_e4m3_rows(x):
    """fp32 ``x [R, C]`` (one 128-group per row; masked-out entries 0) -> (e4m3 [R, C], scale [R] fp32): the torch
    rule of ``kernels.fp8_block.quantize_fp8_groups`` bitwise (exact amax, ``max(amax, 1e-12) * (1 / 448)`` as an
    fp32 product, IEEE division, clamp to +-448, round to nearest even on the E4M3 grid)."""
    scale = tl.maximum(tl.max(tl.abs(x), axis=1), _FLOOR) * _INV_QMAX  # [R]
    q = _e4m3_rne(tl.clamp(tl.math.div_rn(x, scale[:, None]), -_QMAX, _QMAX)).to(tl.float8e4nv)
    return q, scale


@triton.jit
def _e4m3_round_kernel(V, O, n, BLOCK: tl.constexpr):
    # tests only: O = e4m3(clamp(V, +-448)) through _e4m3_rne, to hold it against torch's cast
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.clamp(tl.load(V + o, mask=o < n), -448.0, 448.0)
    tl.store(O + o, _e4m3_rne(v).to(tl.float8e4nv), mask=o < n)


@triton.jit
def _group_quant_kernel(X, Q, S, stride_x, stride_q, stride_s, K, G, GB: tl.constexpr, GROUP_K: tl.constexpr):
    # grid (M, cdiv(G, GB)): GB groups of one row per program
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GB + tl.arange(0, GB)  # [GB]
    cols = g[:, None] * GROUP_K + tl.arange(0, GROUP_K)[None, :]  # [GB, 128]
    ok = (cols < K) & (g[:, None] < G)
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    q, scale = quantize_e4m3_rows(x)  # [GB, 128], [GB]
    tl.store(S + row * stride_s + g, scale, mask=g < G)
    tl.store(Q + row * stride_q + cols, q, mask=ok)


def quantize_fp8_groups_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (last dim contiguous) -> (q [M, K] float8_e4m3fn, s [M, ceil(K/128)] fp32)."""
    M, K = x.shape
    G = triton.cdiv(K, GROUP)
    q = torch.empty((M, K), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((M, G), dtype=torch.float32, device=x.device)
    if M and K:
        gb = min(8, triton.next_power_of_2(G))
        _group_quant_kernel[(M, triton.cdiv(G, gb))](x, q, s, x.stride(0), q.stride(0), s.stride(0), K, G, GB=gb,
                                                     GROUP_K=GROUP,
                                                     num_warps=4)
    return q, s


@triton.jit
def _block_mm_kernel(A, AS, B, BS, C, BIAS, WS, M, N, K, stride_am, stride_asm, stride_bn, stride_bsn, stride_cm,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                     EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, QUANT_A: tl.constexpr = False,
                     SPLIT_K: tl.constexpr = 1):
    # QUANT_A: A is the unquantized activation (bf16/fp16/fp32); each program quantizes its rows' K groups in
    # registers with the quantizer's exact rule (same codes and scales), so no separate launch (small M only: every
    # N tile repeats the rows' quantization).
    # SPLIT_K > 1 (grid axis 1): this program sums only its share of the K groups and stores the fp32 partial in
    # WS [SPLIT_K, M, N]; tiles.sum_terms adds the shares in split order (deterministic), the bias and rounds.
    _, pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    num_g = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(num_g, SPLIT_K)
    g_lo = tl.program_id(1) * per_split
    g_hi = tl.minimum(g_lo + per_split, num_g)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok_m = rm < M
    ok_n = rn < N
    rm_c = tl.where(ok_m, rm, 0).to(tl.int64)
    rn_c = tl.where(ok_n, rn, 0).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = A + rm_c[:, None] * stride_am + g_lo * BLOCK_K + rk[None, :]  # [BM, BK] at K group g_lo
    b_ptrs = B + rn_c[None, :] * stride_bn + g_lo * BLOCK_K + rk[:, None]  # [BK, BN]
    as_ptrs = AS + rm_c * stride_asm  # [BM] row scales of K group 0
    bs_ptrs = BS + (rn_c // BLOCK_K) * stride_bsn  # [BN] the weight block row of each column
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(g_lo, g_hi):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            ok_k = kb * BLOCK_K + rk < K
            a = tl.load(a_ptrs, mask=ok_k[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=ok_k[:, None], other=0.0)
        if QUANT_A:
            a, a_s = quantize_e4m3_rows(a.to(tl.float32))  # [BM, BK] e4m3, [BM]
        else:
            a_s = tl.load(as_ptrs + kb)
        b_s = tl.load(bs_ptrs + kb)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]  # one scale group per dot, promoted to fp32
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if SPLIT_K > 1:
        w_ptrs = WS + (tl.program_id(1) * M + rm_c[:, None]) * N + rn[None, :]
        tl.store(w_ptrs, acc, mask=ok_m[:, None] & ok_n[None, :])
    else:
        if HAS_BIAS:
            acc += tl.load(BIAS + rn_c, mask=ok_n, other=0.0).to(tl.float32)[None, :]
        c_ptrs = C + rm_c[:, None] * stride_cm + rn[None, :]
        tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=ok_m[:, None] & ok_n[None, :])


def fp8_block_matmul(xq: torch.Tensor, xs: torch.Tensor | None, wq: torch.Tensor, ws: torch.Tensor,
                     out_dtype: torch.dtype, cfg: dict, bias: torch.Tensor | None = None) -> torch.Tensor:
    """xq [M, K] e4m3, xs [M, ceil(K/128)] fp32, wq [N, K] e4m3, ws [ceil(N/128), ceil(K/128)] fp32 -> [M, N].

    ``xs=None``: ``xq`` is the unquantized activation ``x [M, K]``, quantized inside the GEMM (bitwise as
    :func:`quantize_fp8_groups_triton`; one launch instead of two, for small M). ``cfg``: ``BLOCK_M``, ``BLOCK_N``
    (a power of two, at least 16), ``GROUP_M``, ``num_warps``, ``num_stages`` (``BLOCK_K`` is the scale group, 128),
    optionally ``SPLIT_K``: the K groups shared among that many programs per tile (decode's weight stream: more
    programs in flight), their fp32 partials summed by a second launch.
    Rows of every operand contiguous in K."""
    M, K = xq.shape
    N = wq.shape[0]
    assert wq.shape[1] == K and xq.stride(1) == 1 and wq.stride(1) == 1 and ws.stride(1) == 1
    G = triton.cdiv(K, GROUP)
    assert tuple(ws.shape) == (triton.cdiv(N, GROUP), G)
    fused = xs is None
    if fused:
        xs = ws  # unused by the kernel
    else:
        assert tuple(xs.shape) == (M, G) and xs.stride(1) == 1 and xq.dtype == torch.float8_e4m3fn
    out = torch.empty((M, N), dtype=out_dtype, device=xq.device)
    if M and N:
        bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
        split = max(1, min(int(cfg.get("SPLIT_K", 1)), G))
        # split-K: fp32 shares [split, M, N], summed in split order by the second launch (with the bias)
        ws_buf = torch.empty((split, M, N), dtype=torch.float32, device=xq.device) if split > 1 else out
        bias_arg = out if bias is None else bias
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn), split)
        _block_mm_kernel[grid](xq, xs, wq, ws, out, bias_arg, ws_buf, M, N, K, xq.stride(0),
                               xs.stride(0), wq.stride(0), ws.stride(0), out.stride(0), BLOCK_M=bm, BLOCK_N=bn,
                               BLOCK_K=GROUP, GROUP_M=cfg["GROUP_M"], EVEN_K=K % GROUP == 0,
                               HAS_BIAS=bias is not None, QUANT_A=fused, SPLIT_K=split, num_warps=cfg["num_warps"],
                               num_stages=cfg["num_stages"])
        if split > 1:  # share s of row m starts at (s * M + m) * N
            sum_terms(ws_buf, out, split, N, M * N, bias)
    return out
