"""The synthetic reference of ``profile-pattern --hidden-size H --tokens T`` (no model needed).

``PatternBlock`` is the decoder-layer slice the library patterns replace, written the way the
families' ``raw_ops`` write it: residual add, RMSNorm (normalize in fp32, cast back, weight),
the merged gate/up projection and SwiGLU::

    h = x + residual                                   # [T, H]
    n = w * (h32 * rsqrt(mean(h32^2) + eps)).to(dtype) # [T, H]
    gate, up = (n @ gate_up_weight.T).chunk(2, -1)     # [T, I] each
    return silu(gate) * up, h                          # [T, I], [T, H]

so ``fused-rmsnorm-swiglu`` matches it once and ``swiglu`` matches its activation once.
Weights and inputs are drawn from generators seeded with ``seed``: the same arguments give the
same block and inputs on every run (what ``pattern_repro.py`` relies on).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from torchinferno.errors import ConfigError


@dataclass
class PatternShape:
    hidden_size: int
    tokens: int = 16
    intermediate_size: int | None = None  # default: hidden_size
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    eps: float = 1e-6

    def validate(self) -> "PatternShape":
        from torchinferno.checkpoint.auto import resolve_dtype
        from torchinferno.cli.common import check_device

        for name in ("hidden_size", "tokens"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.intermediate_size is not None and self.intermediate_size < 1:
            raise ConfigError(f"--intermediate-size must be >= 1, got {self.intermediate_size}")
        resolve_dtype(self.dtype)
        check_device(self.device)
        return self

    @property
    def inter(self) -> int:
        return self.intermediate_size or self.hidden_size

    def to_dict(self) -> dict:
        return asdict(self)


class PatternBlock(nn.Module):
    """Residual add + RMSNorm + gate/up projection + SwiGLU (see the module docstring)."""

    def __init__(self, hidden: int, inter: int, eps: float, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.eps = eps
        self.norm_weight = nn.Parameter(torch.rand(hidden, generator=g) + 0.5)  # [H]
        self.gate_up_weight = nn.Parameter(torch.randn(2 * inter, hidden, generator=g) * hidden ** -0.5)  # [2I, H]

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + residual
        hf = h.float()
        n = self.norm_weight * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + self.eps)).to(h.dtype)
        gate, up = F.linear(n, self.gate_up_weight).chunk(2, dim=-1)
        return F.silu(gate) * up, h


def build_block(shape: PatternShape) -> tuple[PatternBlock, tuple[torch.Tensor, torch.Tensor]]:
    """(block on ``shape.device`` in ``shape.dtype``, (x [T, H], residual [T, H]))."""
    from torchinferno.checkpoint.auto import resolve_dtype

    dtype = resolve_dtype(shape.dtype)
    block = PatternBlock(shape.hidden_size, shape.inter, shape.eps, shape.seed).to(device=shape.device, dtype=dtype).eval()
    g = torch.Generator().manual_seed(shape.seed + 1)
    x, res = (torch.randn(shape.tokens, shape.hidden_size, generator=g).to(device=shape.device, dtype=dtype) for _ in range(2))
    return block, (x, res)


def trace_block(shape: PatternShape):
    """(GraphModule of the block with node ids, its inputs)."""
    from torchinferno.graph.capture import trace_with_make_fx

    block, args = build_block(shape)
    return trace_with_make_fx(block, args, module=block), args
