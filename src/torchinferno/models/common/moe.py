"""Mixture-of-experts pieces shared by DeepSeek-style families: routing and grouped expert compute.

Routing (DeepSeek-V3 ``noaux_tc``): sigmoid scores; a per-expert correction bias is added for
*selection only*; experts are split into ``n_group`` groups, a group scores the sum of its top-2
biased scores, the best ``topk_group`` groups stay eligible, and the top ``top_k`` experts among
them are chosen. The combine weights are the *unbiased* sigmoid scores of the chosen experts,
normalized to sum 1 (``norm_topk_prob``) and multiplied by ``routed_scaling_factor``.

Expert compute is grouped by expert: the (token, slot) pairs are sorted by expert id and each
expert that received tokens runs one GEMM pair over its contiguous slice (a Python loop over
*experts*, never over tokens). Weights use the fused 3-D layout ``gate_up [E, 2I, D]`` (gate rows
first) and ``down [E, D, I]``, the layout transformers keeps in memory.

Fake tracing (``make_fx`` with FakeTensors, no data): the per-expert token counts are data, so the
grouped loop cannot be traced. Under fake tensors (and only there) ``grouped_expert_mlp`` takes a
routing-independent form: every expert runs over all tokens and its output is scaled by the
token's combine weight for that expert (0 when not routed there). The result is the same sum,
so the traced graph is a correct program for any routing; eager and real-tensor traces are
unchanged (they never take this branch).

Fused path (CUDA): :func:`fused_expert_mlp` is the same contract computed by ``kernels.fused_moe`` (pairs sorted
and padded per expert on the device, one grouped Triton GEMM with SwiGLU fused, one with the routing weight fused,
one launch for the sum over the top-k and the cast; a batch-1 step takes two per-token kernels and nothing else,
``kernels.triton.moe_small``): no host sync, so a decode step with MoE layers is CUDA-graph capturable. It applies
to CUDA tensors outside tracing and batch-invariant mode; elsewhere it is :func:`grouped_expert_mlp`, which stays
the reference (``moe_backend = "torch"`` on a :class:`~torchinferno.models.common.layers.RoutedExperts` selects
it on CUDA too; :func:`set_moe_backend`). Routing (:func:`route_sigmoid_grouped`) is device tensor ops (no host
sync); :func:`route_fused` runs it as one Triton launch on CUDA (``kernels.triton.moe_routing``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def route_sigmoid_grouped(
    router_logits: torch.Tensor,  # [T, E] (computed in fp32)
    correction_bias: torch.Tensor | None,  # [E] or None
    top_k: int,
    n_group: int,
    topk_group: int,
    norm_topk_prob: bool,
    routed_scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (weights [T, top_k] fp32, expert ids [T, top_k] int64)."""
    T, E = router_logits.shape
    scores = router_logits.float().sigmoid()
    choice = scores if correction_bias is None else scores + correction_bias.float()
    if n_group > 1 and topk_group < n_group:
        group_scores = choice.view(T, n_group, E // n_group).topk(2, dim=-1).values.sum(-1)  # [T, G]
        keep_groups = group_scores.topk(topk_group, dim=-1, sorted=False).indices  # [T, topk_group]
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep_groups, True)
        expert_mask = group_mask.repeat_interleave(E // n_group, dim=1)  # [T, E]
        choice = choice.masked_fill(~expert_mask, float("-inf"))
    ids = choice.topk(top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, ids)
    if norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, ids


def route_fused(
    router_logits: torch.Tensor,  # [T, E] fp32
    correction_bias: torch.Tensor | None,
    top_k: int,
    n_group: int,
    topk_group: int,
    norm_topk_prob: bool,
    routed_scaling_factor: float,
    n_shared: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`route_sigmoid_grouped` in one Triton launch on CUDA (``kernels.triton.moe_routing``), else itself.

    ``n_shared``: ``[T, top_k + n_shared]``, shared experts ``E + j`` appended with weight 1 (the fused MoE's
    shared experts, :func:`fused_with_shared`)."""
    from torchinferno.kernels import triton as tri
    from torchinferno.kernels.fused_moe import append_shared

    E = router_logits.shape[-1]
    if tri.usable(router_logits):
        from torchinferno.kernels.triton import moe_routing

        if moe_routing.supported(E, n_group):
            return moe_routing.route(router_logits, correction_bias, top_k, n_group, topk_group, norm_topk_prob,
                                     routed_scaling_factor, n_shared=n_shared)
    w, ids = route_sigmoid_grouped(router_logits, correction_bias, top_k, n_group, topk_group, norm_topk_prob,
                                   routed_scaling_factor)
    return append_shared(w, ids, E, n_shared) if n_shared else (w, ids)


def grouped_expert_mlp(
    x: torch.Tensor,  # [T, D]
    expert_ids: torch.Tensor,  # [T, K]
    weights: torch.Tensor,  # [T, K] fp32
    gate_up: torch.Tensor,  # [E, 2I, D]
    down: torch.Tensor,  # [E, D, I]
    act_and_mul: Callable[[torch.Tensor], torch.Tensor],  # [N, 2I] -> [N, I]
    row_tile: int | None = None,
) -> torch.Tensor:  # [T, D]
    """Sum over each token's experts of ``weight * down(act(gate) * up)``, grouped by expert.

    ``row_tile``: run each expert's GEMMs on fixed row tiles (``kernels.batch_invariant``: a token's result
    then does not depend on how many other tokens chose the same expert)."""
    from torchinferno.kernels.batch_invariant import tiled_linear

    if _is_fake(x) and not torch.compiler.is_compiling():
        return _all_experts_mlp(x, expert_ids, weights, gate_up, down, act_and_mul)
    T, K = expert_ids.shape
    flat = expert_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # pairs sorted by expert id
    token_of = order // K  # [T*K] source token of each sorted pair
    w_sorted = weights.reshape(-1)[order]
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()  # one host sync per layer
    xs = x[token_of]  # [T*K, D] tokens gathered in expert order
    out = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        seg = slice(start, start + n)
        h = act_and_mul(tiled_linear(xs[seg], gate_up[e], row_tile))
        y = tiled_linear(h, down[e], row_tile)
        out.index_add_(0, token_of[seg], y.float() * w_sorted[seg, None])
        start += n
    return out.to(x.dtype)


def fused_expert_mlp(
    x: torch.Tensor,  # [T, D]
    expert_ids: torch.Tensor,  # [T, K]
    weights: torch.Tensor,  # [T, K] fp32
    gate_up: torch.Tensor,  # [E, 2I, D]
    down: torch.Tensor,  # [E, D, I]
    act_and_mul: Callable[[torch.Tensor], torch.Tensor],  # must be silu(gate) * up (the fused kernel's epilogue)
    row_tile: int | None = None,
) -> torch.Tensor:  # [T, D]
    """:func:`grouped_expert_mlp` through the fused Triton MoE where it applies (CUDA, no row tiles), else itself."""
    from torchinferno.kernels import fused_moe

    if row_tile is None and fused_moe.usable(x, gate_up):
        return fused_moe.fused_experts(x, expert_ids, weights, gate_up, down)
    return grouped_expert_mlp(x, expert_ids, weights, gate_up, down, act_and_mul, row_tile)


def _plain_fused_experts(ex: torch.nn.Module) -> bool:
    """The plain unsharded ``RoutedExperts`` on the fused path (``moe_backend`` "auto", no batch-invariant row tiles):
    what the fused MoE kernels read directly."""
    from torchinferno.models.common.layers import RoutedExperts

    return type(ex) is RoutedExperts and ex.moe_backend == "auto" and ex.row_tile is None


def fused_shared_count(moe_block: torch.nn.Module, x: torch.Tensor) -> int:
    """How many shared experts a ``SparseMoE`` block serves inside its fused MoE for input ``x``, 0 when the
    separate shared MLP runs: the ops module opts in (``FUSE_SHARED_EXPERTS``), the block's ``fuse_shared`` is True,
    or None and ``x`` has at most ``kernels.fused_moe.policy().shared_fuse_max_tokens`` rows (above it the shared
    MLP's dense GEMMs beat the grouped kernel: 0.66 vs 0.95 ms at 256 tokens on the H200, run 42),
    its experts are the plain unsharded ``RoutedExperts`` on the fused path (``moe_backend`` "auto", no row tiles),
    and the shared MLP is a plain bias-free ``GatedMLP`` of ``ns`` x the expert width in x's dtype (not sharded or
    swapped by a runtime linear replacement)."""
    from torchinferno.kernels import fused_moe
    from torchinferno.models.common.layers import GatedMLP

    sh, ex = moe_block.shared_experts, moe_block.experts
    if sh is None or moe_block.fuse_shared is False or not getattr(ex.ops, "FUSE_SHARED_EXPERTS", False):
        return 0
    if moe_block.fuse_shared is None and x.shape[0] > fused_moe.policy().shared_fuse_max_tokens:
        return 0
    if not _plain_fused_experts(ex):
        return 0
    if not fused_moe.usable(x, ex.gate_up_proj) or type(sh) is not GatedMLP:
        return 0
    gu, dn = sh.gate_up_proj, sh.down_proj
    if type(gu) is not torch.nn.Linear or type(dn) is not torch.nn.Linear or gu.bias is not None or dn.bias is not None:
        return 0
    _, two_i, D = ex.gate_up_proj.shape
    wg, wd = gu.weight, dn.weight
    ok = (wg.dtype == wd.dtype == x.dtype and wg.dim() == wd.dim() == 2 and wg.stride(1) == 1 and wd.stride(1) == 1
          and wg.shape[1] == D and wg.shape[0] % two_i == 0 and wd.shape == (D, wg.shape[0] // 2))
    return wg.shape[0] // two_i if ok else 0


def fused_with_shared(moe_block: torch.nn.Module, x: torch.Tensor, ids: torch.Tensor,
                      weights: torch.Tensor) -> torch.Tensor:  # [T, D]
    """A ``SparseMoE``'s routed + shared experts through one fused MoE (ids / weights ``[T, k + ns]`` with the
    shared experts appended, :func:`route_fused`); == routed experts + the shared ``GatedMLP``."""
    from torchinferno.kernels import fused_moe

    ex, sh = moe_block.experts, moe_block.shared_experts
    return fused_moe.fused_experts(x, ids, weights, ex.gate_up_proj, ex.down_proj,
                                   shared=(sh.gate_up_proj.weight, sh.down_proj.weight))


def fused_decode_moe(moe_block: torch.nn.Module, h: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                     out: torch.Tensor, pdl: bool = False) -> torch.Tensor | None:
    """A batch-1 step's whole MoE sublayer in three launches: ``out = h + moe_block(rms_norm(h) * norm_weight)``
    (h, out [1, D], distinct) with the norm fused into the routing GEMV and the gate/up kernel (the normalized input
    never rounded, as the decode GEMVs' prologue) and the residual add into the down kernel (the MoE output rounded,
    then the sum: the unfused add's roundings). Returns ``out``, or None where it does not apply (then the caller
    runs the norm, the module and the add): one token on the per-token kernels
    (``kernels.fused_moe.policy().small_m_max_tokens``), the plain ``RoutedExperts`` on the fused path, the one-launch
    routing, the shared experts (if any) served inside the fused MoE (:func:`fused_shared_count`), and no hooks on
    the block or its router (they would not see this call). ``pdl``: all three launches with programmatic dependent
    launch (a Hopper step's chain)."""
    from torchinferno.kernels import fused_moe

    ex, gate, sh = moe_block.experts, moe_block.gate, moe_block.shared_experts
    hooked = any(m._forward_hooks or m._forward_pre_hooks for m in (moe_block, gate, ex))
    if (h.shape[0] != 1 or hooked or not _plain_fused_experts(ex) or fused_moe.policy().small_m_max_tokens < 1
            or not fused_moe.usable(h, ex.gate_up_proj) or not gate.fused_route_applies(h)):
        return None
    ns = fused_shared_count(moe_block, h)
    if sh is not None and not ns:
        return None
    routed = gate.fused_route(h, ns, rms=(norm_weight, eps), pdl=pdl)
    if routed is None:
        return None
    from torchinferno.kernels.triton import moe_small

    weights, ids = routed
    tiles = fused_moe.policy().small_m_tiles
    return moe_small.small_m_experts(h, ids, weights, ex.gate_up_proj, ex.down_proj, tiles["gate_up"], tiles["down"],
                                     shared=(sh.gate_up_proj.weight, sh.down_proj.weight) if ns else None,
                                     rms=(norm_weight, eps), residual=h, out=out, pdl=pdl)


def fused_routed_aligned(moe_block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:  # [T, D] or None
    """A ``SparseMoE`` step on the fused grouped path with its routing and the sort/pad in ONE launch (the router's
    ``fused_route(align=...)``), then the two grouped GEMMs and the top-k sum (+ the shared MLP when it runs apart);
    None where that does not apply: not the plain ``RoutedExperts`` on the fused path, the per-token kernels'
    token counts (``kernels.fused_moe.policy().small_m_max_tokens``: no sort/pad there), more pairs than the
    one-program sort/pad takes, or the router's one-launch form does not apply."""
    from torchinferno.kernels import fused_moe

    ex = moe_block.experts
    T = x.shape[0]
    if (not _plain_fused_experts(ex) or not getattr(ex.ops, "ROUTER_GEMV", False) or not fused_moe.usable(x, ex.gate_up_proj)
            or T <= fused_moe.policy().small_m_max_tokens or not moe_block.gate.fused_route_applies(x)):
        return None
    ns = fused_shared_count(moe_block, x)
    E = ex.gate_up_proj.shape[0]
    k = moe_block.gate.top_k + ns
    if T * k > fused_moe.ALIGN_KERNEL_MAX_PAIRS:
        return None
    configs = fused_moe.grouped_configs(T, k, ex.gate_up_proj, x.dtype)
    bm = configs[0]["BLOCK_M"]
    # through the router's forward (its hooks see the routing, as on every other path)
    weights, ids, *aligned = moe_block.gate(x, ns, align=(E + ns, bm, fused_moe.max_padded(T * k, E + ns, bm)))
    sh = moe_block.shared_experts
    shared = (sh.gate_up_proj.weight, sh.down_proj.weight) if ns else None
    y = fused_moe.fused_experts(x, ids, weights, ex.gate_up_proj, ex.down_proj, configs=configs, shared=shared,
                                aligned=tuple(aligned))
    return y if sh is None or ns else y + sh(x)


def set_moe_backend(model: torch.nn.Module, backend: str) -> int:
    """Set ``moe_backend`` ("auto": fused on CUDA, "torch": the grouped reference) on every expert module of
    ``model``; returns how many were set."""
    if backend not in ("auto", "torch"):
        raise ValueError(f"moe backend must be 'auto' or 'torch', got {backend!r}")
    n = 0
    for m in model.modules():
        if hasattr(m, "moe_backend"):
            m.moe_backend = backend
            n += 1
    return n


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


def _all_experts_mlp(x, expert_ids, weights, gate_up, down, act_and_mul) -> torch.Tensor:  # [T, D]
    """Routing-independent form of ``grouped_expert_mlp`` (no host sync: fake-traceable).

    Runs every expert over all ``T`` tokens (E times the routed FLOPs) and weights each output
    by the token's combine weight for that expert, accumulated in expert order like the grouped loop.
    """
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for e in range(gate_up.shape[0]):
        w_e = (weights * (expert_ids == e)).sum(-1)  # [T] fp32, 0 where expert e is not routed
        y = F.linear(act_and_mul(F.linear(x, gate_up[e])), down[e])  # [T, D]
        out = out + y.float() * w_e[:, None]
    return out.to(x.dtype)


def reference_moe(x, router_weight, correction_bias, gate_up, down, act_and_mul, top_k, n_group, topk_group,
                  norm_topk_prob, routed_scaling_factor) -> torch.Tensor:
    """Dense per-token reference of routing + experts (tests only; loops over tokens)."""
    logits = F.linear(x.float(), router_weight.float())
    w, ids = route_sigmoid_grouped(logits, correction_bias, top_k, n_group, topk_group, norm_topk_prob, routed_scaling_factor)
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(top_k):
            e = int(ids[t, j])
            out[t] += w[t, j] * F.linear(act_and_mul(F.linear(x[t : t + 1], gate_up[e])), down[e])[0].float()
    return out.to(x.dtype)
