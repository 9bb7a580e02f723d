"""Lightning-indexer scores without the [Q, Hi, S] logits (dispatch and reference: ``kernels.indexer_scores``).

``out[b, q, s] = sum_{h = 0..Hi-1} w[b, q, h] * (ReLU(q[b, q, h, :] . k[b, s, :]) * scale)`` in fp32, and ``-inf``
where ``s >= limit[b, q]`` when limits are given. One program per (query tile, key tile, batch row): the key tile
[BD, BS] is loaded once, the loop over heads runs in order 0..Hi-1, each head one ``tl.dot`` of the query tile
[BQ, BD] with it (fp32 inputs: IEEE fp32, never TF32; fp16/bf16: exact products, fp32 accumulate), ReLU, scale,
weight, accumulate. Key tiles wholly past every limit of their query tile only write -inf. ``PAGED``: keys are read
from a paged cache ``[N, PAGE, D]`` through a block table (key ``s`` of row ``b`` at ``table[b, s // PAGE] * PAGE +
s % PAGE``; V3.2 decode over its ``index_k`` cache, no gathered copy); the same values, so the same scores.

Invariant: each element depends only on its own query row, key row and weights (the tiles are fixed by the
config, never by Q or S), so a query's scores do not depend on the query tile it lands in nor on the length of
the batch: a chunked prefill, a prefix hit and the full pass give bitwise the same scores on one device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.triton import next_pow2

# fixed tiles (never chosen from Q or S: see the invariant above); BLOCK_D is next_pow2(D), at least 16
DEFAULT_CONFIG = {
    "fp32": {"BLOCK_Q": 32, "BLOCK_S": 64, "num_warps": 4, "num_stages": 2},
    "half": {"BLOCK_Q": 64, "BLOCK_S": 128, "num_warps": 8, "num_stages": 2},
}


@triton.jit
def _indexer_scores_kernel(
    q_ptr, k_ptr, w_ptr, lim_ptr, out_ptr, tab_ptr,
    Q, S, HI, D, scale,
    sq_b, sq_q, sq_h, sk_b, sk_s, sw_b, sw_q, sl_b, so_b, so_q, st_b,
    HAS_LIMIT: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGED: tl.constexpr = False, PAGE: tl.constexpr = 1,
):
    pid_q = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    q_ok = offs_q < Q
    s_ok = offs_s < S
    out_ptrs = out_ptr + b * so_b + offs_q[:, None].to(tl.int64) * so_q + offs_s[None, :]
    out_ok = q_ok[:, None] & s_ok[None, :]
    d_ok = offs_d < D
    if HAS_LIMIT:
        lim = tl.load(lim_ptr + b * sl_b + offs_q, mask=q_ok, other=0)
        lim_max = tl.max(lim, axis=0)
    else:
        lim_max = S
    if pid_s * BLOCK_S >= lim_max:  # no key of this tile is visible to any query of the tile
        tl.store(out_ptrs, tl.full((BLOCK_Q, BLOCK_S), float("-inf"), tl.float32), mask=out_ok)
    else:
        if PAGED:  # table entries past every limit are not read (block 0 instead; those keys score -inf)
            blk = tl.load(tab_ptr + b * st_b + offs_s // PAGE, mask=s_ok & (offs_s < lim_max), other=0)
            k_rows = tl.maximum(blk.to(tl.int64), 0) * PAGE + offs_s % PAGE
            k_base = k_ptr
        else:
            k_rows = offs_s.to(tl.int64)
            k_base = k_ptr + b * sk_b
        kt = tl.load(k_base + k_rows[None, :] * sk_s + offs_d[:, None],
                     mask=s_ok[None, :] & d_ok[:, None], other=0.0)  # [BD, BS]
        q_ptrs = q_ptr + b * sq_b + offs_q[:, None].to(tl.int64) * sq_q + offs_d[None, :]
        w_ptrs = w_ptr + b * sw_b + offs_q.to(tl.int64) * sw_q
        qd_ok = q_ok[:, None] & d_ok[None, :]
        acc = tl.zeros((BLOCK_Q, BLOCK_S), dtype=tl.float32)
        for h in range(HI):  # heads in order, as the torch reference sums them
            qt = tl.load(q_ptrs + h * sq_h, mask=qd_ok, other=0.0)  # [BQ, BD]
            if IEEE:
                dot = tl.dot(qt, kt, input_precision="ieee", out_dtype=tl.float32)
            else:
                dot = tl.dot(qt, kt, out_dtype=tl.float32)  # fp16/bf16: exact products, fp32 accumulate
            wh = tl.load(w_ptrs + h, mask=q_ok, other=0.0).to(tl.float32)  # [BQ]
            acc += (tl.maximum(dot, 0.0) * scale) * wh[:, None]
        if HAS_LIMIT:
            acc = tl.where(offs_s[None, :] < lim[:, None], acc, float("-inf"))
        tl.store(out_ptrs, acc, mask=out_ok)


def indexer_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, scale: float = 1.0,
                   limits: torch.Tensor | None = None, config: dict | None = None,
                   block_tables: torch.Tensor | None = None, num_keys: int | None = None) -> torch.Tensor:
    """q [B, Q, Hi, D], k [B, S, D] (same dtype: fp32, fp16 or bf16), w [B, Q, Hi] (any float), limits [B, Q] int or
    None -> [B, Q, S] fp32. With ``block_tables`` [B, nb] int: k is a paged cache [N, page, D] (unit stride in D,
    ``stride(0) == page * stride(1)``) and ``S = num_keys`` (<= nb * page). No host sync (CUDA-graph capturable)."""
    B, Q, HI, D = q.shape
    paged = block_tables is not None
    S = int(num_keys) if paged else k.shape[1]
    if paged and (k.stride(-1) != 1 or k.stride(0) != k.shape[1] * k.stride(1)):
        raise ValueError(f"indexer_scores: paged cache {tuple(k.shape)} strides {k.stride()} are not row-flat")
    out = torch.empty((B, Q, S), device=q.device, dtype=torch.float32)
    if Q == 0 or S == 0 or B == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 or paged else k.contiguous()
    w = w if w.stride(-1) == 1 else w.contiguous()
    ieee = q.dtype == torch.float32
    cfg = {**DEFAULT_CONFIG["fp32" if ieee else "half"], **(config or {})}
    has_lim = limits is not None
    lim = limits if has_lim else out  # dummy pointer, never read
    sl_b = limits.stride(0) if has_lim else 0
    if has_lim and limits.stride(-1) != 1:
        lim = limits.contiguous()
        sl_b = lim.stride(0)
    BQ, BS = cfg["BLOCK_Q"], cfg["BLOCK_S"]
    grid = (triton.cdiv(Q, BQ), triton.cdiv(S, BS), B)
    _indexer_scores_kernel[grid](
        q, k, w, lim, out, block_tables if paged else out,
        Q, S, HI, D, float(scale),
        q.stride(0), q.stride(1), q.stride(2), 0 if paged else k.stride(0), k.stride(1), w.stride(0), w.stride(1), sl_b,
        out.stride(0), out.stride(1), block_tables.stride(0) if paged else 0,
        HAS_LIMIT=has_lim, IEEE=ieee, BLOCK_Q=BQ, BLOCK_S=BS, BLOCK_D=max(16, next_pow2(D)),
        PAGED=paged, PAGE=k.shape[1] if paged else 1,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return out
