"""MLA prefill attention in the expanded (non-absorbed) form, read in place: no q / k / v assembly copies.

The expanded form attends per head with a ``dn + r`` key (``dn`` per-head dims from ``kv_b_proj``, ``r`` rope dims
shared by every head) and a ``dv`` value. Built for SDPA it costs a ``cat`` of the query, a copy of the keys with
the shared rope part broadcast to every head, the values padded to the key width (flash needs one head dim) and a
copy of the output slice. Here a program reads the pieces where they are:

    s   = q_nope @ k_nope^T + q_pe @ k_pe^T      # [BLOCK_M, BLOCK_N]: two dots; k_pe one row per key, all heads
    acc = acc * alpha + p @ v                    # [BLOCK_M, dv], no padding

Layout: ``q_nope [Q, H, dn]``, ``q_pe [Q, H, r]``, ``kv [S, H, dn + dv]`` (``kv_b_proj``'s output: per head
``dn`` key dims then ``dv`` value dims), ``k_pe [S, r]`` (any row stride), unit stride in the last dim of each ->
``out [Q, H, dv]``. Query ``i`` sits at position ``context_len + i`` and sees keys ``0 .. context_len + i``
(``S = context_len + Q``: causal, lower right). Grid ``(cdiv(Q, BLOCK_M), H)``: a program's keys in two loops, the
tiles every row of it sees (no mask), then those from the diagonal to its last visible key (masked). fp32 inputs
take ieee dots (tests).
Reference: ``models.common.mla.mla_expanded_attention`` (tests/kernels/test_mla_prefill.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.triton import next_pow2
from torchinferno.kernels.triton.decode_attention import LOG2E, split_key_scores


def default_config(fp32: bool) -> dict:
    """Tiles (Hopper, bf16: 128 query rows over 8 warps, 64 keys a step, 3 stages; fp32: small tiles for the
    ieee dots of tests)."""
    if fp32:
        return {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1}
    return {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 3}


@triton.jit
def _key_tile(q_n, q_p, kv_h, KP, n0, last, qpos, m_i, l_i, acc, qk_scale, stride_kvt, stride_kpt,
              DN: tl.constexpr, DN_PAD: tl.constexpr, R: tl.constexpr, R_PAD: tl.constexpr, DV: tl.constexpr,
              DV_PAD: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr, IEEE: tl.constexpr):
    """Keys ``n0 .. n0 + BLOCK_N`` of one head folded into the running max / sum / output (base 2). ``MASK``: the
    tile crosses the diagonal or the end (``last``): key ``j`` counts for a query at ``qpos`` iff ``j <= qpos`` and
    ``j < last``; without it every key of the tile is visible to every row."""
    dn = tl.arange(0, DN_PAD)
    dr = tl.arange(0, R_PAD)
    dv = tl.arange(0, DV_PAD)
    kn = n0 + tl.arange(0, BLOCK_N)
    km = kn < last
    row = kn.to(tl.int64)
    k_n = tl.load(kv_h + row[:, None] * stride_kvt + dn[None, :], mask=km[:, None] & (dn[None, :] < DN),
                  other=0.0)  # [BLOCK_N, DN_PAD]
    k_p = tl.load(KP + row[:, None] * stride_kpt + dr[None, :], mask=km[:, None] & (dr[None, :] < R),
                  other=0.0).to(k_n.dtype)  # [BLOCK_N, R_PAD]
    s = split_key_scores(q_n, k_n, q_p, k_p, IEEE) * qk_scale  # [BLOCK_M, BLOCK_N], log2 domain
    if MASK:
        s = tl.where((kn[None, :] <= qpos[:, None]) & km[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every row sees key 0, in the first tile
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(kv_h + row[:, None] * stride_kvt + DN + dv[None, :], mask=km[:, None] & (dv[None, :] < DV),
                other=0.0)  # [BLOCK_N, DV_PAD]
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["context_len"])
def _mla_prefill_kernel(QN, QP, KV, KP, OUT, Q_LEN, context_len, qk_scale,
                        stride_qnt, stride_qnh, stride_qpt, stride_qph, stride_kvt, stride_kvh, stride_kpt,
                        stride_ot, stride_oh,
                        DN: tl.constexpr, DN_PAD: tl.constexpr, R: tl.constexpr, R_PAD: tl.constexpr,
                        DV: tl.constexpr, DV_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        IEEE: tl.constexpr):
    pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    qm = rm < Q_LEN
    dn = tl.arange(0, DN_PAD)
    dr = tl.arange(0, R_PAD)
    dv = tl.arange(0, DV_PAD)
    tok = rm.to(tl.int64)
    q_n = tl.load(QN + tok[:, None] * stride_qnt + h * stride_qnh + dn[None, :], mask=qm[:, None] & (dn[None, :] < DN),
                  other=0.0)  # [BLOCK_M, DN_PAD]
    q_p = tl.load(QP + tok[:, None] * stride_qpt + h * stride_qph + dr[None, :], mask=qm[:, None] & (dr[None, :] < R),
                  other=0.0).to(q_n.dtype)  # [BLOCK_M, R_PAD]
    qpos = context_len + rm  # each query's last visible key
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV_PAD], tl.float32)
    last = tl.minimum(context_len + (pid_m + 1) * BLOCK_M, context_len + Q_LEN)  # keys [0, last) can be visible
    lo = (context_len + pid_m * BLOCK_M) // BLOCK_N * BLOCK_N  # keys below: visible to every row of the tile
    kv_h = KV + h * stride_kvh
    for n0 in range(0, lo, BLOCK_N):  # no mask
        m_i, l_i, acc = _key_tile(q_n, q_p, kv_h, KP, n0, last, qpos, m_i, l_i, acc, qk_scale, stride_kvt,
                                  stride_kpt, DN, DN_PAD, R, R_PAD, DV, DV_PAD, BLOCK_N, False, IEEE)
    for n0 in range(lo, last, BLOCK_N):  # the diagonal and the end
        m_i, l_i, acc = _key_tile(q_n, q_p, kv_h, KP, n0, last, qpos, m_i, l_i, acc, qk_scale, stride_kvt,
                                  stride_kpt, DN, DN_PAD, R, R_PAD, DV, DV_PAD, BLOCK_N, True, IEEE)
    acc = acc / l_i[:, None]
    tl.store(OUT + tok[:, None] * stride_ot + h * stride_oh + dv[None, :], acc.to(OUT.dtype.element_ty),
             mask=qm[:, None] & (dv[None, :] < DV))


def mla_prefill_attention(q_nope: torch.Tensor, q_pe: torch.Tensor, kv: torch.Tensor, k_pe: torch.Tensor,
                          scale: float, context_len: int = 0, config: dict | None = None) -> torch.Tensor:
    """q_nope [Q, H, dn], q_pe [Q, H, r], kv [S, H, dn + dv], k_pe [S, r] (``S = context_len + Q``) -> out
    [Q, H, dv] in q_nope's dtype (module docstring). ``config`` overrides :func:`default_config`'s tiles."""
    Q, H, DN = q_nope.shape
    S, _, W = kv.shape
    R = q_pe.shape[-1]
    DV = W - DN
    assert S == context_len + Q and kv.shape[1] == H and k_pe.shape == (S, R) and DV > 0, (q_nope.shape, kv.shape)
    for t in (q_nope, q_pe, kv, k_pe):
        assert t.stride(-1) == 1, "unit stride in the last dim"
    out = torch.empty((Q, H, DV), dtype=q_nope.dtype, device=q_nope.device)
    if Q == 0:
        return out
    ieee = q_nope.dtype == torch.float32
    cfg = {**default_config(ieee), **(config or {})}
    _mla_prefill_kernel[(triton.cdiv(Q, cfg["block_m"]), H)](
        q_nope, q_pe, kv, k_pe, out, Q, context_len, scale * LOG2E,
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), kv.stride(0), kv.stride(1),
        k_pe.stride(0), out.stride(0), out.stride(1),
        DN=DN, DN_PAD=max(16, next_pow2(DN)), R=R, R_PAD=max(16, next_pow2(R)), DV=DV, DV_PAD=max(16, next_pow2(DV)),
        BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"], IEEE=ieee, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])
    return out
