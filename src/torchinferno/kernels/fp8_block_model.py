"""``--quantization fp8-block`` on a whole loaded model: its linears (``kernels.fp8_block``, the head kept) and routed
experts (``kernels.fp8_block_moe``) become block FP8, from the checkpoint's own FP8 blocks where it has them
(``kernels.fp8_block_load``, bitwise), else quantized from the loaded weights. ``kernels.fp8_block_stream`` does the
same one decoder layer at a time while a model is built (the same tensors, bitwise).
"""

from __future__ import annotations

from torch import nn

from torchinferno.errors import ConfigError
from torchinferno.kernels.fp8_block import swap_linear_for_fp8_block
from torchinferno.kernels.fp8_block_load import checkpoint_blocks
from torchinferno.kernels.fp8_block_moe import swap_experts_for_fp8_block

__all__ = ["quantize_model_fp8_block"]


def quantize_model_fp8_block(model: nn.Module, kernel: str = "auto") -> list[str]:
    """``--quantization fp8-block``: the linears (:func:`swap_linear_for_fp8_block`, the head kept) and the routed
    experts (``kernels.fp8_block_moe.swap_experts_for_fp8_block``) of a loaded model become block FP8, from the
    checkpoint's own FP8 blocks where ``model.checkpoint_dir`` has them (bitwise), else quantized from the loaded
    weights. Returns the names swapped and sets ``model.fp8_block_kept`` (how many modules took the checkpoint's own
    blocks); ConfigError when nothing was swapped."""
    ckpt = getattr(model, "checkpoint_dir", None)
    kept_linears, kept_experts = checkpoint_blocks(model, ckpt) if ckpt is not None else ({}, {})
    n_kept = len(kept_linears) + len(kept_experts)
    linears = swap_linear_for_fp8_block(model, kernel=kernel, kept=kept_linears)
    experts = swap_experts_for_fp8_block(model, kernel=kernel, kept=kept_experts)
    if not linears and not experts:
        raise ConfigError("--quantization fp8-block: the model has no nn.Linear layers or routed experts to quantize")
    model.fp8_block_kept = n_kept - len(kept_linears) - len(kept_experts)  # the swaps popped what they used
    return linears + experts
