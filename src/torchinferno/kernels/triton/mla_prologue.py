"""MLA prologue in one launch: latent RMSNorm, rope of the shared key and of every query head, latent cache append.

Input: ``kv [T, R + r]`` (the ``kv_a_proj_with_mqa`` output: ``c_kv`` then the unrotated ``k_pe``, rows strided)
and ``q [T, H, dn + r]`` (the query projection, its last ``r`` dims per head unrotated, strided). One program per
token computes

* ``latent[t] = [rms_norm(c_kv) * w | rope(k_pe)]`` (fp32 math, one rounding: ``kernels.triton.norm``'s rule),
  stored into ``LAT`` and, when ``slot_mapping[t] >= 0``, into the paged latent cache row ``slot`` (FP8 caches:
  the rounded value saturated at the format's max, as ``kernels.triton.kv_cache``);
* ``q_pe[t, h] = rope(q[t, h, dn:])`` for all heads, stored through arbitrary (token, head) strides, so the caller
  can place it straight into the absorbed decode's query buffer (``kernels.mla_decode``).

Rope: ``INTERLEAVED`` rotates adjacent pairs ``(x[2i], x[2i+1])`` (DeepSeek's layout, ``rope.apply_rope_interleaved``),
else halves ``(x[i], x[i + r/2])`` (``rotary_neox``); ``cos/sin [T, r/2]`` fp32 rows. It replaces ~17 launches
per layer of the unfused path (RMSNorm, two ropes of ~7 torch ops each, a cat, the cache append).
Reference: ``MLAProjections.project`` + ``write_kv`` (tests/kernels/test_mla_prologue.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.kv_dtype import is_fp8
from torchinferno.kernels.triton import next_pow2
from torchinferno.kernels.triton.decode_gemv import _wait_for_previous_kernel, pdl_kwargs


@triton.jit
def _mla_prologue_kernel(KV, Q, COS, SIN, NW, LAT, QPE, CACHE, SLOTS, eps, H, Q_OFF, stride_kv, stride_qt, stride_qh,
                         stride_ct, stride_st, stride_lat, stride_pt, stride_ph, R: tl.constexpr,
                         R_PAD: tl.constexpr, RD: tl.constexpr, HALF_PAD: tl.constexpr, BLOCK_H: tl.constexpr,
                         INTERLEAVED: tl.constexpr, WRITE_CACHE: tl.constexpr, SAT: tl.constexpr,
                         PDL: tl.constexpr = False):
    _wait_for_previous_kernel(PDL, True)  # PDL: before any access; one program a token: the next may launch now
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, R_PAD)
    cm = cols < R
    c = tl.load(KV + t * stride_kv + cols, mask=cm, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(c * c, axis=0) / R + eps)
    w = tl.load(NW + cols, mask=cm, other=0.0).to(tl.float32)
    y = (c * rstd * w).to(LAT.dtype.element_ty)  # [R_PAD]
    tl.store(LAT + t * stride_lat + cols, y, mask=cm)
    j = tl.arange(0, HALF_PAD)
    jm = j < RD // 2
    cos = tl.load(COS + t * stride_ct + j, mask=jm, other=0.0).to(tl.float32)
    sin = tl.load(SIN + t * stride_st + j, mask=jm, other=0.0).to(tl.float32)
    if INTERLEAVED:
        p1 = 2 * j
        p2 = 2 * j + 1
    else:
        p1 = j
        p2 = j + RD // 2
    k1 = tl.load(KV + t * stride_kv + R + p1, mask=jm, other=0.0).to(tl.float32)
    k2 = tl.load(KV + t * stride_kv + R + p2, mask=jm, other=0.0).to(tl.float32)
    o1 = (k1 * cos - k2 * sin).to(LAT.dtype.element_ty)
    o2 = (k2 * cos + k1 * sin).to(LAT.dtype.element_ty)
    tl.store(LAT + t * stride_lat + R + p1, o1, mask=jm)
    tl.store(LAT + t * stride_lat + R + p2, o2, mask=jm)
    if WRITE_CACHE:
        slot = tl.load(SLOTS + t).to(tl.int64)
        if slot >= 0:  # -1: a padded row of a CUDA-graph bucket writes nothing
            row = CACHE + slot * (R + RD)
            yc = y.to(tl.float32)
            c1 = o1.to(tl.float32)
            c2 = o2.to(tl.float32)
            if SAT > 0:  # FP8 cache: the rounded value saturated, then stored in the format
                yc = tl.clamp(yc, -SAT, SAT)
                c1 = tl.clamp(c1, -SAT, SAT)
                c2 = tl.clamp(c2, -SAT, SAT)
            tl.store(row + cols, yc.to(CACHE.dtype.element_ty), mask=cm)
            tl.store(row + R + p1, c1.to(CACHE.dtype.element_ty), mask=jm)
            tl.store(row + R + p2, c2.to(CACHE.dtype.element_ty), mask=jm)
    for h0 in range(0, H, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H)
        m = (hs[:, None] < H) & jm[None, :]
        qb = Q + t * stride_qt + hs[:, None].to(tl.int64) * stride_qh + Q_OFF
        x1 = tl.load(qb + p1[None, :], mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(qb + p2[None, :], mask=m, other=0.0).to(tl.float32)
        ob = QPE + t * stride_pt + hs[:, None].to(tl.int64) * stride_ph
        tl.store(ob + p1[None, :], (x1 * cos[None, :] - x2 * sin[None, :]).to(QPE.dtype.element_ty), mask=m)
        tl.store(ob + p2[None, :], (x2 * cos[None, :] + x1 * sin[None, :]).to(QPE.dtype.element_ty), mask=m)


def mla_prologue(kv: torch.Tensor, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, norm_weight: torch.Tensor,
                 eps: float, rope_dim: int, interleaved: bool, q_pe_out: torch.Tensor,
                 cache: torch.Tensor | None = None, slot_mapping: torch.Tensor | None = None,
                 pdl: bool = False) -> torch.Tensor:
    """kv [T, R + r], q [T, H, dn + r], cos/sin [T, r/2], norm_weight [R] -> latent [T, R + r] (kv.dtype; new).

    Writes ``q_pe_out [T, H, r]`` (any strides, last dim contiguous) with the rotated query rope dims and, with
    ``cache [N, bs, R + r]`` (contiguous) and ``slot_mapping [T]``, the latent rows into the cache (slot -1 skips).
    ``pdl``: launched with programmatic dependent launch (Hopper; CUDA only).
    """
    T, H, qd = q.shape
    R = kv.shape[1] - rope_dim
    assert kv.stride(1) == 1 and q.stride(2) == 1 and q_pe_out.stride(2) == 1 and q_pe_out.shape == (T, H, rope_dim)
    assert rope_dim % 2 == 0 and norm_weight.numel() == R
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    latent = torch.empty((T, R + rope_dim), dtype=kv.dtype, device=kv.device)
    write = cache is not None
    if write:
        assert cache.is_contiguous() and cache.shape[-1] == R + rope_dim and slot_mapping is not None
    if T:
        _mla_prologue_kernel[(T,)](
            kv, q, cos, sin, norm_weight, latent, q_pe_out, cache if write else latent,
            slot_mapping if write else latent, float(eps), H, qd - rope_dim, kv.stride(0), q.stride(0), q.stride(1),
            cos.stride(0), sin.stride(0), latent.stride(0), q_pe_out.stride(0), q_pe_out.stride(1), R=R,
            R_PAD=next_pow2(R), RD=rope_dim, HALF_PAD=next_pow2(rope_dim // 2), BLOCK_H=min(16, next_pow2(H)),
            INTERLEAVED=interleaved, WRITE_CACHE=write,
            SAT=torch.finfo(cache.dtype).max if write and is_fp8(cache.dtype) else 0.0, num_warps=4, **pdl_kwargs(pdl))
    return latent
