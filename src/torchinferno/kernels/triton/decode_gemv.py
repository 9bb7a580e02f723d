"""One-row decode GEMVs with the small ops of a decoder layer fused in, chained by programmatic dependent launch.

At batch 1 a Llama decode step is ~190 GEMVs that together read every weight once, plus ~250
small kernels (norms, residual adds, rotary, KV append, SwiGLU) whose launch gaps and tails cost
as much as a fifth of the step. Here each GEMV ``y [N] = x [K] @ W[N, K]^T`` takes the ops
around it:

* prologue ``NORM``: ``rms_norm(x) * norm_weight``. The 1/rms factor is a scalar, so it
  multiplies the finished dot products: every program streams ``x * norm_weight`` (from L2) into
  its sums while gathering ``sum(x^2)`` in the same pass. The normalized input is therefore never
  rounded to bf16 (the unfused norm kernel rounds it once): slightly more accurate, not bitwise.
* epilogue ``ADD`` (plain GEMVs): ``y = x @ W^T + residual``, the output rounded first and the
  sum rounded again, exactly as the unfused ``linear`` then ``x + residual`` — so the o and down
  projections emit the next residual stream directly and the following norm reads one vector.
* epilogue ``EPI_SWIGLU``: rows ``n`` and ``n + N`` of a merged gate/up weight go to two
  accumulators; stores ``silu(g) * u`` (``g``/``u`` rounded to x's dtype first, as the unfused
  GEMM output is).
* epilogue ``EPI_ROPE_KV``: a merged q/k/v weight (heads of ``HD``); a program owns rows
  ``c..c+BN`` and ``c+HD/2..c+HD/2+BN`` of one head, so neox rotary (pairs ``i``, ``i+HD/2``) is
  elementwise across its two accumulators. Query heads go to ``Q``; key/value heads are written
  straight into the paged cache at ``slot`` (skipped when ``slot < 0``: a padded graph row), with
  the FP8 cache's saturation (``kernels.kv_dtype``).

PDL: with ``pdl=True`` a kernel is launched with programmatic stream serialization: it may start
while the previous kernel drains, loads its first weight tile (which nothing earlier writes),
and only then waits (``griddepcontrol.wait``) for the previous kernel's results before reading
any activation. Weights streaming overlaps the previous kernel's tail instead of the GPU idling
through a launch gap. Every input that is not a weight is read after the wait, and nothing is
written before it. ``pdl`` is a constant of the caller (Hopper or newer), never an env knob. With
``config["early_launch"]`` the kernel also triggers its dependents before waiting, so the next
kernel's programs can launch (and prefetch) as soon as SM slots free up. Ordering stays
transitive: a kernel cannot finish before its own wait returned, so the kernel after it never
overlaps anything but its immediate predecessor's tail.

fp32 accumulation; one row only (``x [K]``). Entry points: ``kernels.api.decode_gemv*``; torch
oracles (the unfused ops): ``kernels.reference.ref_decode_gemv*``; numerics tests:
``tests/kernels/test_decode_gemv.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from torchinferno.kernels.kv_dtype import is_fp8

EPI_PLAIN, EPI_SWIGLU, EPI_ROPE_KV = 0, 1, 2


@triton.jit
def _wait_for_previous_kernel(PDL: tl.constexpr, EARLY_LAUNCH: tl.constexpr):
    if PDL:
        if EARLY_LAUNCH:  # let the next kernel's programs launch (and prefetch their weights) now
            gdc_launch_dependents()
        gdc_wait()


def pdl_kwargs(pdl: bool) -> dict:
    """Launch kwargs of a kernel with a ``PDL`` constexpr: programmatic dependent launch on, the kernel told so. A
    kernel launched this way must call :func:`_wait_for_previous_kernel` before it touches anything an earlier kernel
    writes or reads, and on every path (a program that returns without waiting could let the kernel finish before its
    predecessor, and the next kernel's wait would no longer cover the one before)."""
    return {"PDL": True, "launch_pdl": True} if pdl else {}


@triton.jit
def _input_tile(X, NW, k, km, NORM: tl.constexpr):
    """fp32 [BK]: the GEMV input at columns k before the 1/rms factor, and x there (for the sum of squares)."""
    x = tl.load(X + k, mask=km, other=0.0).to(tl.float32)
    if NORM:
        return x * tl.load(NW + k, mask=km, other=0.0).to(tl.float32), x
    return x, x


@triton.jit
def _inv_rms(ss, K, eps, NORM: tl.constexpr):
    """The 1/rms factor of a row whose squares ``ss`` ([BK] partial sums over all K columns) were gathered by
    :func:`_input_tile`'s callers; 1.0 without NORM."""
    rstd = 1.0
    if NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(ss, 0) / K + eps)
    return rstd


@triton.jit
def _decode_gemv_kernel(
    X, R, NW, W, Y, COS, SIN, KC, VC, SLOT, W2,
    N, K, stride_w, eps, N1, stride_w2,
    ADD: tl.constexpr, NORM: tl.constexpr, EPI: tl.constexpr, TWO_W: tl.constexpr,
    NQ: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr, EARLY_LAUNCH: tl.constexpr,
    SAT: tl.constexpr,
):
    pid = tl.program_id(0)
    j = tl.arange(0, BLOCK_N)
    if EPI == 2:  # EPI_ROPE_KV: rows c + j and c + HD/2 + j of head `head`
        per_head: tl.constexpr = HD // 2 // BLOCK_N
        head = pid // per_head
        c = (pid % per_head) * BLOCK_N
        rows1 = head * HD + c + j
        rows2 = rows1 + HD // 2
    else:
        rows1 = pid * BLOCK_N + j
        rows2 = rows1 + N  # EPI_SWIGLU: the up row of gate row n
    m1 = rows1 < N
    k = tl.arange(0, BLOCK_K)
    km = k < K
    p1 = W + rows1.to(tl.int64)[:, None] * stride_w + k[None, :]
    if TWO_W:  # rows >= N1 come from the second weight (BLOCK_N divides N1: a program reads one weight)
        p1 = tl.where(pid * BLOCK_N >= N1, W2 + (rows1 - N1).to(tl.int64)[:, None] * stride_w2 + k[None, :], p1)
    p2 = W + rows2.to(tl.int64)[:, None] * stride_w + k[None, :]
    # First weight tile before the wait: weights are never written by an earlier kernel.
    w1 = tl.load(p1, mask=m1[:, None] & km[None, :], other=0.0, eviction_policy="evict_first")
    if EPI != 0:
        w2 = tl.load(p2, mask=m1[:, None] & km[None, :], other=0.0, eviction_policy="evict_first")
    _wait_for_previous_kernel(PDL, EARLY_LAUNCH)

    # rms_norm(h) @ W^T == (1/rms(h)) * ((h * norm_weight) @ W^T): the sum of squares is gathered in the
    # same pass as the dot products and the 1/rms factor applied to the sums (no pre-pass over x).
    xt, h = _input_tile(X, NW, k, km, NORM)
    ss = h * h
    acc1 = w1.to(tl.float32) * xt[None, :]
    if EPI != 0:
        acc2 = w2.to(tl.float32) * xt[None, :]
    for kt in range(1, tl.cdiv(K, BLOCK_K)):
        k0 = kt * BLOCK_K
        kk = k0 + k
        kkm = kk < K
        xt, h = _input_tile(X, NW, kk, kkm, NORM)
        ss += h * h
        w1 = tl.load(p1 + k0, mask=m1[:, None] & kkm[None, :], other=0.0, eviction_policy="evict_first")
        acc1 += w1.to(tl.float32) * xt[None, :]
        if EPI != 0:
            w2 = tl.load(p2 + k0, mask=m1[:, None] & kkm[None, :], other=0.0, eviction_policy="evict_first")
            acc2 += w2.to(tl.float32) * xt[None, :]
    rstd = _inv_rms(ss, K, eps, NORM)

    out_ty = Y.dtype.element_ty
    y1 = tl.sum(acc1, 1) * rstd
    if EPI == 0:
        y1 = y1.to(out_ty)
        if ADD:  # the next residual stream: round the product, add, round the sum (the unfused order)
            y1 = (y1.to(tl.float32) + tl.load(R + rows1, mask=m1, other=0.0).to(tl.float32)).to(out_ty)
        tl.store(Y + rows1, y1, mask=m1)
    elif EPI == 1:
        g = y1.to(out_ty).to(tl.float32)
        u = (tl.sum(acc2, 1) * rstd).to(out_ty).to(tl.float32)
        tl.store(Y + rows1, (g / (1.0 + tl.exp(-g)) * u).to(out_ty), mask=m1)
    else:
        a1 = y1.to(out_ty).to(tl.float32)
        a2 = (tl.sum(acc2, 1) * rstd).to(out_ty).to(tl.float32)
        if head < NQ + NKV:  # queries and keys are rotated; values are not
            cs = tl.load(COS + c + j).to(tl.float32)
            sn = tl.load(SIN + c + j).to(tl.float32)
            a1, a2 = a1 * cs - a2 * sn, a2 * cs + a1 * sn
        o1 = a1.to(out_ty)
        o2 = a2.to(out_ty)
        if head < NQ:
            tl.store(Y + rows1, o1)
            tl.store(Y + rows2, o2)
        else:
            slot = tl.load(SLOT).to(tl.int64)
            if slot >= 0:
                is_k = head < NQ + NKV
                kvh = tl.where(is_k, head - NQ, head - NQ - NKV)
                dst = slot * (NKV * HD) + kvh * HD + c + j
                s1 = o1.to(tl.float32)  # exact; the store rounds once to the cache's dtype
                s2 = o2.to(tl.float32)
                if SAT > 0:  # FP8 cache: saturate at the format's finite max first
                    s1 = tl.clamp(s1, -SAT, SAT)
                    s2 = tl.clamp(s2, -SAT, SAT)
                if is_k:
                    tl.store(KC + dst, s1.to(KC.dtype.element_ty))
                    tl.store(KC + dst + HD // 2, s2.to(KC.dtype.element_ty))
                else:
                    tl.store(VC + dst, s1.to(VC.dtype.element_ty))
                    tl.store(VC + dst + HD // 2, s2.to(VC.dtype.element_ty))


DEFAULT_CONFIG = {"block_n": 16, "block_k": 512, "num_warps": 4, "num_stages": 3, "early_launch": False}


def _launch(x, weight, y, *, residual=None, norm_weight=None, eps=0.0, epi=EPI_PLAIN, n_rows=None,
            rope=None, kv=None, nq=0, nkv=0, head_dim=0, pdl=False, config=None, second=None):
    cfg = {**DEFAULT_CONFIG, **(config or {})}
    K = weight.shape[1]
    assert weight.stride(1) == 1 and x.is_contiguous() and x.numel() == K, (x.shape, weight.shape)
    bn = cfg["block_n"]
    if epi == EPI_ROPE_KV:
        assert (head_dim // 2) % bn == 0, "block_n must divide head_dim / 2"
        grid = ((nq + 2 * nkv) * (head_dim // 2) // bn,)
        N = weight.shape[0]
    else:
        N = n_rows
        grid = (triton.cdiv(N, bn),)
    cos, sin = rope if rope is not None else (weight, weight)
    k_cache, v_cache, slot = kv if kv is not None else (weight, weight, weight)
    sat = float(torch.finfo(k_cache.dtype).max) if kv is not None and is_fp8(k_cache.dtype) else 0.0
    extra = {"launch_pdl": True} if pdl else {}
    _decode_gemv_kernel[grid](
        x, residual if residual is not None else x, norm_weight if norm_weight is not None else x, weight, y,
        cos, sin, k_cache, v_cache, slot, weight if second is None else second, N, K, weight.stride(0), float(eps),
        weight.shape[0], weight.stride(0) if second is None else second.stride(0),
        ADD=residual is not None, NORM=norm_weight is not None, EPI=epi, TWO_W=second is not None, NQ=nq, NKV=nkv,
        HD=head_dim,
        BLOCK_N=bn, BLOCK_K=cfg["block_k"], PDL=pdl, EARLY_LAUNCH=bool(cfg["early_launch"]), SAT=sat,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **extra)


def gemv(x, weight, out=None, *, residual=None, norm_weight=None, eps=1e-6, pdl=False, config=None,
         second_weight=None):
    """``x [K] -> [N]``: ``norm(x) @ weight.T + residual`` (norm and residual optional; see module doc).

    ``out`` must not alias ``residual`` (another program may still read the row it would overwrite).
    ``second_weight [N2, K]``: its rows follow ``weight``'s in the output (``[N + N2]``, one launch for two
    projections of the same input, e.g. MLA's q and kv_a); ``config["block_n"]`` must divide ``N``.
    """
    N = weight.shape[0]
    assert residual is None or out is None or out.data_ptr() != residual.data_ptr()
    if second_weight is not None:
        assert second_weight.shape[1] == weight.shape[1] and second_weight.dtype == weight.dtype
        assert second_weight.stride(1) == 1 and N % {**DEFAULT_CONFIG, **(config or {})}["block_n"] == 0
    n_rows = N + (0 if second_weight is None else second_weight.shape[0])
    y = torch.empty(n_rows, dtype=x.dtype, device=x.device) if out is None else out
    _launch(x, weight, y, residual=residual, norm_weight=norm_weight, eps=eps, n_rows=n_rows, pdl=pdl, config=config,
            second=second_weight)
    return y


def gemv_swiglu(x, gate_up_weight, out=None, *, norm_weight=None, eps=1e-6, pdl=False, config=None):
    """``x [K] -> silu(g) * u [I]`` with ``g, u = chunk(norm(x) @ gate_up_weight.T, 2)``."""
    inter = gate_up_weight.shape[0] // 2
    y = torch.empty(inter, dtype=x.dtype, device=x.device) if out is None else out
    _launch(x, gate_up_weight, y, norm_weight=norm_weight, eps=eps, epi=EPI_SWIGLU, n_rows=inter, pdl=pdl,
            config=config)
    return y


def gemv_rope_kv(x, qkv_weight, cos, sin, k_cache, v_cache, slot, num_heads: int, num_kv_heads: int, head_dim: int,
                 q_out=None, *, norm_weight=None, eps=1e-6, pdl=False, config=None):
    """``x [K]`` -> queries ``[num_heads * head_dim]`` (rotated); rotated keys and values stored at ``slot``.

    ``cos``/``sin`` ``[head_dim / 2]`` (this token's rows of the tables), ``slot`` a 1-element int
    tensor (flat slot of ``[num_blocks * page]``, < 0: write nothing); caches ``[blocks, page, Hkv, hd]``
    contiguous.
    """
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()
    q = torch.empty(num_heads * head_dim, dtype=x.dtype, device=x.device) if q_out is None else q_out
    _launch(x, qkv_weight, q, norm_weight=norm_weight, eps=eps, epi=EPI_ROPE_KV, rope=(cos, sin),
            kv=(k_cache, v_cache, slot), nq=num_heads, nkv=num_kv_heads, head_dim=head_dim, pdl=pdl, config=config)
    return q
