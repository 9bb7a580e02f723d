"""Paged prefill / extend attention over a flattened ragged batch, in one launch.

Why a Triton kernel here (and not FlexAttention or SDPA over gathered blocks): the engine's
steps mix prefill chunks that continue a cached context (chunked prefill, prefix-cache hits)
with fresh prompts, and each needs causal attention over its *paged* context plus its new
tokens. SDPA would need a gather copy of every context into a dense tensor and one call per
sequence (the torch reference does that); FlexAttention needs torch.compile per shape family
and a block mask rebuilt each step. This kernel reads K/V straight from the paged cache
through the block table, handles every sequence of the step in one launch and needs no host
work beyond the metadata the engine already builds. (A batch that is one fresh prompt with no
cache goes to SDPA's FlashAttention in ``attention_triton.py``: nothing to read from pages there
and the tuned kernel is faster.)

Layout: ``q [T, H, D]`` (tokens of all sequences concatenated, ``query_start_loc [B+1]``),
caches ``[num_blocks, page, Hkv, D]`` already holding the new tokens' K/V, ``seq_lens [B]``
(context + new), ``block_tables [B, max_blocks]`` -> ``out [T, H, Dv]``. Query token ``j`` of
sequence ``b`` sits at absolute position ``seq_lens[b] - qlen[b] + j`` and sees keys ``0..pos``.

Grid: (query tiles, kv heads). A tile is ``BLOCK_Q`` consecutive query tokens of one sequence
times the ``G`` query heads sharing a kv head (``BLOCK_M = BLOCK_Q * G_pad`` rows), so K/V tiles
are loaded once for the whole group. The program finds its sequence by binary search over
``query_start_loc`` (tile ``i`` of sequence ``b`` has index ``(qsl[b] - q_base) // BLOCK_Q + b +
i``), which bounds the grid by ``T / BLOCK_Q + B`` without host-side tile tables.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.kv_dtype import is_fp8
from torchinferno.kernels.triton import next_pow2

LOG2E = 1.4426950408889634


@triton.jit
def _attend_rows(Q, KC, VC, OUT, BT, b, kvh, q_start, qi, gi, rm, ctx, kv_end, qk_scale,
                 stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
                 stride_ot, stride_oh, stride_bt, BLOCK_M: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
                 D_PAD: tl.constexpr, DV: tl.constexpr, DV_PAD: tl.constexpr, PAGE: tl.constexpr,
                 BLOCK_N: tl.constexpr, IEEE: tl.constexpr, F16_DOT: tl.constexpr):
    """``BLOCK_M`` rows of sequence ``b``: row ``r`` is query ``qi[r]`` (absolute position ``ctx + qi[r]``) of query
    head ``kvh * GROUP + gi[r]`` (``rm[r]``: a real row), attending to its keys ``0..pos`` below ``kv_end``; the
    normalized output of the real rows is stored."""
    head = kvh * GROUP + gi
    tok = (q_start + qi).to(tl.int64)
    d = tl.arange(0, D_PAD)
    dv = tl.arange(0, DV_PAD)
    q = tl.load(Q + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=rm[:, None] & (d[None, :] < D), other=0.0)  # [BLOCK_M, D_PAD]
    if F16_DOT:  # FP8 cache: dots in fp16 (see decode_attention's docstring)
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    qpos = ctx + qi
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV_PAD], tl.float32)
    n_offs = tl.arange(0, BLOCK_N)
    bt_row = BT + b.to(tl.int64) * stride_bt
    for n0 in range(0, kv_end, BLOCK_N):
        toks = n0 + n_offs
        tm = toks < kv_end
        page = tl.load(bt_row + toks // PAGE, mask=tm, other=0).to(tl.int64)
        prow = toks % PAGE
        k_base = page * stride_kb + prow * stride_kt + kvh * stride_kh  # [BLOCK_N]
        v_base = page * stride_vb + prow * stride_vt + kvh * stride_vh
        k = tl.load(KC + k_base[:, None] + d[None, :], mask=tm[:, None] & (d[None, :] < D), other=0.0).to(q.dtype)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        keep = (toks[None, :] <= qpos[:, None]) & tm[None, :]
        s = tl.where(keep, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # padded rows see no key
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(VC + v_base[:, None] + dv[None, :], mask=tm[:, None] & (dv[None, :] < DV), other=0.0).to(q.dtype)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(OUT + tok[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :], out.to(OUT.dtype.element_ty),
             mask=rm[:, None] & (dv[None, :] < DV))


# The per-step integers (where the prefills start, how many sequences, the block table's width) are not
# specialized: Triton would otherwise compile a new variant whenever one of them is or stops being 1 or a multiple
# of 16, ~0.5-0.8 s each on the request path (H200 step log: 27 such stalls in one bench-serve run).
@triton.jit(do_not_specialize=["first_seq", "num_seqs", "q_base", "stride_bt"])
def _prefill_kernel(Q, KC, VC, OUT, QSL, SEQ, BT, qk_scale, first_seq, num_seqs, q_base,
                    stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
                    stride_ot, stride_oh, stride_bt,
                    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
                    DV: tl.constexpr, DV_PAD: tl.constexpr, PAGE: tl.constexpr, BLOCK_Q: tl.constexpr,
                    BLOCK_N: tl.constexpr, IEEE: tl.constexpr, F16_DOT: tl.constexpr, DECODE_M: tl.constexpr = 0):
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    # Binary search: the last sequence b in [first_seq, num_seqs) whose first tile index <= pid.
    lo = first_seq
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = (tl.load(QSL + mid) - q_base) // BLOCK_Q + (mid - first_seq)
        if first_tile <= pid:
            lo = mid + 1
        else:
            hi = mid
    b = lo - 1
    q_start = tl.load(QSL + b)
    q_len = tl.load(QSL + b + 1) - q_start
    tile = pid - ((q_start - q_base) // BLOCK_Q + (b - first_seq))
    if tile * BLOCK_Q < q_len:
        seq_len = tl.load(SEQ + b)
        ctx = seq_len - q_len
        BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
        r = tl.arange(0, BLOCK_M)
        qi = tile * BLOCK_Q + r // GROUP_PAD  # query index within the sequence
        gi = r % GROUP_PAD
        rm = (qi < q_len) & (gi < GROUP)
        kv_end = tl.minimum(seq_len, ctx + (tile + 1) * BLOCK_Q)
        if DECODE_M > 0:  # a one-token query on DECODE_M rows (its GROUP heads) instead of a BLOCK_M-row tile
            if q_len == 1:
                rd = tl.arange(0, DECODE_M)
                _attend_rows(Q, KC, VC, OUT, BT, b, kvh, q_start, rd * 0, rd, rd < GROUP, ctx, seq_len, qk_scale,
                             stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
                             stride_ot, stride_oh, stride_bt, DECODE_M, GROUP, D, D_PAD, DV, DV_PAD, PAGE, BLOCK_N,
                             IEEE, F16_DOT)
            else:
                _attend_rows(Q, KC, VC, OUT, BT, b, kvh, q_start, qi, gi, rm, ctx, kv_end, qk_scale,
                             stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
                             stride_ot, stride_oh, stride_bt, BLOCK_M, GROUP, D, D_PAD, DV, DV_PAD, PAGE, BLOCK_N,
                             IEEE, F16_DOT)
        else:
            _attend_rows(Q, KC, VC, OUT, BT, b, kvh, q_start, qi, gi, rm, ctx, kv_end, qk_scale,
                         stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
                         stride_ot, stride_oh, stride_bt, BLOCK_M, GROUP, D, D_PAD, DV, DV_PAD, PAGE, BLOCK_N,
                         IEEE, F16_DOT)


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                            scale: float, num_tokens: int | None = None, first_seq: int = 0, q_base: int = 0,
                            out: torch.Tensor | None = None, decode_rows: bool = False) -> torch.Tensor:
    """Causal attention of sequences ``first_seq..B-1`` over their paged contexts.

    ``q_base`` must equal ``query_start_loc[first_seq]`` (known on the host); ``num_tokens`` is the
    number of query tokens those sequences hold (default: all of ``q`` after ``q_base``). Rows of
    ``out`` before ``q_base`` are left untouched, so a decode kernel can fill them. ``decode_rows``: a one-token
    sequence's program computes on ``max(16, G_pad)`` rows (its query heads) instead of a whole ``BLOCK_Q * G_pad``
    query tile (for steps whose decode rows this kernel takes: a graph-padded step, ``api.graph_padded_attention``).
    """
    T, H, D = q.shape
    _, page, Hkv, _ = k_cache.shape
    DV = v_cache.shape[-1]
    group = H // Hkv
    if out is None:
        out = torch.empty((T, H, DV), dtype=q.dtype, device=q.device)
    B = seq_lens.shape[0]
    n_tok = (T - q_base) if num_tokens is None else num_tokens
    if n_tok <= 0 or B <= first_seq:
        return out
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    g_pad = next_pow2(group)
    d_pad, dv_pad = next_pow2(D), next_pow2(DV)
    block_q = max(1, 64 // g_pad) if max(d_pad, dv_pad) > 128 else max(1, 128 // g_pad)
    if block_q * g_pad < 16:
        block_q = 16 // g_pad
    block_n = 64 if max(d_pad, dv_pad) <= 128 else 32
    grid = (n_tok // block_q + (B - first_seq), Hkv)
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, query_start_loc, seq_lens, block_tables, scale * LOG2E, first_seq, B, q_base,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1), block_tables.stride(0),
        GROUP=group, GROUP_PAD=g_pad, D=D, D_PAD=d_pad, DV=DV, DV_PAD=dv_pad, PAGE=page, BLOCK_Q=block_q,
        BLOCK_N=block_n, IEEE=q.dtype == torch.float32, F16_DOT=is_fp8(k_cache.dtype) and q.dtype != torch.float32,
        DECODE_M=max(16, g_pad) if decode_rows else 0, num_warps=8 if block_q * g_pad >= 128 else 4, num_stages=2)
    return out
