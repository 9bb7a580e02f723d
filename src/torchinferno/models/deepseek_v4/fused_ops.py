"""Same contract as ``raw_ops``, norms / activation routed to ``torchinferno.kernels``; the clamped experts run the
fused Triton MoE on CUDA (``kernels.fused_moe.fused_experts`` with the SwiGLU clamp: no host sync) and the
reference loop elsewhere. Decode steps take the static-shape path (``decode.py``) with the Triton sparse-sink
attention on CUDA; the CSA indexer scores through the Triton indexer kernel on CUDA."""

from __future__ import annotations

import torch

from torchinferno.kernels import fused_moe
from torchinferno.models.common.norm_act_ops import Fused
from torchinferno.models.deepseek_v4 import raw_ops

rms_norm = Fused.rms_norm
add_rms_norm = Fused.add_rms_norm
silu_and_mul = Fused.silu_and_mul

NAME = "fused"
# decode-only batches through models/deepseek_v4/decode.py: static shapes, no host sync (CUDA-graph capturable)
STATIC_DECODE = True
# ... whose attention is the Triton sparse-sink kernel on CUDA (kernels.sparse_sink_decode; the reference elsewhere)
SPARSE_SINK_DECODE = True
# the CSA indexer's scores through kernels.indexer_scores: Triton on CUDA, no [Q, Hi, n] logits (prefill and decode)
INDEXER_SCORES_KERNEL = True


def clamped_experts(x, ids, weights, gate_up, down, limit: float) -> torch.Tensor:
    """``raw_ops.clamped_experts`` (x [T, D], ids / weights [T, k] -> [T, D]), fused where it applies."""
    if fused_moe.usable(x, gate_up):
        return fused_moe.fused_experts(x, ids, weights, gate_up, down, limit=limit)
    return raw_ops.clamped_experts(x, ids, weights, gate_up, down, limit)
