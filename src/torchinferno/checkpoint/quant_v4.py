"""DeepSeek-V4 release weight formats, dequantized at load: FP8 block-scaled and MXFP4 experts.

* FP8: ``X.weight`` ``float8_e4m3fn [N, K]`` + ``X.scale`` (or ``X.weight_scale_inv``) ``[ceil(N/128), ceil(K/128)]``,
  ue8m0 (``float8_e8m0fnu`` / ``uint8`` exponent) or fp32: ``W[i, j] = w[i, j] * s[i // 128, j // 128]``.
* MXFP4: ``X.weight`` ``int8/uint8/float4_e2m1fn_x2 [N, K/2]``, two e2m1 codes per byte (low nibble = even
  column, as transformers unpacks them) + ``X.scale`` ``[N, K/32]`` ue8m0: ``W[i, j] = e2m1(code[i, j]) * s[i, j // 32]``.

:func:`dequantize_stream` pairs weights with their scales in a ``(name, tensor)`` stream (either order, any shard),
passes everything else through (a float ``X.scale`` with no quantized ``X.weight`` is a plain parameter, yielded
at the end), and raises ``CheckpointError`` naming the tensor on a shape / pairing mismatch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from torchinferno.errors import CheckpointError

FP8_BLOCK = 128
MXFP4_GROUP = 32
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_SCALE_SUFFIXES = (".scale", ".weight_scale_inv")


def ue8m0_to_float(s: torch.Tensor) -> torch.Tensor:
    """Scales as fp32: ``float8_e8m0fnu`` and ``uint8`` hold a biased exponent (2^(e-127)); floats pass through."""
    if s.dtype == torch.uint8:
        return torch.exp2(s.float() - 127.0)
    return s.float()


def dequantize_fp8(w: torch.Tensor, scale: torch.Tensor, name: str, out_dtype=torch.float32) -> torch.Tensor:
    if w.dim() != 2:
        raise CheckpointError(f"FP8 tensor '{name}' has shape {tuple(w.shape)}: block dequantization needs a 2-D weight")
    n, k = w.shape
    want = (-(-n // FP8_BLOCK), -(-k // FP8_BLOCK))
    if tuple(scale.shape) != want:
        raise CheckpointError(f"scale of FP8 tensor '{name}' has shape {tuple(scale.shape)}, weight {(n, k)} with "
                              f"{FP8_BLOCK}x{FP8_BLOCK} blocks needs {want}")
    s = ue8m0_to_float(scale).repeat_interleave(FP8_BLOCK, 0)[:n].repeat_interleave(FP8_BLOCK, 1)[:, :k]
    return (w.float() * s).to(out_dtype)


def dequantize_mxfp4(w: torch.Tensor, scale: torch.Tensor, name: str, out_dtype=torch.float32) -> torch.Tensor:
    if w.dim() != 2:
        raise CheckpointError(f"MXFP4 tensor '{name}' has shape {tuple(w.shape)}: needs a 2-D packed weight")
    n, half = w.shape
    k = 2 * half
    if k % MXFP4_GROUP or tuple(scale.shape) != (n, k // MXFP4_GROUP):
        raise CheckpointError(f"scale of MXFP4 tensor '{name}' has shape {tuple(scale.shape)}, packed weight {(n, half)} "
                              f"({k} values per row, one scale per {MXFP4_GROUP}) needs {(n, k // MXFP4_GROUP)}")
    b = w.view(torch.uint8).long()
    codes = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(n, k)
    vals = torch.tensor(E2M1, dtype=torch.float32)[codes]
    return (vals * ue8m0_to_float(scale).repeat_interleave(MXFP4_GROUP, 1)).to(out_dtype)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Test helper: round ``w [N, K]`` to MXFP4 -> (packed uint8 [N, K/2], ue8m0 uint8 scales [N, K/32])."""
    n, k = w.shape
    g = w.float().view(n, k // MXFP4_GROUP, MXFP4_GROUP)
    amax = g.abs().amax(-1).clamp(min=2.0**-126)
    e = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    q = (g / torch.exp2(e)[..., None]).reshape(n, k)
    table = torch.tensor(E2M1)
    codes = (q[..., None] - table).abs().argmin(-1)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return packed, (e + 127).to(torch.uint8)


_FP4_X2 = getattr(torch, "float4_e2m1fn_x2", None)  # newer torch: packed e2m1 pairs as a dtype


def _is_quantized(t: torch.Tensor) -> bool:
    return t.dtype in (torch.float8_e4m3fn, torch.int8, torch.uint8) or (_FP4_X2 is not None and t.dtype == _FP4_X2)


def dequantize_stream(tensors: Iterable[tuple[str, torch.Tensor]], out_dtype=torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
    """``X.weight`` (FP8 / packed MXFP4) + its scale -> one dequantized ``X.weight``; other tensors pass through."""
    weights: dict[str, torch.Tensor] = {}
    scales: dict[str, tuple[str, torch.Tensor]] = {}

    def done(base: str, w: torch.Tensor, s: torch.Tensor, sname: str):
        name = base + ".weight"
        if w.dtype == torch.float8_e4m3fn:
            return name, dequantize_fp8(w, s, name, out_dtype)
        return name, dequantize_mxfp4(w, s, name, out_dtype)

    for name, t in tensors:
        suffix = next((s for s in _SCALE_SUFFIXES if name.endswith(s)), None)
        if suffix is not None:
            base = name[: -len(suffix)]
            if base in weights:
                yield done(base, weights.pop(base), t, name)
            else:
                scales[base] = (name, t)
        elif name.endswith(".weight") and _is_quantized(t):
            base = name[: -len(".weight")]
            if base in scales:
                sname, s = scales.pop(base)
                yield done(base, t, s, sname)
            else:
                weights[base] = t
        else:
            yield name, t
    if weights:
        raise CheckpointError(f"quantized tensor '{next(iter(weights))}.weight' ({next(iter(weights.values())).dtype}) has no scale")
    for sname, s in scales.values():
        if sname.endswith(".weight_scale_inv") or s.dtype == torch.uint8 or str(s.dtype) == "torch.float8_e8m0fnu":
            raise CheckpointError(f"scale tensor '{sname}' has no quantized weight")
        yield sname, s  # a plain parameter named "scale" (e.g. mHC ``attn_hc.scale``), not a quantization scale
