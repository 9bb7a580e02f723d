"""Sparse decode attention over one shared row set, with an optional per-head sink (DeepSeek-V4's decode attention,
and V3.2's DSA absorbed MLA decode over the indexer's selected latent rows).

One query token per sequence, ``H`` heads, all reading the same ``hd``-wide rows (K = V) from two paged caches:
the sliding window's rows of ``kv_cache`` and the selected compressed entries of ``ent_cache``, both given as
flat cache slots (``-1``: masked). Keys are the first ``DK`` dims of a row, values its first ``DV <= DK`` dims
(V4: ``DV == DK``, K = V; MLA absorbed: the 576-wide ``[c_kv | k_pe]`` row, values ``c_kv``, its first 512): the
dot runs as a ``BLOCK_D`` part (the value dims) plus a ``BLOCK_T`` tail (dims ``DV..DK-1``; none when equal).
Softmax over the valid rows plus, with sinks, the head's sink logit (a denominator term with no value). Online
softmax in fp32: the running max starts at the sink and the running sum at 1 (no sinks: a finite -1e30 and 0, the
sum guarded), so a sequence with no valid row gives 0 (as the torch reference) and no NaN.

Grid: (sequences, head blocks of ``BLOCK_H``, splits). Each program loops over ``BLOCK_N`` rows at a time, its
share of the window rows, then of the entries; ``tl.dot`` on [BLOCK_H, hd] x [hd, BLOCK_N]. With several splits
(few sequences: split-K so the SMs fill) each writes fp32 partials and a merge kernel combines them, the sink
counted once. Caches ``[N, bs, hd]`` must have unit stride in
the last dim and ``stride(0) == bs * stride(1)`` (a flat slot addresses its row). Tile configs are data
(:data:`DEFAULT_CONFIG`, or a tuned table loaded from prepared artifacts: ``kernels.v4_artifacts``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.triton import next_pow2

DEFAULT_CONFIG = {"BLOCK_H": 16, "BLOCK_N": 32, "num_warps": 4, "SPLITS": "auto"}
MAX_SPLITS = 16


NO_SINK = tl.constexpr(-1.0e30)  # the running max's start without a sink: finite, so an all-masked tile gives exp(-inf) = 0


@triton.jit
def _attend_rows(acc, m_i, l_i, q, qt, C, SLOTS, lo, hi, stride_row, offs_d, d_mask, offs_t, t_mask, DV, scale,
                 BLOCK_N: tl.constexpr, HAS_TAIL: tl.constexpr, PRECISION: tl.constexpr, ROUND_LOGITS: tl.constexpr):
    """Rows ``lo .. hi-1`` of one slot list into the running (acc, m_i, l_i). q [BLOCK_H, BLOCK_D] (value dims),
    qt [BLOCK_H, BLOCK_T] (key tail dims ``DV + offs_t``, with ``HAS_TAIL``). ``ROUND_LOGITS``: the logits rounded
    as the torch path makes them (q.k in q's dtype, then times ``scale`` in q's dtype) before the fp32 softmax."""
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        slot = tl.load(SLOTS + offs_n, mask=offs_n < hi, other=-1).to(tl.int64)
        valid = slot >= 0
        k = tl.load(C + slot[:, None] * stride_row + offs_d[None, :], mask=valid[:, None] & d_mask[None, :],
                    other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [BLOCK_H, BLOCK_N] fp32
        if HAS_TAIL:
            kt = tl.load(C + slot[:, None] * stride_row + DV + offs_t[None, :], mask=valid[:, None] & t_mask[None, :],
                         other=0.0).to(q.dtype)  # [BLOCK_N, BLOCK_T]
            s += tl.dot(qt, tl.trans(kt), input_precision=PRECISION)
        if ROUND_LOGITS:
            s = (s.to(q.dtype).to(tl.float32) * scale).to(q.dtype).to(tl.float32)
        else:
            s = s * scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k.dtype), k, input_precision=PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _sparse_sink_kernel(Q, KV, WIN, ENT_C, ENT, SINKS, OUT, PM, PL, n_win, n_ent, H, D, DK, stride_qb, stride_qh,
                        stride_kv, stride_ent, stride_wb, stride_eb, stride_ob, stride_oh, scale,
                        BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                        SPLITS: tl.constexpr, HAS_SINK: tl.constexpr, HAS_TAIL: tl.constexpr,
                        PRECISION: tl.constexpr, ROUND_LOGITS: tl.constexpr):
    """Program (b, head block, split): split ``s`` takes its share of the window rows and of the entries. One split:
    the normalized output into OUT [B, H, D]. Several: each split's unnormalized acc into OUT [B, H, SPLITS, D]
    (fp32) and its (max, sum) into PM / PL [B, H, SPLITS], every split counting the sink once (the merge takes the
    extra copies out). ``D``: the value dims (output width), ``DK``: the key dims (``D`` when ``not HAS_TAIL``)."""
    b = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_mask = offs_h < H
    d_mask = offs_d < D
    q = tl.load(Q + b * stride_qb + offs_h[:, None] * stride_qh + offs_d[None, :],
                mask=h_mask[:, None] & d_mask[None, :], other=0.0)
    offs_t = tl.arange(0, BLOCK_T)
    t_mask = offs_t < DK - D
    qt = tl.load(Q + b * stride_qb + offs_h[:, None] * stride_qh + D + offs_t[None, :],
                 mask=h_mask[:, None] & t_mask[None, :], other=0.0)  # [BLOCK_H, BLOCK_T]; unused without a tail
    if HAS_SINK:
        m_i = tl.load(SINKS + offs_h, mask=h_mask, other=0.0).to(tl.float32)  # the sink is the first "logit"
        l_i = tl.full([BLOCK_H], 1.0, tl.float32)
    else:
        m_i = tl.full([BLOCK_H], NO_SINK, tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    cw = tl.cdiv(n_win, SPLITS)
    ce = tl.cdiv(n_ent, SPLITS)
    acc, m_i, l_i = _attend_rows(acc, m_i, l_i, q, qt, KV, WIN + b * stride_wb, sp * cw,
                                 tl.minimum(sp * cw + cw, n_win), stride_kv, offs_d, d_mask, offs_t, t_mask, D, scale,
                                 BLOCK_N, HAS_TAIL, PRECISION, ROUND_LOGITS)
    acc, m_i, l_i = _attend_rows(acc, m_i, l_i, q, qt, ENT_C, ENT + b * stride_eb, sp * ce,
                                 tl.minimum(sp * ce + ce, n_ent), stride_ent, offs_d, d_mask, offs_t, t_mask, D, scale,
                                 BLOCK_N, HAS_TAIL, PRECISION, ROUND_LOGITS)
    hd_mask = h_mask[:, None] & d_mask[None, :]
    if SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # l_i == 0 only without a sink and no valid row
        tl.store(OUT + b * stride_ob + offs_h[:, None] * stride_oh + offs_d[None, :], out.to(OUT.dtype.element_ty),
                 mask=hd_mask)
    else:
        row = (b * H + offs_h) * SPLITS + sp  # [BLOCK_H] partial index
        tl.store(PM + row, m_i, mask=h_mask)
        tl.store(PL + row, l_i, mask=h_mask)
        tl.store(OUT + row[:, None] * D + offs_d[None, :], acc, mask=hd_mask)


@triton.jit
def _merge_kernel(PACC, PM, PL, SINKS, OUT, H, D, stride_ob, stride_oh, SPLITS: tl.constexpr,
                  BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, HAS_SINK: tl.constexpr):
    """Program (b, h): out = sum_s acc_s e^(m_s - M) / (sum_s l_s e^(m_s - M) - (SPLITS - 1) e^(sink - M))
    (without sinks the last term is absent; a zero denominator, no valid row at all, gives 0)."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < SPLITS
    base = (b * H + h) * SPLITS
    m = tl.load(PM + base + offs_s, mask=s_mask, other=float("-inf"))
    ls = tl.load(PL + base + offs_s, mask=s_mask, other=0.0)
    mx = tl.max(m, 0)
    w = tl.exp(m - mx)  # [BLOCK_S]; 0 for the padding
    denom = tl.sum(ls * w, 0)
    if HAS_SINK:
        sink = tl.load(SINKS + h).to(tl.float32)
        denom = denom - (SPLITS - 1) * tl.exp(sink - mx)
    denom = tl.where(denom > 0, denom, 1.0)
    acc = tl.load(PACC + (base + offs_s)[:, None] * D + offs_d[None, :],
                  mask=s_mask[:, None] & (offs_d[None, :] < D), other=0.0)
    out = tl.sum(acc * w[:, None], 0) / denom
    tl.store(OUT + b * stride_ob + h * stride_oh + offs_d, out.to(OUT.dtype.element_ty), mask=offs_d < D)


def _row_stride(cache: torch.Tensor) -> int:
    if cache.stride(-1) != 1 or cache.stride(0) != cache.shape[1] * cache.stride(1):
        raise ValueError(f"sparse_sink_decode: cache {tuple(cache.shape)} strides {cache.stride()} are not row-flat")
    return cache.stride(1)


def sparse_sink_decode(q: torch.Tensor, kv_cache: torch.Tensor, win_slots: torch.Tensor, ent_cache, ent_slots,
                       sinks: torch.Tensor | None, scale: float, config: dict | None = None,
                       round_logits: bool = False, dv: int | None = None) -> torch.Tensor:
    """q [B, H, hd]; kv_cache / ent_cache [N, bs, hd]; win_slots [B, W], ent_slots [B, K] int (-1 masked; ent may be
    None); sinks [H] or None -> out [B, H, dv] in q's dtype; ``dv`` (default ``hd``): values are each row's first
    ``dv`` dims. ``config``: BLOCK_H, BLOCK_N, num_warps, SPLITS. ``round_logits``: round each logit to q's dtype as
    the torch path does (prefill: ``kernels.sparse_sink_prefill``); off (decode), the logits stay fp32."""
    B, H, DK = q.shape
    D = DK if dv is None else int(dv)
    if not 0 < D <= DK:
        raise ValueError(f"sparse_sink_decode: dv={D} must be in 1..{DK}")
    cfg = {**DEFAULT_CONFIG, **(config or {})}
    if q.stride(-1) != 1:
        q = q.contiguous()
    if ent_cache is None or ent_slots is None or ent_slots.shape[-1] == 0:
        ent_cache, ent_slots = kv_cache, win_slots[:, :0]
    win_slots = win_slots if win_slots.stride(-1) == 1 else win_slots.contiguous()
    ent_slots = ent_slots if ent_slots.stride(-1) == 1 or ent_slots.shape[-1] == 0 else ent_slots.contiguous()
    out = torch.empty((B, H, D), dtype=q.dtype, device=q.device)
    has_sink = sinks is not None
    sinks = sinks if has_sink else q  # a dummy pointer, never read
    if B == 0:
        return out
    bh = min(int(cfg["BLOCK_H"]), max(16, next_pow2(H)))
    hblocks = triton.cdiv(H, bh)
    rows = win_slots.shape[1] + ent_slots.shape[1]
    splits = num_splits(cfg.get("SPLITS", "auto"), B * hblocks, rows, q.device)
    bd = max(16, next_pow2(D))
    bt = max(16, next_pow2(DK - D)) if DK > D else 16
    if splits == 1:
        part, pm, pl = out, out, out  # PM / PL unused
    else:  # per-split partials (fp32), merged below
        part = torch.empty((B, H, splits, D), dtype=torch.float32, device=q.device)
        pm = torch.empty((B, H, splits), dtype=torch.float32, device=q.device)
        pl = torch.empty_like(pm)
    _sparse_sink_kernel[(B, hblocks, splits)](
        q, kv_cache, win_slots, ent_cache, ent_slots, sinks, part, pm, pl, win_slots.shape[1], ent_slots.shape[1], H, D,
        DK, q.stride(0), q.stride(1), _row_stride(kv_cache), _row_stride(ent_cache), win_slots.stride(0),
        max(ent_slots.stride(0), 1), out.stride(0), out.stride(1), float(scale),
        BLOCK_H=bh, BLOCK_D=bd, BLOCK_T=bt, BLOCK_N=int(cfg["BLOCK_N"]), SPLITS=splits, HAS_SINK=has_sink,
        HAS_TAIL=DK > D,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        ROUND_LOGITS=bool(round_logits) and q.dtype != torch.float32, num_warps=int(cfg["num_warps"]))
    if splits > 1:
        _merge_kernel[(B, H)](part, pm, pl, sinks, out, H, D, out.stride(0), out.stride(1), SPLITS=splits,
                              BLOCK_S=next_pow2(splits), BLOCK_D=bd, HAS_SINK=has_sink, num_warps=4)
    return out


def num_splits(setting, programs: int, rows: int, device: torch.device) -> int:
    """Splits of the row list per (sequence, head block): an int from the config, or "auto": enough programs to
    fill about two waves of the GPU's SMs, at most one per 64 rows and :data:`MAX_SPLITS` (1 off CUDA). From
    shapes only, so a captured graph keeps its choice."""
    if setting != "auto":
        return max(1, int(setting))
    if device.type != "cuda":
        return 1
    from torchinferno.kernels.triton import num_sms

    want = -(-2 * num_sms(device.index or 0) // max(programs, 1))
    return max(1, min(want, rows // 64, MAX_SPLITS))
