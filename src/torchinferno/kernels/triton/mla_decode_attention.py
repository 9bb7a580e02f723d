"""Absorbed MLA decode attention over the paged latent cache: one shared latent row per token, keys split in two.

With W_UK folded into the query every head of a request attends over the same cache rows ``[c_kv | k_pe]``
(``R + r`` = 512 + 64 at DeepSeek's shape); the values are ``c_kv``, the first ``R`` of the same row. The GQA
kernel (``kernels.triton.decode_attention``) runs this as one 576-wide key head padded to 1024 plus a separate
512-wide value tile of the same bytes. Here a program reads each row once, as a ``[BLOCK_N, R]`` ``c_kv`` tile and a
``[BLOCK_N, r]`` ``k_pe`` tile:

    s   = q_lat @ c_kv^T + q_pe @ k_pe^T          # [BLOCK_H, BLOCK_N], two dots, no padding past R + r
    acc = acc * alpha + p @ c_kv                  # [BLOCK_H, R], the key tile reused as the value tile

Layout: ``q [B, H, R + r]`` (latent query then rope dims; any strides with unit last), ``cache [N, page, R + r]``,
``block_tables [B, max_blocks]`` int32, ``seq_lens [B]`` int32 (>= 1) -> ``out [B, H, R]``. Grid
``(B, cdiv(H, BLOCK_H), splits)``: a program owns ``BLOCK_H`` heads of one sequence and one split of its rows;
splits (a launch constant from shapes, CUDA-graph safe) end as the GQA kernel's do (``finish_split``: the in-kernel
merge with ``merge_counters``, else its stage 2). FP8 caches: tiles and q go to fp16 for the dots (exact for e4m3),
fp32 accumulation. Reference: ``models.common.mla.mla_absorbed_attention`` (tests/kernels/mla_decode_checks.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.kv_dtype import is_fp8
from torchinferno.kernels.triton import device_sms, next_pow2
from torchinferno.kernels.triton.decode_attention import (
    LOG2E,
    _decode_stage2,
    finish_split,
    online_softmax_step,
    split_key_scores,
)
from torchinferno.kernels.triton.decode_gemv import _wait_for_previous_kernel, pdl_kwargs

BLOCK_H = 16  # heads per program (V2-Lite: all 16; V3's 128: 8 programs per sequence and split)


def default_config(programs: int, sms: int, fp32: bool) -> dict:
    """Tiles for a launch of ``programs`` (sequences x head blocks x splits) on ``sms`` SMs, from the H100 sweep of
    run 51 (benchmarks/probe_ds_prefill.py mla; 16 heads, 576 / 512, bf16): while the programs fit one wave, 64-row
    tiles over 8 warps (batch 1, ctx 4096: 26.3 us against 32.5 with 32 rows); past one wave, 32 rows over 4 warps, two
    programs an SM (batch 64, ctx 4096, 4 splits: 123.8 against 142.5 us). fp32 (ieee dots: tests and references,
    not timed): 16-row tiles over 4 warps, 75 KB of shared memory for sm_90."""
    if fp32:
        return {"block_n": 16, "num_warps": 4, "num_stages": 2}
    if programs <= sms:
        return {"block_n": 64, "num_warps": 8, "num_stages": 2}
    return {"block_n": 32, "num_warps": 4, "num_stages": 2}


@triton.jit(do_not_specialize=["stride_bt"])  # the block table's width changes per step
def _mla_decode_stage1(Q, C, BT, SEQ, OUT, OP, LSE, CNT, qk_scale, H,
                       stride_qb, stride_qh, stride_cb, stride_ct, stride_bt, stride_ob, stride_oh,
                       stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
                       R: tl.constexpr, R_PAD: tl.constexpr, RP: tl.constexpr, RP_PAD: tl.constexpr,
                       BLOCK_H: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
                       IEEE: tl.constexpr, F16_DOT: tl.constexpr, MERGE: tl.constexpr, PDL: tl.constexpr = False):
    # PDL: wait before any access (the query comes from the previous kernel); a few programs at batch 1, so the
    # next kernel (the W_UV head GEMV) may launch now and prefetch its weights
    _wait_for_previous_kernel(PDL, True)
    b = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(SEQ + b)
    per_split = tl.maximum(tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N, BLOCK_N)
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)
    n_active = tl.maximum(tl.cdiv(seq_len, per_split), 1)  # splits that hold tokens (split 0 always counts)
    if (not MERGE) or split < n_active:  # with the in-kernel merge, splits past the end do nothing
        heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        hm = heads < H
        dr = tl.arange(0, R_PAD)
        drm = dr < R
        dp = tl.arange(0, RP_PAD)
        dpm = dp < RP
        dot_ty: tl.constexpr = tl.float16 if F16_DOT else Q.dtype.element_ty
        q_row = Q + b * stride_qb + heads[:, None] * stride_qh
        q_lat = tl.load(q_row + dr[None, :], mask=hm[:, None] & drm[None, :], other=0.0)  # [BLOCK_H, R_PAD]
        q_pe = tl.load(q_row + R + dp[None, :], mask=hm[:, None] & dpm[None, :], other=0.0)  # [BLOCK_H, RP_PAD]
        if F16_DOT:  # clamped to fp16's range
            q_lat = tl.clamp(q_lat.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
            q_pe = tl.clamp(q_pe.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
        n_offs = tl.arange(0, BLOCK_N)
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, R_PAD], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            toks = n0 + n_offs
            tm = toks < end
            page = tl.load(BT + b * stride_bt + toks // PAGE, mask=tm, other=0).to(tl.int64)
            row = C + page * stride_cb + (toks % PAGE) * stride_ct  # [BLOCK_N] row starts
            ckv = tl.load(row[:, None] + dr[None, :], mask=tm[:, None] & drm[None, :], other=0.0).to(dot_ty)
            kpe = tl.load(row[:, None] + R + dp[None, :], mask=tm[:, None] & dpm[None, :], other=0.0).to(dot_ty)
            s = split_key_scores(q_lat, ckv, q_pe, kpe, IEEE)
            m_i, l_i, acc = online_softmax_step(s, ckv, tm, m_i, l_i, acc, qk_scale, IEEE)  # c_kv: the values
        finish_split(acc, m_i, l_i, OUT, OP, LSE, CNT + b * tl.num_programs(1) + hb, b, heads, hm, dr, drm, split,
                     n_active, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
                     NUM_SPLITS, MERGE, BLOCK_H, R_PAD)


def mla_paged_decode_attention(q: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor,
                               seq_lens: torch.Tensor, scale: float, rope_dims: int, num_splits: int,
                               out: torch.Tensor | None = None, merge_counters: torch.Tensor | None = None,
                               config: dict | None = None, pdl: bool = False) -> torch.Tensor:
    """q [B, H, R + r] -> out [B, H, R]: softmax(q . row * scale) over the first ``seq_lens[b]`` latent rows of
    sequence ``b`` (``cache [N, page, R + r]``, ``r = rope_dims``), weighting each row's ``c_kv`` (its first R).

    ``num_splits``: splits of each sequence's rows (a launch constant; shapes only). ``merge_counters``: int32
    zeros, at least ``B * cdiv(H, BLOCK_H)``, reused across calls (left zero): the last split program merges, no
    second kernel. ``config`` overrides :func:`default_config`'s tiles (``block_n``, ``num_warps``,
    ``num_stages``). ``pdl``: the attention launch with programmatic dependent launch (Hopper; CUDA only; a
    second-stage merge, without ``merge_counters``, launches plainly)."""
    B, H, W = q.shape
    _, page, Wc = cache.shape
    R = W - rope_dims
    assert Wc == W and R > 0 and q.stride(-1) == 1 and cache.stride(-1) == 1, (q.shape, cache.shape)
    if out is None:
        out = torch.empty((B, H, R), dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    hblocks = triton.cdiv(H, BLOCK_H)
    ieee = q.dtype == torch.float32
    cfg = {**default_config(B * hblocks * num_splits, device_sms(q.device), ieee), **(config or {})}
    f16_dot = is_fp8(cache.dtype) and not ieee
    r_pad = next_pow2(R)
    if num_splits > 1:
        op = torch.empty((B, H, num_splits, R), dtype=torch.float32, device=q.device)
        lse = torch.empty((B, H, num_splits), dtype=torch.float32, device=q.device)
        s_pb, s_ph, s_ps, s_lb, s_lh = op.stride(0), op.stride(1), op.stride(2), lse.stride(0), lse.stride(1)
    else:
        op = lse = out  # unused
        s_pb = s_ph = s_ps = s_lb = s_lh = 0
    merge = merge_counters is not None and num_splits > 1
    if merge:
        assert merge_counters.dtype == torch.int32 and merge_counters.numel() >= B * hblocks
    _mla_decode_stage1[(B, hblocks, num_splits)](
        q, cache, block_tables, seq_lens, out, op, lse, merge_counters if merge else seq_lens, scale * LOG2E, H,
        q.stride(0), q.stride(1), cache.stride(0), cache.stride(1), block_tables.stride(0), out.stride(0),
        out.stride(1), s_pb, s_ph, s_ps, s_lb, s_lh,
        R=R, R_PAD=r_pad, RP=rope_dims, RP_PAD=max(16, next_pow2(rope_dims)), BLOCK_H=BLOCK_H, PAGE=page,
        BLOCK_N=cfg["block_n"], NUM_SPLITS=num_splits, IEEE=ieee, F16_DOT=f16_dot, MERGE=merge,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl_kwargs(pdl))
    if num_splits > 1 and not merge:
        _decode_stage2[(B, H)](op, lse, out, s_pb, s_ph, s_ps, s_lb, s_lh, out.stride(0), out.stride(1),
                               DV=R, DV_PAD=r_pad, NUM_SPLITS=num_splits, num_warps=4)
    return out
