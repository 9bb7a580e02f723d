"""What every lean decode step of a pre-norm GQA causal LM reads from the built model, extracted once; the fused
steps' one-row head."""

from __future__ import annotations

import torch
from torch import nn


def gemv_logits(hidden: torch.Tensor, head: torch.Tensor, pdl: bool, config: dict) -> torch.Tensor | None:
    """``hidden [1, D]`` -> fp32 logits ``[1, V]`` through the decode GEMV (cuBLAS streamed llama3's 1 GB head 5-8%
    slower at one row: runs 20-21), rounded to the activation dtype first as the module path's linear is; None for
    anything else (the model's linear runs)."""
    from torchinferno.kernels import api as kapi
    from torchinferno.kernels import triton as tri

    if hidden.shape[0] != 1 or hidden.dtype != head.dtype or not tri.usable(hidden):
        return None
    return kapi.decode_gemv(hidden.reshape(-1), head, pdl=pdl, config=config).float()[None]


class LeanDecodeStepBase:
    """Head counts, sizes, eps, attention scale, embedding and final-norm weight of ``model`` (read when built:
    build a step after weights are loaded and linears swapped or packed)."""

    def __init__(self, model: nn.Module):
        cfg = model.config
        a0 = model.model.layers[0].self_attn
        self.num_heads, self.num_kv_heads, self.head_dim = a0.num_heads, a0.num_kv_heads, a0.head_dim
        self.hidden = cfg.hidden_size
        self.eps = cfg.rms_norm_eps
        self.scale = a0.attn.scale
        self.embed = model.model.embed_tokens.weight  # [V, D]
        self.final_norm = model.model.norm.weight  # [D]
