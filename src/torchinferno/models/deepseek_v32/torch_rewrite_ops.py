"""Ops of promoted ``torch-rewrite`` variants of this family (``workbench/promotion.py`` names this module).

The runtime form of a ``torch-rewrite`` candidate: the partition's sites (RMSNorm with its
residual add, SwiGLU) as plain torch reference code (``kernels/reference.py``, fp32 math), no
custom op and no compiler. Every other op is ``fused_ops`` (the v1 ops).
"""

from __future__ import annotations

from torchinferno.models.common.norm_act_ops import TorchRewrite
from torchinferno.models.deepseek_v32.fused_ops import *  # noqa: F401,F403  (the rest of the contract)

rms_norm = TorchRewrite.rms_norm
add_rms_norm = TorchRewrite.add_rms_norm
silu_and_mul = TorchRewrite.silu_and_mul

NAME = "torch-rewrite"
