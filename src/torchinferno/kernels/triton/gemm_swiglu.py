"""``fused_rmsnorm_swiglu`` on CUDA: the residual add + RMSNorm kernel, then one GEMM whose epilogue is SwiGLU.

``act = swiglu(rms_norm(x + residual) @ W_gate_up^T)`` without writing ``gate_up [T, 2I]`` to memory:
each program computes an output tile of the gate half and the matching tile of the up half
(two fp32 accumulators over the same ``A`` tiles), rounds both to the activation dtype (where
the unfused path's GEMM output is rounded) and stores ``silu(gate) * up``. The norm stays a
separate row kernel (``kernels.triton.norm.add_rms_norm``): it needs the whole row's statistics
before any GEMM tile can use it. The custom op's CUDA kernel picks the fused epilogue only where
it measured faster (:data:`FUSED_ROWS`); elsewhere it runs cuBLAS and the SwiGLU kernel.

Torch reference: ``kernels.custom_ops.reference_fused_rmsnorm_swiglu``; the results differ by
the GEMM's fp32 summation order and the exp implementation. The speed comparison against the
unfused kernels (norm, cuBLAS GEMM, SwiGLU) is ``benchmarks/probe_fused_mlp.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.triton.tiles import grouped_tile


@triton.jit(do_not_specialize=["M"])  # M = tokens in the step: no recompile per step shape
def _mm_swiglu_kernel(A, W, Y, M, N, K, up_offset, stride_am, stride_wn, stride_ym, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
    # grouped tile order: GROUP_M row tiles share each weight tile while it is in L2
    _, pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    a_ptrs = A + rm.to(tl.int64)[:, None] * stride_am + rk[None, :]  # [BM, BK]
    g_ptrs = W + rn.to(tl.int64)[None, :] * stride_wn + rk[:, None]  # [BK, BN] tile of W_gate^T
    u_ptrs = g_ptrs + up_offset  # the same tile of W_up^T (up rows start I rows below)
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=m_ok[:, None], other=0.0)
            g = tl.load(g_ptrs, mask=n_ok[None, :], other=0.0)
            u = tl.load(u_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = k0 + rk < K
            a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            g = tl.load(g_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            u = tl.load(u_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc_g = tl.dot(a, g, acc_g)
        acc_u = tl.dot(a, u, acc_u)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    gate = acc_g.to(Y.dtype.element_ty).to(tl.float32)  # rounded where the unfused GEMM writes gate_up
    up = acc_u.to(Y.dtype.element_ty).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    y_ptrs = Y + rm.to(tl.int64)[:, None] * stride_ym + rn[None, :]
    tl.store(y_ptrs, y.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def _config(M: int) -> dict:
    """Launch config by rows: decode-sized inputs take narrow tiles (more programs over the weight)."""
    if M <= 64:
        return {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 4}
    return {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}


def matmul_swiglu(a: torch.Tensor, gate_up_weight: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """a [M, K] @ gate_up_weight [2I, K]^T -> silu(gate) * up [M, I] in a's dtype (gate rows first)."""
    M, K = a.shape
    two_i = gate_up_weight.shape[0]
    inter = two_i // 2
    assert a.stride(1) == 1 and gate_up_weight.stride(1) == 1 and gate_up_weight.shape[1] == K
    y = torch.empty((M, inter), dtype=a.dtype, device=a.device)
    cfg = dict(config or _config(M))
    if M:
        grid = (triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(inter, cfg["BLOCK_N"]),)
        _mm_swiglu_kernel[grid](a, gate_up_weight, y, M, inter, K, inter * gate_up_weight.stride(0), a.stride(0),
                                gate_up_weight.stride(0), y.stride(0), EVEN_K=K % cfg["BLOCK_K"] == 0, **cfg)
    return y


# Rows for which the epilogue-fused GEMM measured faster than cuBLAS + the SwiGLU kernel on H200
# (benchmarks/probe_fused_mlp.py, run 10: 66.6 vs 68.6 us at T=64, Llama-3-8B MLP); at T=1 and at
# T >= 256 cuBLAS's GEMM is faster than this Triton GEMM by more than the saved SwiGLU pass.
FUSED_ROWS = (2, 64)


def fused_rmsnorm_swiglu(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                         gate_up_weight: torch.Tensor, eps: float, config: dict | None = None,
                         epilogue: str = "fused"):
    """x, residual [T, D] -> (act [T, I], x + residual [T, D]); see the module docstring.

    ``epilogue``: ``"fused"`` (the GEMM with the SwiGLU epilogue), ``"separate"`` (cuBLAS GEMM, then
    the Triton SwiGLU kernel) or ``"auto"`` (fused for :data:`FUSED_ROWS` rows, else separate).
    """
    from torchinferno.kernels.triton.activation import swiglu_activation
    from torchinferno.kernels.triton.norm import add_rms_norm

    normed, h = add_rms_norm(x, residual, norm_weight, eps)
    shape = normed.shape
    rows = normed.reshape(-1, shape[-1])
    if epilogue == "auto":
        epilogue = "fused" if FUSED_ROWS[0] <= rows.shape[0] <= FUSED_ROWS[1] else "separate"
    if epilogue == "fused":
        act = matmul_swiglu(rows, gate_up_weight, config)
    elif epilogue == "separate":
        act = swiglu_activation(torch.nn.functional.linear(rows, gate_up_weight))
    else:
        raise ValueError(f"unknown epilogue {epilogue!r}; valid: fused, separate, auto")
    return act.view(*shape[:-1], act.shape[-1]), h
