"""Paged decode attention (one query per sequence), split-K / flash-decoding style, GQA-grouped.

Layout: ``q [B, H, D]``, caches ``[num_blocks, page, Hkv, D]`` (``Dv`` for values),
``block_tables [B, max_blocks]`` int32, ``seq_lens [B]`` int32 -> ``out [B, H, Dv]``.

Stage 1 runs one program per (sequence, kv head, split). A program loads the ``G = H / Hkv``
query heads that share its kv head as one ``[G_pad, D]`` tile (so every K/V byte is read once
per kv head, not once per query head) and walks its split of the context in ``BLOCK_N``-token
tiles, looking each token's page up in the block table. With ``num_splits == 1`` it writes the
normalized output directly; otherwise it writes each split's normalized partial output and
base-2 log-sum-exp, and stage 2 merges the splits per (sequence, head).

The split count is a launch constant derived from static shapes (the block table's width, the
batch and the kv head count), never from the seq_lens values, so a decode step stays
capturable in a CUDA graph: splits past a short sequence's end write ``lse = -inf`` and are
ignored by the merge. With the in-kernel merge (``merge_counters``) the last active split program
of a (sequence, kv head) merges the partials instead of a second kernel, and splits past the end
return at once (the merging program counts and reads only the ``ceil(seq_len / per_split)`` active ones).

FP8 caches (``kernels.kv_dtype``): tiles are upcast in registers and both dots run in fp16 with
fp32 accumulation (q converted once per program, clamped to fp16's range). e4m3 values are exact
in fp16, and fp16 keeps more mantissa than bf16 for q and the probabilities, so this is at least
as accurate as a bf16 dot; the e4m3 -> fp16 conversion is a single instruction per pair, which
keeps the kernel memory-bound (an upcast to bf16 made it ALU-bound and slower than a bf16 cache).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from torchinferno.kernels.kv_dtype import is_fp8
from torchinferno.kernels.triton import device_sms, next_pow2
from torchinferno.kernels.triton.decode_gemv import pdl_kwargs

LOG2E = 1.4426950408889634


@triton.jit
def _load_kv_tile(KC, VC, BT, b, kvh, toks, tm, d, dm, dv, dvm, stride_bt, stride_kb, stride_kt, stride_kh,
                  stride_vb, stride_vt, stride_vh, PAGE: tl.constexpr, CACHED: tl.constexpr, DOT_TY: tl.constexpr):
    """K ``[BLOCK_N, D_PAD]`` and V ``[BLOCK_N, DV_PAD]`` of tokens ``toks`` (rows off ``tm`` read as 0), as stored,
    converted to the dots' dtype ``DOT_TY`` at once (FP8 tiles are never carried further as FP8).

    ``CACHED=False`` reads around L1 (``.cg``): for loads issued before a PDL wait, which must not see
    lines an earlier kernel left in this SM's L1.
    """
    cm: tl.constexpr = "" if CACHED else ".cg"
    page = tl.load(BT + b * stride_bt + toks // PAGE, mask=tm, other=0, cache_modifier=cm).to(tl.int64)
    row = toks % PAGE
    k_base = page * stride_kb + row * stride_kt + kvh * stride_kh  # [BLOCK_N] token row starts
    v_base = page * stride_vb + row * stride_vt + kvh * stride_vh
    k = tl.load(KC + k_base[:, None] + d[None, :], mask=tm[:, None] & dm[None, :], other=0.0, cache_modifier=cm)
    v = tl.load(VC + v_base[:, None] + dv[None, :], mask=tm[:, None] & dvm[None, :], other=0.0, cache_modifier=cm)
    return k.to(DOT_TY), v.to(DOT_TY)


@triton.jit
def _tile_before_wait(KC, VC, BT, b, kvh, toks, end, seq_len, d, dm, dv, dvm, stride_bt, stride_kb, stride_kt,
                      stride_kh, stride_vb, stride_vt, stride_vh, PAGE: tl.constexpr, PDL: tl.constexpr,
                      DOT_TY: tl.constexpr):
    """A tile the program may read before its PDL wait: every row but the newest (``seq_len - 1``), which the
    previous kernel may still be writing (zeros there until :func:`_add_newest_row`). ``(k, v, token mask)``."""
    tm = toks < end
    old = tm & (toks < seq_len - 1) if PDL else tm
    k, v = _load_kv_tile(KC, VC, BT, b, kvh, toks, old, d, dm, dv, dvm, stride_bt, stride_kb, stride_kt, stride_kh,
                         stride_vb, stride_vt, stride_vh, PAGE, not PDL, DOT_TY)
    return k, v, tm


@triton.jit
def _add_newest_row(k, v, KC, VC, BT, b, kvh, toks, tm, seq_len, d, dm, dv, dvm, stride_bt, stride_kb, stride_kt,
                    stride_kh, stride_vb, stride_vt, stride_vh, PAGE: tl.constexpr, DOT_TY: tl.constexpr):
    """After the wait: the newest row added into a tile from :func:`_tile_before_wait` (exact: the row held zeros)."""
    newest = tm & (toks == seq_len - 1)
    k_new, v_new = _load_kv_tile(KC, VC, BT, b, kvh, toks, newest, d, dm, dv, dvm, stride_bt, stride_kb, stride_kt,
                                 stride_kh, stride_vb, stride_vt, stride_vh, PAGE, True, DOT_TY)
    return k + k_new, v + v_new


@triton.jit
def _attend_tile(q, k, v, tm, m_i, l_i, acc, qk_scale, IEEE: tl.constexpr):
    """One online-softmax step over a K/V tile (in q's dtype): the updated ``(m_i, l_i, acc)``."""
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    return online_softmax_step(s, v, tm, m_i, l_i, acc, qk_scale, IEEE)


@triton.jit
def split_key_scores(q_a, k_a, q_b, k_b, IEEE: tl.constexpr):
    """``q_a @ k_a^T + q_b @ k_b^T`` (fp32 accumulate; ieee dots with ``IEEE``): scores of keys stored in two parts
    (MLA: the latent / per-head dims and the rope dims). Shared by the MLA decode and prefill kernels."""
    if IEEE:
        s = tl.dot(q_a, tl.trans(k_a), input_precision="ieee")
        s += tl.dot(q_b, tl.trans(k_b), input_precision="ieee")
    else:
        s = tl.dot(q_a, tl.trans(k_a))
        s += tl.dot(q_b, tl.trans(k_b))
    return s


@triton.jit
def online_softmax_step(s, v, tm, m_i, l_i, acc, qk_scale, IEEE: tl.constexpr):
    """Scores ``s [ROWS, BLOCK_N]`` (fp32 dot products; tokens off ``tm`` masked) of a value tile ``v [BLOCK_N, DV]``
    folded into the running max ``m_i``, sum ``l_i`` and output ``acc`` (base 2): the updated triple. An all-masked
    tile adds nothing. Shared by the GQA and MLA decode kernels."""
    s = tl.where(tm[None, :], s * qk_scale, float("-inf"))  # [ROWS, BLOCK_N], log2 domain
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # an all-masked tile (empty split) adds nothing
    p = tl.exp2(s - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def finish_split(acc, m_i, l_i, OUT, OP, LSE, cnt_ptr, b, heads, gm, dv, dvm, split, n_active, stride_ob, stride_oh,
                 stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, NUM_SPLITS: tl.constexpr, MERGE: tl.constexpr,
                 ROWS_PAD: tl.constexpr, DV_PAD: tl.constexpr):
    """The end of a split-K decode program over query rows ``heads`` (``gm`` valid) of sequence ``b``: one split
    writes the normalized output; otherwise the split's normalized partial and base-2 log-sum-exp (``-inf`` for a
    split without tokens), and with ``MERGE`` the last of the ``n_active`` splits to finish (counted at
    ``cnt_ptr``, left zero again) merges them into ``OUT``. Shared by the GQA and MLA decode kernels."""
    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(OUT + b * stride_ob + heads[:, None] * stride_oh + dv[None, :], out.to(OUT.dtype.element_ty),
                 mask=gm[:, None] & dvm[None, :])
    else:
        empty = l_i == 0  # this split holds no token of the sequence
        out = acc / tl.where(empty, 1.0, l_i)[:, None]
        lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        tl.store(OP + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps + dv[None, :], out,
                 mask=gm[:, None] & dvm[None, :])
        tl.store(LSE + b * stride_lb + heads * stride_lh + split, lse, mask=gm)
        if MERGE:  # the last active split program of this (sequence, head group) to finish merges (no stage 2)
            tl.debug_barrier()  # every thread's partial stores precede the release below
            done = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
            if done == n_active - 1:
                # Unrolled over every split (the loads of a dynamic loop would wait one by one); the
                # inactive ones are masked off and read nothing.
                m = tl.full([ROWS_PAD], float("-inf"), tl.float32)
                for s_ in tl.static_range(NUM_SPLITS):
                    m = tl.maximum(m, tl.load(LSE + b * stride_lb + heads * stride_lh + s_,
                                              mask=gm & (s_ < n_active), other=float("-inf"), cache_modifier=".cg"))
                o_acc = tl.zeros([ROWS_PAD, DV_PAD], tl.float32)
                w_sum = tl.zeros([ROWS_PAD], tl.float32)
                for s_ in tl.static_range(NUM_SPLITS):
                    on = s_ < n_active
                    ls = tl.load(LSE + b * stride_lb + heads * stride_lh + s_, mask=gm & on, other=float("-inf"),
                                 cache_modifier=".cg")
                    w = tl.where(ls == float("-inf"), 0.0, tl.exp2(ls - m))
                    o_s = tl.load(OP + b * stride_pb + heads[:, None] * stride_ph + s_ * stride_ps + dv[None, :],
                                  mask=(gm & on)[:, None] & dvm[None, :], other=0.0, cache_modifier=".cg")
                    o_acc += o_s * w[:, None]
                    w_sum += w
                out = o_acc / tl.maximum(w_sum, 1e-30)[:, None]
                tl.store(OUT + b * stride_ob + heads[:, None] * stride_oh + dv[None, :],
                         out.to(OUT.dtype.element_ty), mask=gm[:, None] & dvm[None, :])
                tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")  # ready for the next call (ordered)


@triton.jit(do_not_specialize=["stride_bt"])  # the block table's width changes per step (see prefill_attention)
def _decode_stage1(Q, KC, VC, BT, SEQ, OUT, OP, LSE, CNT, qk_scale,
                   stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
                   stride_bt, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
                   GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
                   DV: tl.constexpr, DV_PAD: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                   NUM_SPLITS: tl.constexpr, IEEE: tl.constexpr, F16_DOT: tl.constexpr,
                   PDL: tl.constexpr = False, MERGE: tl.constexpr = False):
    if PDL:  # the next kernel (a PDL GEMV) may launch now and prefetch its weights
        gdc_launch_dependents()
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    # With PDL this runs before the wait: lengths and block tables are step inputs, written before the
    # step's first (non-PDL) kernel, so no kernel that may still be running writes them.
    seq_len = tl.load(SEQ + b, cache_modifier=".cg")
    per_split = tl.maximum(tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N, BLOCK_N)
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)
    n_active = tl.maximum(tl.cdiv(seq_len, per_split), 1)  # splits that hold tokens (split 0 always counts)

    # With the in-kernel merge, splits past the sequence's end do nothing: the merging program only
    # counts and reads the active ones. (With stage 2 every split writes, empty ones lse = -inf.)
    if (not MERGE) or split < n_active:
        g = tl.arange(0, GROUP_PAD)
        heads = kvh * GROUP + g
        gm = g < GROUP
        d = tl.arange(0, D_PAD)
        dm = d < D
        dv = tl.arange(0, DV_PAD)
        dvm = dv < DV
        n_offs = tl.arange(0, BLOCK_N)
        # FP8 cache: tiles and q go to fp16 (e4m3 -> fp16 is one exact cvt per pair; -> bf16 costs several ALU
        # ops per element); otherwise the dots run in q's dtype.
        dot_ty: tl.constexpr = tl.float16 if F16_DOT else Q.dtype.element_ty

        # The split's first tile. With PDL it is read before the wait, except the row of the newest token
        # (position seq_len - 1), which the previous kernel (the qkv GEMV) may be writing now: that row is read
        # after the wait and added in. (A second tile before the wait was slower on an H200: run 24.)
        toks = start + n_offs
        k, v, tm = _tile_before_wait(KC, VC, BT, b, kvh, toks, end, seq_len, d, dm, dv, dvm, stride_bt, stride_kb,
                                     stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, PAGE, PDL, dot_ty)
        if PDL:
            gdc_wait()  # q and the newest K/V row are the previous kernel's output
        q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=gm[:, None] & dm[None, :],
                    other=0.0)
        if F16_DOT:  # clamped to fp16's range
            q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
        if PDL:
            k, v = _add_newest_row(k, v, KC, VC, BT, b, kvh, toks, tm, seq_len, d, dm, dv, dvm, stride_bt, stride_kb,
                                   stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, PAGE, dot_ty)

        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, DV_PAD], tl.float32)
        m_i, l_i, acc = _attend_tile(q, k, v, tm, m_i, l_i, acc, qk_scale, IEEE)
        for n0 in range(start + BLOCK_N, end, BLOCK_N):
            toks = n0 + n_offs
            tm = toks < end
            k, v = _load_kv_tile(KC, VC, BT, b, kvh, toks, tm, d, dm, dv, dvm, stride_bt, stride_kb, stride_kt,
                                 stride_kh, stride_vb, stride_vt, stride_vh, PAGE, True, dot_ty)
            m_i, l_i, acc = _attend_tile(q, k, v, tm, m_i, l_i, acc, qk_scale, IEEE)

        finish_split(acc, m_i, l_i, OUT, OP, LSE, CNT + b * tl.num_programs(1) + kvh, b, heads, gm, dv, dvm, split,
                     n_active, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
                     NUM_SPLITS, MERGE, GROUP_PAD, DV_PAD)


@triton.jit
def _decode_stage2(OP, LSE, OUT, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
                   DV: tl.constexpr, DV_PAD: tl.constexpr, NUM_SPLITS: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:
        gdc_wait()
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, NUM_SPLITS)
    dv = tl.arange(0, DV_PAD)
    dvm = dv < DV
    base = b * stride_pb + h * stride_ph
    lse = tl.load(LSE + b * stride_lb + h * stride_lh + s)  # [S]
    m = tl.max(lse, 0)
    w = tl.where(lse == float("-inf"), 0.0, tl.exp2(lse - m))
    o = tl.load(OP + base + s[:, None] * stride_ps + dv[None, :], mask=dvm[None, :], other=0.0)  # [S, DV_PAD]
    out = tl.sum(o * w[:, None], 0) / tl.maximum(tl.sum(w, 0), 1e-30)
    tl.store(OUT + b * stride_ob + h * stride_oh + dv, out.to(OUT.dtype.element_ty), mask=dvm)


def choose_num_splits(batch: int, num_kv_heads: int, max_context: int, device: torch.device,
                      min_split_tokens: int = 256, waves: int = 2) -> int:
    """Splits so that (batch x kv heads x splits) programs fill about ``waves`` waves of SMs.

    A split never covers fewer than ``min_split_tokens`` tokens (256 by default: below that a separate
    merge kernel costs more than it saves; with the in-kernel merge, smaller splits pay off at batch 1).
    Powers of two only, so few kernel variants get compiled. Depends on shapes alone.
    """
    sms = device_sms(device)
    programs = max(1, batch * num_kv_heads)
    want = math.ceil(waves * sms / programs)
    cap = max(1, max_context // min_split_tokens)
    n = max(1, min(want, cap, 64))
    return 1 << (n.bit_length() - 1)


def batched_paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                   block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                                   num_splits: int | None = None, out: torch.Tensor | None = None,
                                   config: dict | None = None, pdl: bool = False,
                                   merge_counters: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, D] -> [B, H, Dv]; attends to ``seq_lens[b]`` cached tokens of row ``b``.

    ``pdl``: launch both stages with programmatic dependent launch (Hopper+), for chains of PDL kernels such
    as ``models/llama3/cuda_decode``. Stage 1 reads the lengths, the block tables and its first K/V tile
    *before* waiting for the previous kernel, all but the newest row (``seq_len - 1``), which it reads after
    the wait. Precondition: q and that newest row may come from the immediately preceding kernel; the
    other cached rows, the lengths and the block tables were written before the chain's first non-PDL kernel
    (a decode step's inputs and earlier steps' K/V are).
    ``merge_counters``: int32 zeros, at least ``B * Hkv``, owned by the caller and reused across calls (left
    zero): with splits, the last program of each (sequence, kv head) to finish merges the splits itself
    (counted by an atomic), so there is no second kernel.

    ``config`` overrides the launch tiling (``block_n``, ``num_warps``, ``num_stages``) for sweeps, and
    ``fp8_dot`` (``fp16``: default, or ``bf16``): the dtype an FP8 cache's tiles are upcast to.
    """
    B, H, D = q.shape
    _, page, Hkv, Dk = k_cache.shape
    DV = v_cache.shape[-1]
    assert Dk == D and H % Hkv == 0, (q.shape, k_cache.shape)
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and q.stride(-1) == 1
    group = H // Hkv
    if num_splits is None:
        num_splits = choose_num_splits(B, Hkv, block_tables.shape[1] * page, q.device)
    if out is None:
        out = torch.empty((B, H, DV), dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    d_pad, dv_pad = next_pow2(D), next_pow2(DV)
    block_n = 64 if max(d_pad, dv_pad) <= 128 else (32 if max(d_pad, dv_pad) <= 256 else 16)
    if is_fp8(k_cache.dtype):  # rows half as wide: twice the tokens per tile keeps the bytes per iteration
        block_n *= 2
    cfg = {"block_n": block_n, "num_warps": 4, "num_stages": 2, **(config or {})}
    ieee = q.dtype == torch.float32
    f16_dot = is_fp8(k_cache.dtype) and not ieee and cfg.get("fp8_dot", "fp16") == "fp16"
    if num_splits > 1:
        op = torch.empty((B, H, num_splits, DV), dtype=torch.float32, device=q.device)
        lse = torch.empty((B, H, num_splits), dtype=torch.float32, device=q.device)
    else:
        op = lse = out  # unused
    s_pb, s_ph, s_ps = (op.stride(0), op.stride(1), op.stride(2)) if num_splits > 1 else (0, 0, 0)
    s_lb, s_lh = (lse.stride(0), lse.stride(1)) if num_splits > 1 else (0, 0)
    pdl_kw = pdl_kwargs(pdl)
    merge = merge_counters is not None and num_splits > 1
    if merge:
        assert merge_counters.dtype == torch.int32 and merge_counters.numel() >= B * Hkv
    _decode_stage1[(B, Hkv, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, out, op, lse, merge_counters if merge else seq_lens, scale * LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1), s_pb, s_ph, s_ps, s_lb, s_lh,
        GROUP=group, GROUP_PAD=max(16, next_pow2(group)), D=D, D_PAD=d_pad, DV=DV, DV_PAD=dv_pad, PAGE=page,
        BLOCK_N=cfg["block_n"], NUM_SPLITS=num_splits, IEEE=ieee, F16_DOT=f16_dot,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], MERGE=merge, **pdl_kw)
    if num_splits > 1 and not merge:
        _decode_stage2[(B, H)](op, lse, out, s_pb, s_ph, s_ps, s_lb, s_lh, out.stride(0), out.stride(1),
                               DV=DV, DV_PAD=dv_pad, NUM_SPLITS=num_splits, num_warps=4, **pdl_kw)
    return out
