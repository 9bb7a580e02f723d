"""What every lean decode step of a pre-norm GQA causal LM reads from the built model, extracted once."""

from __future__ import annotations

from torch import nn


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
