"""What the Helion provider can replace, and each ``--candidate``'s standalone reference graph.

A Helion *template* is a graph-library pattern (``graph.patterns``) whose replacement custom op
has a Helion kernel in ``kernels/helion_ops.py``: a site of the pattern becomes the custom op
(as for the ``custom-op`` provider) and the custom op's call is then pointed at the Helion
kernel (as ``torch-rewrite`` points it at torch code). ``helion_replacements`` is that last map;
it is the only function here that imports Helion.

``--candidate NAME`` (``helion-candidate``, ``helion-search-fx``) names a small reference
function written the way model code writes it, traced with ``make_fx`` on meta tensors at
``[batch_size * tokens, hidden_size]`` (no memory is touched, whatever the shape):

* ``swiglu``:  ``gate_up [N, 2H] -> silu(gate) * up [N, H]``;
* ``rms-norm``: ``x [N, H], weight [H] -> RMSNorm(x) [N, H]`` (fp32 math, eps 1e-6);
* ``fused-rmsnorm-swiglu``: ``PatternBlock`` (residual add + RMSNorm + gate/up GEMM + SwiGLU,
  intermediate size ``--intermediate-size`` or H); it also contains an rms-norm and a swiglu site.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import fx

from torchinferno.errors import ConfigError

# graph patterns whose replacement op has a Helion kernel (search order: small first)
TEMPLATE_PATTERNS = ("swiglu", "rms-norm", "fused-rmsnorm-swiglu")
CANDIDATES = {
    "swiglu": "silu(gate) * up over a merged gate/up projection output gate_up [N, 2H]",
    "rms-norm": "RMSNorm of x [N, H] with weight [H] (fp32 math)",
    "fused-rmsnorm-swiglu": "residual add + RMSNorm + gate/up projection + SwiGLU at [N, H] (GEMM stays torch)",
}
EPS = 1e-6


@dataclass
class CandidateShape:
    candidate: str = "swiglu"
    batch_size: int = 1
    tokens: int = 32
    hidden_size: int = 4096
    intermediate_size: int | None = None  # fused-rmsnorm-swiglu only (default: hidden_size)
    dtype: str = "float32"

    def validate(self) -> "CandidateShape":
        from torchinferno.checkpoint.auto import resolve_dtype

        if self.candidate not in CANDIDATES:
            raise ConfigError(f"unknown Helion candidate '{self.candidate}' (valid: {', '.join(CANDIDATES)})")
        for name in ("batch_size", "tokens", "hidden_size"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.intermediate_size is not None and self.intermediate_size < 1:
            raise ConfigError(f"--intermediate-size must be >= 1, got {self.intermediate_size}")
        resolve_dtype(self.dtype)
        return self

    @property
    def rows(self) -> int:
        return self.batch_size * self.tokens

    def to_dict(self) -> dict:
        return asdict(self)


def _swiglu_ref(gate_up: torch.Tensor) -> torch.Tensor:  # [N, 2H] -> [N, H]
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _rms_norm_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # [N, H], [H] -> [N, H]
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def candidate_graph(shape: CandidateShape) -> fx.GraphModule:
    """The candidate's reference ATen graph at ``shape`` (traced on meta tensors; node ids set)."""
    from torchinferno.checkpoint.auto import resolve_dtype
    from torchinferno.graph.capture import trace_with_make_fx

    shape.validate()
    dtype, n, h = resolve_dtype(shape.dtype), shape.rows, shape.hidden_size

    def meta(*dims):
        return torch.empty(*dims, dtype=dtype, device="meta")

    if shape.candidate == "swiglu":
        return trace_with_make_fx(_swiglu_ref, (meta(n, 2 * h),), fake=True)
    if shape.candidate == "rms-norm":
        return trace_with_make_fx(_rms_norm_ref, (meta(n, h), meta(h)), fake=True)
    from torchinferno.workbench.pattern_block import PatternBlock

    with torch.device("meta"):
        block = PatternBlock(h, shape.intermediate_size or h, EPS, seed=0).to(dtype)
    return trace_with_make_fx(block, (meta(n, h), meta(n, h)), fake=True, module=block)


def helion_replacements(effort: str = "quick") -> dict[object, Callable]:
    """``{custom op overload: Helion-backed callable}`` with the custom op's signature (imports Helion)."""
    from torchinferno.kernels import custom_ops, helion_ops

    if effort not in helion_ops.EFFORTS:
        raise ConfigError(f"unknown autotune effort '{effort}' (valid: {', '.join(helion_ops.EFFORTS)})")

    def helion_swiglu_activation(gate_up):
        return helion_ops.swiglu_activation(gate_up, effort=effort)

    def helion_rms_norm(x, weight, eps):
        return helion_ops.rms_norm_op(x, weight, eps, effort=effort)

    def helion_fused_rmsnorm_swiglu(x, residual, norm_weight, gate_up_weight, eps):
        h = x + residual
        return helion_swiglu_activation(F.linear(helion_rms_norm(h, norm_weight, eps), gate_up_weight)), h

    return {custom_ops.OPS["swiglu_activation"][0]: helion_swiglu_activation,
            custom_ops.OPS["rms_norm"][0]: helion_rms_norm,
            custom_ops.OPS["fused_rmsnorm_swiglu"][0]: helion_fused_rmsnorm_swiglu}


# the Helion-backed callables above -> the helion_ops op they call (for kernel reports)
HELION_OPS = {"helion_swiglu_activation": ("swiglu_activation",), "helion_rms_norm": ("rms_norm",),
              "helion_fused_rmsnorm_swiglu": ("rms_norm", "swiglu_activation")}
