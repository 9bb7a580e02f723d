"""nn.Module building blocks shared by every family (the ops module is chosen by the family variant)."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from torchinferno.models.common.module_utils import KeepFP32


class RMSNorm(nn.Module):
    """RMSNorm whose math comes from the variant's ops module; optionally fuses the residual add."""

    def __init__(self, dim: int, eps: float, ops: ModuleType):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.ops = ops
        self.row_tile: int | None = None  # set by kernels.batch_invariant: normalize fixed row tiles

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Without residual: rms_norm(x). With: (rms_norm(x + residual), x + residual)."""
        if self.row_tile is not None:
            from torchinferno.kernels.batch_invariant import tiled_rows

            if residual is None:
                return tiled_rows(lambda t: self.ops.rms_norm(t, self.weight, self.eps), self.row_tile, x)
            return tiled_rows(lambda t, r: self.ops.add_rms_norm(t, r, self.weight, self.eps), self.row_tile, x, residual)
        if residual is None:
            return self.ops.rms_norm(x, self.weight, self.eps)
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)


class GatedMLP(nn.Module):
    """SwiGLU MLP with a merged gate/up projection: x [T, D] -> down(silu(gate) * up) [T, D]."""

    def __init__(self, hidden: int, inter: int, ops: ModuleType, bias: bool = False):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)
        self.ops = ops

    def forward(self, x):
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))


class DirectWeightLinear(nn.Linear):
    """An ``nn.Linear`` whose ``weight`` its owner reads directly instead of calling the module (MLA's
    ``kv_b_proj``, expanded or absorbed into attention).

    Runtime linear swaps (``kernels.module_swap.replace_linears``: CPU pre-packing, FP8, NVFP4)
    replace only modules of exact type ``nn.Linear``, so they leave this one, and its ``.weight``,
    in place. Checkpoint names and ``state_dict`` are those of a plain ``nn.Linear``.
    """


class FP32Linear(KeepFP32, nn.Linear):
    """An ``nn.Linear`` kept in fp32 in a bf16/fp16 model and run in fp32: ``x [..., K] -> fp32 [..., N]``.

    Not an exact ``nn.Linear`` either, so runtime linear swaps leave it alone (see
    :class:`DirectWeightLinear`). Used for the DSA indexer's ``weights_proj`` (transformers keeps it fp32).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = None if self.bias is None else self.bias.float()
        return torch.nn.functional.linear(x.float(), self.weight.float(), b)


class SigmoidRouter(KeepFP32, nn.Module):
    """fp32 router logits -> sigmoid scores; ``e_score_correction_bias`` steers selection only.

    ``weight`` and ``e_score_correction_bias`` stay fp32 when the model is cast to bf16/fp16
    (:class:`KeepFP32`), as transformers' ``_keep_in_fp32_modules_strict`` and DeepSeek keep them.

    ``forward(x [T, D]) -> (weights [T, k] fp32, expert ids [T, k])`` via the ops module's ``route``
    (group-limited when ``n_group > 1``). Ops modules with ``ROUTER_GEMV`` on CUDA, decode-sized steps: the
    logits and the routing in one Triton launch (``kernels.triton.moe_routing.router_route``).
    """

    def __init__(self, num_experts: int, hidden: int, top_k: int, n_group: int, topk_group: int,
                 norm_topk_prob: bool, scaling: float, ops: ModuleType):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        nn.init.normal_(self.weight, std=0.02)
        self.register_buffer("e_score_correction_bias", torch.zeros(num_experts), persistent=True)
        self.top_k, self.n_group, self.topk_group = top_k, n_group, topk_group
        self.norm_topk_prob, self.scaling = norm_topk_prob, scaling
        self.ops = ops
        self.row_tile: int | None = None  # set by kernels.batch_invariant: the router GEMM on fixed row tiles

    def forward(self, x, n_shared: int = 0, align: tuple[int, int, int] | None = None) -> tuple:
        """``n_shared > 0`` (ops modules with ``FUSE_SHARED_EXPERTS`` only): ``[T, k + n_shared]``, the shared
        experts ``E + j`` appended with weight 1 (``kernels.fused_moe.append_shared``). ``align`` (only where
        :meth:`fused_route_applies`): also the fused MoE's sort/pad from the same launch, a 5-tuple
        (``kernels.triton.moe_routing.router_route``)."""
        from torchinferno.kernels.batch_invariant import tiled_linear

        if align is not None:
            out = self.fused_route(x, n_shared, align)
            if out is None:
                raise RuntimeError("SigmoidRouter: align asked where the one-launch routing does not apply")
            return out
        extra = {"n_shared": n_shared} if n_shared else {}
        if self._gemv_applies(x):
            from torchinferno.kernels.triton import moe_routing

            if x.shape[0] <= moe_routing.ROUTER_GEMV_MAX_TOKENS:
                out = self.fused_route(x, n_shared)  # logits + routing: one launch
                if out is not None:
                    return out
                logits = moe_routing.router_logits(x, self.weight)  # x's cast folded into one fp32 GEMV launch
            else:
                logits = tiled_linear(x.float(), self.weight, None)
        else:
            logits = tiled_linear(x.float(), self.weight.float(), self.row_tile)
        return self.ops.route(logits, self.e_score_correction_bias, self.top_k, self.n_group, self.topk_group,
                              self.norm_topk_prob, self.scaling, **extra)

    def _gemv_applies(self, x) -> bool:
        from torchinferno.kernels import triton as tri

        return (getattr(self.ops, "ROUTER_GEMV", False) and self.row_tile is None and tri.usable(x) and x.dim() == 2
                and x.stride(1) == 1 and self.weight.dtype == torch.float32 and self.weight.stride(1) == 1)

    def fused_route_applies(self, x) -> bool:
        """The one-launch logits + routing applies: CUDA, opted in (``ROUTER_GEMV``), 1 to
        ``ROUTER_GEMV_MAX_TOKENS`` tokens, a supported expert count, the counters available."""
        from torchinferno.kernels.triton import moe_routing

        return (self._gemv_applies(x) and 0 < x.shape[0] <= moe_routing.ROUTER_GEMV_MAX_TOKENS
                and moe_routing.supported(self.weight.shape[0], self.n_group)
                and moe_routing.route_counters(x.device, x.shape[0]) is not None)

    def fused_route(self, x, n_shared: int = 0, align: tuple[int, int, int] | None = None,
                    rms: tuple[torch.Tensor, float] | None = None, pdl: bool = False) -> tuple | None:
        """:meth:`forward`'s one-launch logits + routing (``kernels.triton.moe_routing.router_route``; with ``align``
        also the fused MoE's sort/pad; with ``rms = (norm_weight, eps)`` of ``rms_norm(x) * norm_weight``), or None
        where it does not apply (:meth:`fused_route_applies`)."""
        from torchinferno.kernels.triton import moe_routing

        if not self.fused_route_applies(x):
            return None
        return moe_routing.router_route(x, self.weight, self.e_score_correction_bias, self.top_k, self.n_group,
                                        self.topk_group, self.norm_topk_prob, self.scaling, n_shared=n_shared,
                                        align=align, rms=rms, pdl=pdl)


class RoutedExperts(nn.Module):
    """All routed experts as two 3-D tensors (transformers' in-memory layout):
    gate_up [E, 2I, D] (gate rows first), down [E, D, I]; compute grouped by expert (ops)."""

    def __init__(self, num_experts: int, hidden: int, inter: int, ops: ModuleType):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, inter))
        nn.init.normal_(self.gate_up_proj, std=0.02)
        nn.init.normal_(self.down_proj, std=0.02)
        self.ops = ops
        self.row_tile: int | None = None  # set by kernels.batch_invariant
        self.moe_backend = "auto"  # "torch": the grouped reference even where the ops module fuses (moe.set_moe_backend)

    def forward(self, x, ids, weights):
        if self.moe_backend == "torch":
            from torchinferno.models.common.moe import grouped_expert_mlp

            return grouped_expert_mlp(x, ids, weights, self.gate_up_proj, self.down_proj, self.ops.silu_and_mul,
                                      row_tile=self.row_tile)
        if self.row_tile is not None:
            return self.ops.grouped_expert_mlp(x, ids, weights, self.gate_up_proj, self.down_proj,
                                               self.ops.silu_and_mul, row_tile=self.row_tile)
        return self.ops.grouped_expert_mlp(x, ids, weights, self.gate_up_proj, self.down_proj, self.ops.silu_and_mul)


class SparseMoE(nn.Module):
    """Sigmoid-routed MoE with optional shared experts; built from any DeepSeek-style config
    (``n_routed_experts``, ``moe_intermediate_size``, ``n_shared_experts``, ``num_experts_per_tok``,
    ``norm_topk_prob``, ``routed_scaling_factor``; ``n_group``/``topk_group`` default to 1)."""

    def __init__(self, cfg, ops: ModuleType):
        super().__init__()
        E, D, I = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate = SigmoidRouter(E, D, cfg.num_experts_per_tok, getattr(cfg, "n_group", 1), getattr(cfg, "topk_group", 1),
                                  cfg.norm_topk_prob, cfg.routed_scaling_factor, ops)
        self.experts = RoutedExperts(E, D, I, ops)
        shared = I * cfg.n_shared_experts
        self.shared_experts = GatedMLP(D, shared, ops) if shared else None
        # shared experts inside the fused MoE (CUDA + an ops module with FUSE_SHARED_EXPERTS): None = up to the
        # token threshold of kernels.fused_moe.policy(), True = at any token count, False = never
        self.fuse_shared: bool | None = None

    def forward(self, x):
        from torchinferno.models.common.moe import fused_routed_aligned, fused_shared_count, fused_with_shared

        y = fused_routed_aligned(self, x)  # decode-sized grouped steps: routing + sort/pad in one launch
        if y is not None:
            return y
        ns = fused_shared_count(self, x)
        if ns:  # routed + shared experts in one fused MoE (two grouped GEMM launches in all)
            weights, ids = self.gate(x, n_shared=ns)
            return fused_with_shared(self, x, ids, weights)
        weights, ids = self.gate(x)
        y = self.experts(x, ids, weights)
        return y if self.shared_experts is None else y + self.shared_experts(x)
