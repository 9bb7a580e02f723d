"""Routed experts with block-scaled FP8 weights (``--quantization fp8-block``): the fused MoE multiplies them natively.

:class:`Fp8BlockExperts` replaces a ``models.common.layers.RoutedExperts`` (same ``forward(x, ids, weights)``):
``gate_up [E, 2I, D]`` and ``down [E, D, I]`` in ``float8_e4m3fn`` with per-expert 128x128 block scales
``[E, ceil(2I/128), ceil(D/128)]`` / ``[E, ceil(D/128), ceil(I/128)]``.

Definition (:func:`fp8_block_experts_reference`, plain torch, any device): for each (token, slot) pair routed to
expert ``e``: ``gu = fp8_block_linear(x[t], gate_up[e])`` (``kernels.fp8_block``: activation quantized per token and
128-group, output in x's dtype), ``h = round(silu(gate) * up)`` computed in fp32 from the rounded ``gate``/``up``,
``y = fp8_block_linear(h, down[e])`` in x's dtype, and ``out[t] = sum_slots w * y`` in fp32, rounded once. The
reference over the dequantized weights (``models.common.moe.grouped_expert_mlp``) differs from it by the
activation quantization only (tests bound the gap).

Fused path (CUDA sm89+, Triton): the per-token-group quantizer on ``x``, ``kernels.fused_moe.align_pairs``, one
grouped block-FP8 GEMM with SwiGLU fused (``kernels.triton.fp8_block_moe``), the quantizer on the ``[P, I]``
activations, one grouped GEMM with the routing weight fused, ``moe_sum``: six launches, no host sync (CUDA-graph
capturable); up to :data:`FUSE_QUANT_MAX_TOKENS` tokens the GEMMs quantize their rows themselves (four launches).
Shared experts stay a separate MLP of :class:`~torchinferno.kernels.fp8_block.Fp8BlockLinear`s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torchinferno.errors import ConfigError
from torchinferno.kernels.fp8_block import (
    FP8_BLOCK_KERNELS,
    GROUP,
    dequantize_weight_blocks,
    fp8_block_linear_reference,
    quantize_weight_blocks,
    triton_supported,
)

FUSE_QUANT_MAX_TOKENS = 16  # up to here the grouped GEMMs quantize their rows themselves (decode: 4 launches, not 6)

__all__ = ["Fp8BlockExperts", "fp8_block_experts_reference", "fused_fp8_block_experts", "swap_experts_for_fp8_block",
           "quantize_expert_blocks"]


def quantize_expert_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[E, N, K]`` float -> (``[E, N, K]`` e4m3, ``[E, ceil(N/128), ceil(K/128)]`` fp32), expert by expert, written
    into the outputs (no second copy of the FP8 bytes: a V3 layer's gate_up is 7.5 GB of them)."""
    E, N, K = w.shape
    q = torch.empty(E, N, K, dtype=torch.float8_e4m3fn, device=w.device)
    s = torch.empty(E, -(-N // GROUP), -(-K // GROUP), dtype=torch.float32, device=w.device)
    for e in range(E):
        q[e], s[e] = quantize_weight_blocks(w[e])
    return q, s


def fp8_block_experts_reference(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                                gate_up_s: torch.Tensor, down: torch.Tensor, down_s: torch.Tensor) -> torch.Tensor:
    """x [T, D], ids [T, k], weights [T, k], gate_up [E, 2I, D] e4m3 (+ scales), down [E, D, I] e4m3 (+ scales)
    -> [T, D] in x.dtype (module docstring). Ids outside ``[0, E)`` contribute 0. Loops over the experts hit."""
    T, k = ids.shape
    E = gate_up.shape[0]
    inter = gate_up.shape[1] // 2
    out = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
    flat = ids.reshape(-1)
    for e in torch.unique(flat[(flat >= 0) & (flat < E)]).tolist():
        pairs = (flat == e).nonzero().flatten()  # ascending pair ids
        tok = pairs // k
        gu = fp8_block_linear_reference(x[tok], gate_up[e], gate_up_s[e])  # [n, 2I] x.dtype
        h = (F.silu(gu[:, :inter].float()) * gu[:, inter:].float()).to(x.dtype)
        y = fp8_block_linear_reference(h, down[e], down_s[e])  # [n, D] x.dtype
        out.index_add_(0, tok, y.float() * weights.reshape(-1)[pairs].float()[:, None])
    return out.to(x.dtype)


def fused_fp8_block_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                            gate_up_s: torch.Tensor, down: torch.Tensor, down_s: torch.Tensor,
                            configs: tuple[dict, dict] | None = None, may_drop: bool = False,
                            quant_inline: bool | None = None) -> torch.Tensor:
    """:func:`fp8_block_experts_reference` through the Triton kernels (module docstring); ``configs`` = (gate_up
    tiles, down tiles) with ``BLOCK_M``, ``BLOCK_N``, ``GROUP_M``, ``num_warps``, ``num_stages`` (``BLOCK_K`` is
    128). ``may_drop``: ids outside ``[0, E)`` may occur (their rows are zeroed). ``quant_inline``: the GEMMs quantize
    their rows themselves (the same codes as the quantizer launches); None: up to :data:`FUSE_QUANT_MAX_TOKENS`."""
    from torchinferno.kernels import fused_moe
    from torchinferno.kernels.triton import fused_moe as tk
    from torchinferno.kernels.triton.fp8_block import quantize_fp8_groups_triton
    from torchinferno.kernels.triton.fp8_block_moe import moe_down_fp8, moe_gate_up_fp8

    T, top_k = ids.shape
    E, two_i, D = gate_up.shape
    if configs is None:
        P = T * top_k
        configs = (fused_moe.config_for(P, E, two_i // 2, D, gate_up.dtype),
                   fused_moe.config_for(P, E, D, two_i // 2, gate_up.dtype))
    c1, c2 = configs
    inline = T <= FUSE_QUANT_MAX_TOKENS if quant_inline is None else quant_inline  # no quantizer launches
    x = x.contiguous()
    xq, xs = (x, None) if inline else quantize_fp8_groups_triton(x)  # [T, D] e4m3, [T, D/128]
    sp1, be1, n1 = fused_moe.align_pairs(ids, E, c1["BLOCK_M"])
    act = moe_gate_up_fp8(xq, xs, gate_up, gate_up_s, sp1, be1, n1, top_k, c1, x.dtype, zero=may_drop)  # [P, I]
    # rows of dropped pairs: zero with may_drop, never read
    aq, a_s = (act, None) if inline else quantize_fp8_groups_triton(act)
    sp2, be2, n2 = (sp1, be1, n1) if c2["BLOCK_M"] == c1["BLOCK_M"] else fused_moe.align_pairs(ids, E, c2["BLOCK_M"])
    y = moe_down_fp8(aq, a_s, down, down_s, weights.reshape(-1).float().contiguous(), sp2, be2, n2, c2, x.dtype,
                     zero=may_drop)  # [P, D] fp32
    return tk.moe_sum(y, top_k, x.dtype)


class Fp8BlockExperts(nn.Module):
    """Block-FP8 routed experts (buffers, inference only); ``forward(x [T, D], ids [T, k], weights [T, k]) -> [T, D]``.

    ``kernel``: ``"triton"`` (the fused path on CUDA sm89+), ``"torch"`` (:func:`fp8_block_experts_reference`),
    ``"auto"``. ``moe_backend = "torch"`` (``models.common.moe.set_moe_backend``) takes the reference on CUDA too.
    """

    def __init__(self, gate_up: torch.Tensor, gate_up_s: torch.Tensor, down: torch.Tensor, down_s: torch.Tensor,
                 kernel: str = "auto", ops=None):
        super().__init__()
        if kernel not in FP8_BLOCK_KERNELS:
            raise ConfigError(f"unknown FP8 block kernel {kernel!r}; valid: {', '.join(FP8_BLOCK_KERNELS)}")
        E, two_i, D = gate_up.shape
        for name, w, s in (("gate_up", gate_up, gate_up_s), ("down", down, down_s)):
            want = (E, -(-w.shape[1] // GROUP), -(-w.shape[2] // GROUP))
            if w.dtype != torch.float8_e4m3fn or tuple(s.shape) != want:
                raise ConfigError(f"FP8 block experts' {name}: need float8_e4m3fn weights [E, N, K] with scales "
                                  f"{list(want)}, got {w.dtype} {list(w.shape)} and scales {list(s.shape)}")
        if tuple(down.shape) != (E, D, two_i // 2):
            raise ConfigError(f"FP8 block experts: down {list(down.shape)} does not match gate_up {list(gate_up.shape)}")
        self.register_buffer("gate_up_fp8", gate_up.contiguous())  # [E, 2I, D]
        self.register_buffer("gate_up_scale_inv", gate_up_s.float().contiguous())  # [E, 2I/128, D/128]
        self.register_buffer("down_fp8", down.contiguous())  # [E, D, I]
        self.register_buffer("down_scale_inv", down_s.float().contiguous())  # [E, D/128, I/128]
        if kernel == "triton" and not triton_supported(gate_up.device):
            raise ConfigError(f"FP8 block kernel 'triton' needs a CUDA device of compute capability >= 8.9 with "
                              f"Triton (device {gate_up.device}); valid here: torch, auto")
        self.kernel = ("triton" if triton_supported(gate_up.device) else "torch") if kernel == "auto" else kernel
        self.moe_backend = "auto"
        self.ops = ops  # the replaced RoutedExperts' ops module (read by SparseMoE's path checks)
        self.configs: tuple[dict, dict] | None = None  # fixed (gate_up, down) tiles; None: the fused MoE's lookup

    @classmethod
    def from_experts(cls, experts: nn.Module, kernel: str = "auto") -> "Fp8BlockExperts":
        """Quantize a ``RoutedExperts``' ``gate_up_proj [E, 2I, D]`` / ``down_proj [E, D, I]`` to 128x128 blocks."""
        gu, gs = quantize_expert_blocks(experts.gate_up_proj.detach())
        dn, ds = quantize_expert_blocks(experts.down_proj.detach())
        return cls(gu, gs, dn, ds, kernel, getattr(experts, "ops", None))

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        from torchinferno.kernels import triton as tri

        args = (self.gate_up_fp8, self.gate_up_scale_inv, self.down_fp8, self.down_scale_inv)
        if self.kernel == "triton" and self.moe_backend == "auto" and tri.usable(x):
            return fused_fp8_block_experts(x, ids, weights, *args, configs=self.configs)
        return fp8_block_experts_reference(x, ids, weights, *args)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [E, 2I, D], down [E, D, I]) in ``dtype``: the weights this module multiplies by."""
        return (dequantize_weight_blocks(self.gate_up_fp8, self.gate_up_scale_inv, dtype),
                dequantize_weight_blocks(self.down_fp8, self.down_scale_inv, dtype))

    def extra_repr(self) -> str:
        E, two_i, D = self.gate_up_fp8.shape
        return f"experts={E}, hidden={D}, inter={two_i // 2}, fp8_e4m3 128x128 blocks, kernel={self.kernel}"


def swap_experts_for_fp8_block(model: nn.Module, kernel: str = "auto",
                               kept: dict[str, tuple[torch.Tensor, ...]] | None = None) -> list[str]:
    """Replace every module of exact type ``RoutedExperts`` by :class:`Fp8BlockExperts` (in place). ``kept``:
    qualified name -> ``(gate_up, gate_up_s, down, down_s)`` used as they are (a checkpoint's blocks; popped), else
    the loaded weights are quantized. Returns the names swapped."""
    from torchinferno.models.common.layers import RoutedExperts

    kept = {} if kept is None else kept
    swapped = []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is not RoutedExperts:
                continue
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            dev = child.gate_up_proj.device
            if name in kept:
                new = Fp8BlockExperts(*(t.to(dev) for t in kept.pop(name)), kernel=kernel, ops=child.ops)
            else:
                new = Fp8BlockExperts.from_experts(child, kernel)
            setattr(parent, child_name, new)
            swapped.append(name)
    return swapped
