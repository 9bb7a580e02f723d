"""Kernel APIs. Each op has a torch reference (``kernels.reference``) and a dispatching entry here.

Dispatch happens on the tensors' device at call time (CPU -> fused torch; CUDA -> Triton when
available); never on environment variables.

``fused_rmsnorm_swiglu`` (a ``torch.library`` custom op) and the NVFP4 contract are resolved
lazily (PEP 562), so importing this package registers no custom op.
"""

import importlib

from torchinferno.kernels.api import (
    add_rms_norm,
    batched_paged_decode_attention,
    paged_decode_attention,
    rms_norm,
    rotary_neox,
    swiglu_activation,
)

_LAZY = {
    "fused_rmsnorm_swiglu": "torchinferno.kernels.custom_ops",
    "quantize_nvfp4": "torchinferno.kernels.nvfp4",
    "dequantize_nvfp4": "torchinferno.kernels.nvfp4",
    "nvfp4_linear_reference": "torchinferno.kernels.nvfp4",
}

__all__ = ["rms_norm", "add_rms_norm", "swiglu_activation", "rotary_neox", "paged_decode_attention",
           "batched_paged_decode_attention", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'torchinferno.kernels' has no attribute '{name}'")
