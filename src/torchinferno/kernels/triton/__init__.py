"""Triton kernels for CUDA tensors. Importing this package never imports Triton.

Each submodule (``norm``, ``activation``, ``rotary``, ``kv_cache``, ``decode_attention``,
``prefill_attention``, ``decode_gemv``, ...) imports Triton at its top, so import them only after ``available()``
says yes; ``kernels.api`` does that and falls back to torch otherwise. Every kernel has a
torch reference (``kernels.reference`` / the torch path in ``kernels.api``) and a numerics test
in ``tests/kernels``. Launch wrappers never call ``torch.cuda`` APIs on the hot path, so they
also run under Triton's CPU interpreter for debugging.
"""

from __future__ import annotations

import functools

import torch
from torch.fx.experimental.proxy_tensor import get_proxy_mode  # already loaded by torch itself


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """True when Triton can be imported (checked once; no side effects at package import)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install: the torch paths still work
        return False
    return True


def usable(t: torch.Tensor) -> bool:
    """Whether the Triton path applies to tensors on ``t``'s device (CUDA + Triton present).

    Never while a make_fx/proxy trace is recording: a raw Triton launch writes into its output
    behind the tracer's back (the graph would replay an uninitialized ``empty``), so traced
    graphs take the torch path of the same op.
    """
    return t.is_cuda and available() and not _tracing()


def _tracing() -> bool:
    return get_proxy_mode() is not None


@functools.lru_cache(maxsize=None)
def num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_sms(device: torch.device) -> int:
    """SMs of a CUDA ``device``; 132 (an H100 / H200) elsewhere, so launch plans made off-GPU (the interpreter,
    tests) match the GPU's."""
    return num_sms(device.index or 0) if device.type == "cuda" else 132


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
