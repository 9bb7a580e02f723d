"""FP8 (E4M3) weight-and-activation linear: W8A8 with per-channel weight and per-token activation scales.

The serving-side FP8 recipe of vLLM / TensorRT-LLM for checkpoints without calibrated scales,
applied to a loaded model as a runtime transformation (like ``kernels.cpu_linear``'s packing):

* weight ``W [N, K]`` -> ``W_q = rne(W / s_w)`` in ``float8_e4m3fn`` with one fp32 scale per output
  row, ``s_w[n] = amax(|W[n, :]|) / 448`` (the row's largest magnitude maps to E4M3's largest);
* activation ``x [M, K]`` -> ``x_q`` the same way per row (token), computed at every call;
* ``y[m, n] = s_x[m] * s_w[n] * sum_k x_q[m, k] * W_q[n, k]`` accumulated in fp32, rounded once
  to the activation dtype (``+ bias`` in fp32 before the rounding).

Invariant: :func:`fp8_linear_reference` (plain torch, any device) is the definition; the CUDA
path (Triton per-token quantization + ``torch._scaled_mm`` rowwise scaling on sm89+) computes
the same quantized operands bitwise and differs only in the fp32 summation order (inputs of
at most 16 rows go through a skinny Triton kernel that streams the weight instead of ``_scaled_mm``). A zero row
gets scale ``EPS / 448`` and quantizes to zeros.

What it buys on H200: half the weight bytes of bf16 and the FP8 tensor-core rate (2x bf16).
What it costs: ~3 significant bits of every weight and activation; the benchmark reports the
logits' deviation from the bf16 model beside the speed.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from torchinferno.errors import ConfigError
from torchinferno.kernels.fp8_rule import E4M3_MAX, EPS, INV_E4M3_MAX  # noqa: F401  (the shared rule, re-exported)
from torchinferno.kernels.module_swap import replace_linears

FP8_LINEAR_KERNELS = ("auto", "torch", "scaled_mm")
QUANTIZATION_METHODS = ("none", "fp8", "fp8-block")  # what this module's quantize_model accepts

__all__ = ["quantize_model", "QUANTIZATION_METHODS", "quantize_fp8_rows", "fp8_linear_reference", "Fp8Linear",
           "swap_linear_for_fp8", "scaled_mm_supported", "FP8_LINEAR_KERNELS"]


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., K]`` -> ``(q [..., K] float8_e4m3fn, scale [..., 1] fp32)`` with ``x ~= q * scale`` per row.

    ``scale = max(amax(|row|), EPS) * fp32(1/448)``; ``q = rne(clamp(x / scale, +-448))`` (IEEE fp32
    division). A multiplication defines the scale because torch's CUDA division by a scalar is a
    multiplication by its reciprocal: this way every device computes the same scale.
    """
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp_min(EPS) * INV_E4M3_MAX
    q = (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def fp8_linear_reference(x: torch.Tensor, weight_fp8: torch.Tensor, weight_scale: torch.Tensor,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """The definition: ``x [..., K]``, ``weight_fp8 [N, K]``, ``weight_scale [N]`` fp32 -> ``[..., N]`` in x's dtype."""
    xq, xs = quantize_fp8_rows(x)
    y = (xq.float() @ weight_fp8.float().t()) * xs * weight_scale  # [..., N] fp32
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def scaled_mm_supported(device: torch.device) -> bool:
    """FP8 tensor cores with rowwise-scaled ``torch._scaled_mm``: CUDA compute capability >= 8.9."""
    if device.type != "cuda" or not torch.cuda.is_available() or not hasattr(torch, "_scaled_mm"):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


class Fp8Linear(nn.Module):
    """Drop-in for ``nn.Linear`` holding an FP8 weight (buffers, inference only). x [..., K] -> [..., N].

    ``kernel`` is chosen at construction: ``"scaled_mm"`` (CUDA sm89+: Triton quantization when
    present, inputs of at most ``gemv_rows`` rows through the skinny Triton FP8 kernel, more through
    rowwise-scaled ``torch._scaled_mm``), ``"torch"`` (the reference), ``"auto"`` = ``scaled_mm``
    where supported, else ``torch``. ``scaled_mm`` needs K and N to be multiples of 16.
    """

    # rows sent to the skinny Triton kernel (at most kernels.triton.fp8_gemv.MAX_ROWS = 16; 0 = always
    # _scaled_mm): it beat rowwise _scaled_mm at M = 1, 4 and 16 on every Llama-3-8B shape (run 12).
    gemv_rows = 16

    def __init__(self, weight_fp8: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None,
                 kernel: str = "auto"):
        super().__init__()
        if kernel not in FP8_LINEAR_KERNELS:
            raise ConfigError(f"unknown FP8 linear kernel {kernel!r}; valid: {', '.join(FP8_LINEAR_KERNELS)}")
        self.out_features, self.in_features = weight_fp8.shape
        self.register_buffer("weight_fp8", weight_fp8)  # [N, K] float8_e4m3fn
        self.register_buffer("weight_scale", weight_scale.float().reshape(-1))  # [N] fp32
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        fits = self.in_features % 16 == 0 and self.out_features % 16 == 0
        if kernel == "scaled_mm" and not (scaled_mm_supported(weight_fp8.device) and fits):
            raise ConfigError(f"FP8 kernel 'scaled_mm' needs a CUDA device of compute capability >= 8.9 and K, N "
                              f"multiples of 16 (device {weight_fp8.device}, K={self.in_features}, N={self.out_features})")
        if kernel == "auto":
            kernel = "scaled_mm" if scaled_mm_supported(weight_fp8.device) and fits else "torch"
        self.kernel = kernel
        self._quantize, self._gemv = _cuda_parts(weight_fp8.device) if kernel == "scaled_mm" else (None, None)

    @classmethod
    def from_linear(cls, lin: nn.Linear, kernel: str = "auto") -> "Fp8Linear":
        wq, ws = quantize_fp8_rows(lin.weight.detach())
        return cls(wq, ws.reshape(-1), lin.bias, kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "torch":
            return fp8_linear_reference(x, self.weight_fp8, self.weight_scale, self.bias)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()  # [M, K]
        xq, xs = self._quantize(x2)  # [M, K] e4m3, [M, 1] fp32
        if self._gemv is not None and x2.shape[0] <= self.gemv_rows:  # decode at low concurrency: a weight stream
            y = self._gemv(xq, xs, self.weight_fp8, self.weight_scale, x2.dtype)
        else:
            y = torch._scaled_mm(xq, self.weight_fp8.t(), scale_a=xs, scale_b=self.weight_scale.view(1, -1),
                                 out_dtype=x2.dtype)
        if self.bias is not None:
            y = (y.float() + self.bias.float()).to(x2.dtype)
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8_e4m3 w8a8, kernel={self.kernel}"


def _cuda_parts(device: torch.device) -> tuple[Callable, Callable | None]:
    """(per-token quantizer, small-M GEMV or None) of the CUDA path: Triton kernels when Triton
    imports, else the torch quantizer and ``_scaled_mm`` for every M."""
    from torchinferno.kernels import triton as tk

    if device.type == "cuda" and tk.available():
        from torchinferno.kernels.triton.fp8_gemv import fp8_skinny_dot
        from torchinferno.kernels.triton.fp8_quant import quantize_fp8_rows_triton

        return quantize_fp8_rows_triton, fp8_skinny_dot
    return quantize_fp8_rows, None


def swap_linear_for_fp8(model: nn.Module, skip: tuple[str, ...] = ("lm_head",), kernel: str = "auto") -> list[str]:
    """Replace every ``nn.Linear`` whose qualified name does not end with one of ``skip`` by an
    :class:`Fp8Linear` (in place; the bf16 weight is released). The logits head stays in the
    model's dtype by default, as in the FP8 recipes of vLLM and TensorRT-LLM. Returns the names swapped.
    """
    return replace_linears(model, lambda name, lin: None if name.endswith(skip) else Fp8Linear.from_linear(lin, kernel))


def quantize_model(model: nn.Module, method: str | None) -> list[str]:
    """Apply ``--quantization METHOD`` to a loaded model (before any CPU pre-packing): ``none`` does
    nothing, ``fp8`` swaps every linear but the head for :class:`Fp8Linear`, ``fp8-block`` every linear but the head
    and the routed experts for block-scaled FP8 (``kernels.fp8_block_model.quantize_model_fp8_block``: a checkpoint's
    own FP8 blocks kept). Returns the names swapped."""
    if method in (None, "none"):
        return []
    if method not in QUANTIZATION_METHODS:
        raise ConfigError(f"unknown quantization {method!r}; valid: {', '.join(QUANTIZATION_METHODS)}")
    if method == "fp8-block":
        from torchinferno.kernels.fp8_block_model import quantize_model_fp8_block

        return quantize_model_fp8_block(model)
    names = swap_linear_for_fp8(model)
    if not names:
        raise ConfigError("--quantization fp8: the model has no nn.Linear layers to quantize")
    return names
