"""DeepSeek MoE routing in one Triton launch: scores, correction bias, group-limited top-k, combine weights
(:func:`route`; :func:`router_route` also computes the router logits from the hidden states in the same launch).

One program per token over its ``E`` router logits (fp32): ``s = sigmoid(logit)`` (V3) or ``sqrt(softplus(logit))``
(V4); ``choice = s + bias`` steers selection only; with ``n_group > 1`` and ``topk_group < n_group`` a group scores
the sum of its top-2 choices and only the best ``topk_group`` groups stay eligible; ``top_k`` experts are picked by
repeated arg-max (lowest index on a tie); weights are the unbiased ``s`` of the picks, normalized to sum 1 when
``norm`` and times ``scaling``. Same contract as ``models.common.moe.route_sigmoid_grouped`` (the reference; the
order of the ``top_k`` picks within a row may differ from torch.topk's, which the MoE sum does not see).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.triton.decode_gemv import _input_tile, _inv_rms, _wait_for_previous_kernel, pdl_kwargs
from torchinferno.kernels.triton.fused_moe import _align_body


@triton.jit
def _route_kernel(LOGITS, BIAS, W_OUT, IDS_OUT, stride_l, scaling, E: tl.constexpr, TOP_K: tl.constexpr,
                  K_PAD: tl.constexpr, N_GROUP: tl.constexpr, PER: tl.constexpr, TOPK_GROUP: tl.constexpr,
                  HAS_BIAS: tl.constexpr, NORM: tl.constexpr, SQRT_SOFTPLUS: tl.constexpr, N_SHARED: tl.constexpr,
                  S_PAD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    logit = tl.load(LOGITS + t * stride_l + tl.arange(0, E)).to(tl.float32)
    _route_row(logit, BIAS, W_OUT, IDS_OUT, t, scaling, E, TOP_K, K_PAD, N_GROUP, PER, TOPK_GROUP, HAS_BIAS, NORM,
               SQRT_SOFTPLUS, N_SHARED, S_PAD)


@triton.jit
def _route_row(logit, BIAS, W_OUT, IDS_OUT, t, scaling, E: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
               N_GROUP: tl.constexpr, PER: tl.constexpr, TOPK_GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
               NORM: tl.constexpr, SQRT_SOFTPLUS: tl.constexpr, N_SHARED: tl.constexpr, S_PAD: tl.constexpr):
    """Token ``t``'s routing from its fp32 logits ``[E]`` (module doc), stored into row ``t`` of the outputs."""
    e = tl.arange(0, E)
    if SQRT_SOFTPLUS:
        # softplus as torch computes it (x past 20: x); exp(x) where 1 + exp(x) rounds to 1 in fp32
        sp = tl.where(logit < -15.0, tl.exp(logit), tl.log(1.0 + tl.exp(tl.minimum(logit, 20.0))))
        s = tl.sqrt(tl.where(logit > 20.0, logit, sp))
    else:
        s = 1.0 / (1.0 + tl.exp(-logit))
    c = s
    if HAS_BIAS:
        c = s + tl.load(BIAS + e).to(tl.float32)
    if N_GROUP > 1 and TOPK_GROUP < N_GROUP:
        c2 = tl.reshape(c, [N_GROUP, PER])
        j = tl.arange(0, PER)
        m1 = tl.max(c2, axis=1)
        first = tl.min(tl.where(c2 == m1[:, None], j[None, :], PER), axis=1)
        m2 = tl.max(tl.where(j[None, :] == first[:, None], float("-inf"), c2), axis=1)
        gs = m1 + m2  # [N_GROUP] group scores
        g = tl.arange(0, N_GROUP)
        keep = g < 0
        for _ in tl.static_range(TOPK_GROUP):
            best = tl.min(tl.where(gs == tl.max(gs, axis=0), g, N_GROUP), axis=0)
            keep = keep | (g == best)
            gs = tl.where(g == best, float("-inf"), gs)
        c = tl.reshape(tl.where(keep[:, None], c2, float("-inf")), [E])
    kk = tl.arange(0, K_PAD)
    w = tl.zeros([K_PAD], dtype=tl.float32)
    ids = tl.zeros([K_PAD], dtype=tl.int64)
    for k in tl.static_range(TOP_K):
        pick = tl.min(tl.where(c == tl.max(c, axis=0), e, E), axis=0)
        w = tl.where(kk == k, tl.sum(tl.where(e == pick, s, 0.0), axis=0), w)
        ids = tl.where(kk == k, pick.to(tl.int64), ids)
        c = tl.where(e == pick, float("-inf"), c)
    if NORM:
        w = w / (tl.sum(w, axis=0) + 1e-20)
    ok = kk < TOP_K
    row = t * (TOP_K + N_SHARED)
    tl.store(W_OUT + row + kk, w * scaling, mask=ok)
    tl.store(IDS_OUT + row + kk, ids, mask=ok)
    if N_SHARED > 0:  # shared experts E .. E + N_SHARED - 1, weight 1, after the routed picks
        j = tl.arange(0, S_PAD)
        tl.store(W_OUT + row + TOP_K + j, tl.full([S_PAD], 1.0, tl.float32), mask=j < N_SHARED)
        tl.store(IDS_OUT + row + TOP_K + j, (E + j).to(tl.int64), mask=j < N_SHARED)


@triton.jit
def _logits_tile(X, W, t, re, ok_e, D, stride_xt, stride_w, NW, eps, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                 RMS: tl.constexpr):
    # [BLOCK_E] fp32 router logits of token t for experts re: sum_d float(x[t, d]) * float(w[e, d]), rows ~ok_e read 0.
    # RMS: of rms_norm(x[t]) * NW instead, never rounded (decode_gemv's prologue: the 1/rms scalar scales the sums)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_E, BLOCK_K], dtype=tl.float32)
    ss = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        kk = k0 + rk
        ok_k = kk < D
        xv, x = _input_tile(X + t * stride_xt, NW, kk, ok_k, RMS)
        if RMS:
            ss += x * x
        w = tl.load(W + re.to(tl.int64)[:, None] * stride_w + kk[None, :], mask=ok_e[:, None] & ok_k[None, :], other=0.0)
        acc += w.to(tl.float32) * xv[None, :]
    return tl.sum(acc, 1) * _inv_rms(ss, D, eps, RMS)


@triton.jit
def _router_gemv_kernel(X, W, OUT, D, E, stride_xt, stride_w, stride_ot, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    # grid (T, cdiv(E, BLOCK_E)): logits[t, e] = sum_d float(x[t, d]) * float(w[e, d]) in fp32 (x read in its own
    # dtype: no separate cast launch)
    t = tl.program_id(0).to(tl.int64)
    re = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    ok_e = re < E
    tl.store(OUT + t * stride_ot + re, _logits_tile(X, W, t, re, ok_e, D, stride_xt, stride_w, X, 0.0, BLOCK_E, BLOCK_K,
                                                    False), mask=ok_e)


@triton.jit
def _router_route_kernel(X, WR, LOGITS, CNT, CNT_ALL, BIAS, W_OUT, IDS_OUT, SORTED, BLOCK_EXPERT, NUM_PADDED, NW, D,
                         stride_xt, stride_w, scaling, E_ALIGN, P_MAX, NB, eps, BLOCK_E: tl.constexpr,
                         BLOCK_K: tl.constexpr, E: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
                         N_GROUP: tl.constexpr, PER: tl.constexpr, TOPK_GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
                         NORM: tl.constexpr, SQRT_SOFTPLUS: tl.constexpr, N_SHARED: tl.constexpr, S_PAD: tl.constexpr,
                         ALIGN: tl.constexpr, BM: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr,
                         RMS: tl.constexpr, PDL: tl.constexpr = False):
    # grid (T, E / BLOCK_E): each program writes BLOCK_E fp32 logits of token t (the router GEMV); the last of the
    # token's programs to finish (counted by an atomic on CNT[t], left zero again) routes the token; with ALIGN the
    # last token to be routed (CNT_ALL) runs the fused MoE's sort/pad over every token's ids.
    _wait_for_previous_kernel(PDL, True)  # PDL: before any load or store (a few programs: let the next one launch)
    t = tl.program_id(0).to(tl.int64)
    re = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    tl.store(LOGITS + t * E + re, _logits_tile(X, WR, t, re, re < E, D, stride_xt, stride_w, NW, eps, BLOCK_E, BLOCK_K,
                                               RMS))
    tl.debug_barrier()  # every thread's logit stores precede the release below
    done = tl.atomic_add(CNT + t, 1, sem="acq_rel", scope="gpu")
    if done == tl.num_programs(1) - 1:
        logit = tl.load(LOGITS + t * E + tl.arange(0, E), cache_modifier=".cg")  # all programs' logits (acquired)
        _route_row(logit, BIAS, W_OUT, IDS_OUT, t, scaling, E, TOP_K, K_PAD, N_GROUP, PER, TOPK_GROUP, HAS_BIAS, NORM,
                   SQRT_SOFTPLUS, N_SHARED, S_PAD)
        tl.atomic_xchg(CNT + t, 0, sem="relaxed", scope="gpu")  # ready for the next launch (stream-ordered)
        if ALIGN:
            tl.debug_barrier()  # this token's id stores precede the release below
            routed = tl.atomic_add(CNT_ALL, 1, sem="acq_rel", scope="gpu")
            if routed == tl.num_programs(0) - 1:
                _align_body(IDS_OUT, SORTED, BLOCK_EXPERT, NUM_PADDED, tl.num_programs(0) * (TOP_K + N_SHARED),
                            E_ALIGN, P_MAX, NB, BM, E_PAD, CHUNK)
                tl.atomic_xchg(CNT_ALL, 0, sem="relaxed", scope="gpu")


# The router GEMV's tiles (router_route and router_logits read them at call time, so both compute the same logits):
# BLOCK_E experts a program, BLOCK_K hidden columns a load. A batch-1 launch is latency-bound (8 us a layer at the
# V2-Lite-like shape on an H100, run 54: 16 programs of 4 loads each); benchmarks/probe_ds_prefill.py A/Bs others.
# Router GEMV tiles: 2 experts a program, 2048 of K per load (V2-Lite: 32 programs of one load each). Session 22, the
# V2-Lite-like batch-1 step from a graph, device time at context 128: 1.723 ms against 1.777 with the earlier 4 x 512
# on an H100 (run 55), 1.418 against 1.470 on an H200 (run 59; probe_ds_prefill.py decode, step_router_4x512).
ROUTER_TILES = {"block_e": 2, "block_k": 2048}
ROUTER_GEMV_MAX_TOKENS = 64  # decode-sized steps: one GEMV launch; larger ones cast x and run cuBLAS's fp32 GEMM
ROUTE_COUNTERS = 4096  # per device: int32 zeros, one per token of a router_route launch (left zero by every launch)
_counters: dict[torch.device, torch.Tensor] = {}


def route_counters(device: torch.device, n: int) -> torch.Tensor | None:
    """The device's counters of :func:`router_route` (``ROUTE_COUNTERS`` per-token ones, then the all-tokens one;
    zeros, left zero by every launch, so one buffer serves every layer, step and CUDA graph), or None (then the
    router GEMV and the routing run as two launches) when more than :data:`ROUTE_COUNTERS` tokens come or the
    first request comes inside a capture."""
    buf = _counters.get(device)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = _counters[device] = torch.zeros(ROUTE_COUNTERS + 1, dtype=torch.int32, device=device)
    return buf if n <= ROUTE_COUNTERS else None


def router_route(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, top_k: int, n_group: int,
                 topk_group: int, norm: bool, scaling: float, sqrt_softplus: bool = False, n_shared: int = 0,
                 block_e: int | None = None, block_k: int | None = None,
                 align: tuple[int, int, int] | None = None, rms: tuple[torch.Tensor, float] | None = None,
                 pdl: bool = False) -> tuple | None:
    """:func:`router_logits` then :func:`route` in ONE launch: x [T, D] (any float dtype), weight [E, D] fp32 ->
    (weights [T, top_k + n_shared] fp32, ids int64), the same numbers (same GEMV tiles, same routing code). None
    when the counters are unavailable (:func:`route_counters`); the caller then takes the two launches.

    ``align = (num_experts, block_m, p_max)``: the same launch also sorts/pads the ids for the fused MoE's grouped
    GEMMs (``kernels.fused_moe.align_pairs`` over ``num_experts`` = routed + shared): returns (weights, ids,
    sorted_pairs, block_expert, num_padded).

    ``rms = (norm_weight [D], eps)``: route ``rms_norm(x) * norm_weight`` instead of ``x``, the norm fused into the
    GEMV (its output never rounded: a batch-1 step's pre-MoE norm without its own launch). ``pdl``: launched with
    programmatic dependent launch (Hopper; CUDA only), waiting for the previous kernel before its first access."""
    from torchinferno.kernels.triton.fused_moe import align_outputs

    T, D = x.shape
    E = weight.shape[0]
    assert weight.shape[1] == D and weight.stride(1) == 1 and x.stride(1) == 1 and supported(E, n_group)
    cnt = route_counters(x.device, T)
    if cnt is None:
        return None
    block_e = min(block_e or ROUTER_TILES["block_e"], E)
    block_k = block_k or ROUTER_TILES["block_k"]
    w = torch.empty((T, top_k + n_shared), dtype=torch.float32, device=x.device)
    ids = torch.empty((T, top_k + n_shared), dtype=torch.int64, device=x.device)
    if align is not None:
        assert T > 0, "router_route: the sort/pad needs at least one token"
        n_align, bm, p_max = align
        aligned, (e_pad, chunk) = align_outputs(n_align, bm, p_max, x.device)
    else:  # unused pointers (ALIGN off)
        n_align, bm, p_max, aligned, (e_pad, chunk) = 1, 16, 16, (cnt, cnt, cnt), (16, 16)
    if T:
        logits = torch.empty((T, E), dtype=torch.float32, device=x.device)  # scratch between the token's programs
        _router_route_kernel[(T, E // block_e)](
            x, weight, logits, cnt, cnt[ROUTE_COUNTERS:], weight if bias is None else bias.float().contiguous(), w,
            ids, *aligned, x if rms is None else rms[0], D, x.stride(0), weight.stride(0), float(scaling), n_align,
            p_max, p_max // bm, 0.0 if rms is None else float(rms[1]),
            BLOCK_E=block_e, BLOCK_K=block_k, E=E, TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k), N_GROUP=n_group,
            PER=E // n_group, TOPK_GROUP=topk_group, HAS_BIAS=bias is not None, NORM=norm,
            SQRT_SOFTPLUS=sqrt_softplus, N_SHARED=n_shared, S_PAD=triton.next_power_of_2(max(1, n_shared)),
            ALIGN=align is not None, BM=bm, E_PAD=e_pad, CHUNK=chunk, RMS=rms is not None, num_warps=4, **pdl_kwargs(pdl))
    return (w, ids) if align is None else (w, ids, *aligned)


def router_logits(x: torch.Tensor, weight: torch.Tensor, block_e: int | None = None,
                  block_k: int | None = None) -> torch.Tensor:
    """x [T, D] (any float dtype), weight [E, D] fp32 -> fp32 logits [T, E] == ``F.linear(x.float(), weight)``
    in one launch (the cast of x folded into the GEMV)."""
    T, D = x.shape
    E = weight.shape[0]
    assert weight.shape[1] == D and weight.stride(1) == 1 and x.stride(1) == 1
    block_e, block_k = block_e or ROUTER_TILES["block_e"], block_k or ROUTER_TILES["block_k"]
    out = torch.empty((T, E), dtype=torch.float32, device=x.device)
    if T:
        _router_gemv_kernel[(T, triton.cdiv(E, block_e))](x, weight, out, D, E, x.stride(0), weight.stride(0),
                                                         out.stride(0), BLOCK_E=block_e, BLOCK_K=block_k, num_warps=4)
    return out


def supported(num_experts: int, n_group: int) -> bool:
    """Power-of-two expert count (a program holds one row as a whole tile) and power-of-two groups."""
    def pow2(n: int) -> bool:
        return n > 0 and n & (n - 1) == 0

    return pow2(num_experts) and num_experts <= 4096 and pow2(n_group)


def route(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, n_group: int, topk_group: int,
          norm: bool, scaling: float, sqrt_softplus: bool = False,
          n_shared: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] fp32 -> (weights [T, top_k + n_shared] fp32, ids [T, top_k + n_shared] int64); the last
    ``n_shared`` columns are the shared experts ``E + j`` with weight 1 (``kernels.fused_moe.append_shared``)."""
    T, E = logits.shape
    logits = logits.float()
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    w = torch.empty((T, top_k + n_shared), dtype=torch.float32, device=logits.device)
    ids = torch.empty((T, top_k + n_shared), dtype=torch.int64, device=logits.device)
    if T:
        _route_kernel[(T,)](logits, logits if bias is None else bias.float().contiguous(), w, ids, logits.stride(0),
                            float(scaling), E=E, TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k), N_GROUP=n_group,
                            PER=E // n_group, TOPK_GROUP=topk_group, HAS_BIAS=bias is not None, NORM=norm, SQRT_SOFTPLUS=sqrt_softplus,
                            N_SHARED=n_shared, S_PAD=triton.next_power_of_2(max(1, n_shared)),
                            num_warps=4 if E >= 256 else 1)
    return w, ids
