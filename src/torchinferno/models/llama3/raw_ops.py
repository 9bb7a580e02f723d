"""Reference ops of the llama3 family: plain torch, written for readability and as the oracle.

An ops module is passed to the model at construction (``Llama3ForCausalLM(config, ops=...)``).
Every ops module of this family exposes the same five functions with the same contracts.
"""

from __future__ import annotations

import torch

from torchinferno.models.common.norm_act_ops import Raw
from torchinferno.models.common.rope import apply_rope_neox

rms_norm = Raw.rms_norm
add_rms_norm = Raw.add_rms_norm
silu_and_mul = Raw.silu_and_mul

NAME = "raw"


def prepare_rope(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype):
    """Once per forward: the cos/sin [T, D/2] tables each layer uses (the reference keeps fp32)."""
    return cos, sin


def rope(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """qk [T, H + Hkv, D] (queries and keys side by side), cos/sin [T, D/2] -> rotated (neox layout)."""
    return apply_rope_neox(qk, cos, sin)
