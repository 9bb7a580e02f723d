"""Same contract as ``raw_ops``, norms / activation routed to ``torchinferno.kernels``; the clamped experts
(no kernel entry yet) use the reference."""

from __future__ import annotations

from torchinferno.models.common.norm_act_ops import Fused
from torchinferno.models.deepseek_v4 import raw_ops

rms_norm = Fused.rms_norm
add_rms_norm = Fused.add_rms_norm
silu_and_mul = Fused.silu_and_mul
clamped_experts = raw_ops.clamped_experts

NAME = "fused"
