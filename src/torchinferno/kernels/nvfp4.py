"""NVFP4 reference: quantize / dequantize / linear, and a hook that swaps ``nn.Linear`` for it.

NVFP4 (the Blackwell 4-bit float format) stores a tensor as:

* values in FP4 **E2M1** (1 sign, 2 exponent, 1 mantissa bit): magnitudes
  ``{0, 0.5, 1, 1.5, 2, 3, 4, 6}``, two codes packed per byte (element ``2i`` in the low nibble);
* one **FP8 E4M3** scale per block of **16** consecutive elements along the last (reduction)
  dimension;
* one **fp32 per-tensor** scale, so block scales use E4M3's range (max 448) whatever the tensor's.

Decoding: ``x = e2m1 * float(block_scale_e4m3) * tensor_scale``. Encoding follows NVIDIA's
recipe: ``tensor_scale = amax(|x|) / (6 * 448)``; each block's scale is
``amax(|block|) / 6 / tensor_scale`` rounded to E4M3; values are ``x / (block_scale *
tensor_scale)`` rounded to the nearest E2M1 value (ties to even code, saturating at 6).

This is a numerics reference in plain torch (runs anywhere); a Blackwell kernel would consume
the same packed layout. ``nvfp4_linear_reference`` computes ``x @ W^T`` from the packed weight,
optionally quantizing the activations too (the W4A4 tensor-core path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from torchinferno.kernels.fp8_rule import E4M3_MAX
from torchinferno.kernels.module_swap import replace_linears

BLOCK = 16
E2M1_MAX = 6.0
# code (3 magnitude bits) -> value; bit 3 of a nibble is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring magnitudes and whether a tie goes up (to the even code).
_THRESHOLDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_UP = (False, True, False, True, False, True, False)

__all__ = ["NVFP4Tensor", "quantize_nvfp4", "dequantize_nvfp4", "nvfp4_linear_reference", "NVFP4Linear",
           "swap_linear_for_nvfp4", "round_to_e2m1"]


@dataclass
class NVFP4Tensor:
    """A quantized ``[..., K]`` tensor: ``packed [..., K/2]`` uint8, ``scales [..., K/16]`` float8_e4m3fn,
    ``tensor_scale`` fp32 scalar tensor; ``shape`` is the original shape."""

    packed: torch.Tensor
    scales: torch.Tensor
    tensor_scale: torch.Tensor
    shape: torch.Size

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales.numel() + 4


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 code (0..15, sign in bit 3) of fp32 ``x``; ties to the even code; saturates at 6."""
    a = x.abs()
    code = torch.zeros_like(a, dtype=torch.uint8)
    for t, up in zip(_THRESHOLDS, _TIE_UP):
        code += (a >= t if up else a > t).to(torch.uint8)
    code = torch.where(torch.isnan(a), torch.zeros_like(code), code)
    return code | ((x < 0).to(torch.uint8) << 3)


def _decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    mag = table[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def quantize_nvfp4(x: torch.Tensor, tensor_scale: torch.Tensor | float | None = None) -> NVFP4Tensor:
    """``x [..., K]`` (K a multiple of 16) -> :class:`NVFP4Tensor`. ``tensor_scale`` overrides the amax rule."""
    if x.shape[-1] % BLOCK:
        raise ValueError(f"NVFP4 needs the last dimension to be a multiple of {BLOCK}, got {x.shape[-1]}")
    xf = x.float()
    if tensor_scale is None:
        amax = xf.abs().amax()
        tensor_scale = torch.where(amax > 0, amax / (E2M1_MAX * E4M3_MAX), torch.ones_like(amax))
    ts = torch.as_tensor(tensor_scale, dtype=torch.float32, device=x.device).reshape(())
    blocks = xf.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)  # [..., K/16, 16]
    block_amax = blocks.abs().amax(-1)  # [..., K/16]
    scales = (block_amax / E2M1_MAX / ts).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    eff = scales.float() * ts  # the decode multiplier each block really gets
    q = torch.where(eff[..., None] > 0, blocks / eff[..., None].clamp_min(torch.finfo(torch.float32).tiny),
                    torch.zeros_like(blocks))
    codes = round_to_e2m1(q).reshape(*x.shape[:-1], x.shape[-1])
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return NVFP4Tensor(packed.contiguous(), scales.contiguous(), ts, x.shape)


def dequantize_nvfp4(t: NVFP4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """:class:`NVFP4Tensor` -> ``[..., K]`` in ``dtype`` (exact in fp32: every product is representable)."""
    lo = t.packed & 0x0F
    hi = t.packed >> 4
    codes = torch.stack((lo, hi), dim=-1).reshape(*t.packed.shape[:-1], t.packed.shape[-1] * 2)
    vals = _decode_e2m1(codes).reshape(*codes.shape[:-1], codes.shape[-1] // BLOCK, BLOCK)
    out = vals * (t.scales.float() * t.tensor_scale)[..., None]
    return out.reshape(t.shape).to(dtype)


def nvfp4_linear_reference(x: torch.Tensor, weight: NVFP4Tensor, bias: torch.Tensor | None = None,
                           quantize_input: bool = False) -> torch.Tensor:
    """``x [..., K] @ dequant(weight [N, K])^T (+ bias)`` in fp32, returned in ``x.dtype``.

    With ``quantize_input`` the activations are NVFP4-quantized too (per-tensor amax scale, 16-element
    blocks along K), i.e. what a W4A4 NVFP4 tensor-core GEMM computes up to accumulation order.
    """
    xf = x.float()
    if quantize_input:
        xf = dequantize_nvfp4(quantize_nvfp4(xf))
    y = xf @ dequantize_nvfp4(weight).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


class NVFP4Linear(nn.Module):
    """Drop-in for ``nn.Linear`` holding an NVFP4 weight (buffers, not parameters: inference only)."""

    def __init__(self, in_features: int, out_features: int, q: NVFP4Tensor, bias: torch.Tensor | None,
                 quantize_input: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.quantize_input = quantize_input
        self.register_buffer("weight_packed", q.packed)
        self.register_buffer("weight_scale", q.scales)
        self.register_buffer("weight_tensor_scale", q.tensor_scale)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    @classmethod
    def from_linear(cls, lin: nn.Linear, quantize_input: bool = False) -> "NVFP4Linear":
        q = quantize_nvfp4(lin.weight.detach())
        return cls(lin.in_features, lin.out_features, q, lin.bias, quantize_input)

    @property
    def qweight(self) -> NVFP4Tensor:
        return NVFP4Tensor(self.weight_packed, self.weight_scale, self.weight_tensor_scale,
                           torch.Size((self.out_features, self.in_features)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nvfp4_linear_reference(x, self.qweight, self.bias, self.quantize_input)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, nvfp4, a4={self.quantize_input}"


def swap_linear_for_nvfp4(model: nn.Module, filter: Callable[[str, nn.Linear], bool] | None = None,
                          quantize_input: bool = False) -> list[str]:
    """Replace every ``nn.Linear`` for which ``filter(qualified_name, module)`` holds (all by default,
    skipping those whose ``in_features`` is not a multiple of 16) by an :class:`NVFP4Linear`.

    In place, no graph pass: plain module swapping, so hooks/FX/export see ordinary modules.
    Returns the qualified names swapped.
    """
    def make(name: str, lin: nn.Linear) -> nn.Module | None:
        if lin.in_features % BLOCK or (filter is not None and not filter(name, lin)):
            return None
        return NVFP4Linear.from_linear(lin, quantize_input)

    return replace_linears(model, make)
