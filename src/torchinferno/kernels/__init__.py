"""Kernel APIs. Each op has a torch reference (``kernels.reference``) and a dispatching entry here.

Dispatch happens on the tensors' device at call time (CPU -> fused torch; CUDA -> Triton when
available); never on environment variables.
"""

from torchinferno.kernels.api import add_rms_norm, rms_norm, rotary_neox, swiglu_activation

__all__ = ["rms_norm", "add_rms_norm", "swiglu_activation", "rotary_neox"]
