"""Ops of promoted ``custom-op`` variants of this family (``workbench/promotion.py`` names this module).

The runtime form of a ``custom-op`` candidate for the ``fused-rmsnorm-swiglu`` / ``swiglu``
partitions: RMSNorm (with its residual add) and the SwiGLU activation are routed to the
``torch.ops.torchinferno`` custom ops (``kernels/custom_ops.py``; a registered CUDA kernel is used
without changing this module). The residual add + norm + gate/up GEMM fusion of the graph rewrite
spans two modules, so at runtime it stays as norm op -> Linear -> activation op. Every other op is
``fused_ops`` (the v1 ops). Imported only when a promoted variant names it.
"""

from __future__ import annotations

from torchinferno.kernels import custom_ops as _custom_ops  # noqa: F401  (registers torch.ops.torchinferno.*)
from torchinferno.models.common.norm_act_ops import CustomOp
from torchinferno.models.llama3.fused_ops import *  # noqa: F401,F403  (the rest of the contract)

rms_norm = CustomOp.rms_norm
add_rms_norm = CustomOp.add_rms_norm
silu_and_mul = CustomOp.silu_and_mul

NAME = "custom-op"
