"""FP8 block-scaled weights (DeepSeek-V3 / V3.2 release format): dequantization at load / convert.

The public checkpoints store a linear weight ``W [N, K]`` as ``float8_e4m3fn`` plus
``weight_scale_inv [ceil(N/128), ceil(K/128)]`` (fp32): one scale per 128x128 block, edge blocks
partial. The published formula (DeepSeek's ``weight_dequant``) is::

    W_real[i, j] = float(W_fp8[i, j]) * scale_inv[i // 128, j // 128]

``weight_scale_inv`` is the *inverse* of the quantization scale, so dequantizing multiplies.

:class:`Fp8Pairer` pairs ``X.weight`` with ``X.weight_scale_inv`` in a stream of
``(name, tensor)`` pairs where the two may arrive in either order (different shards): the first
to arrive is buffered until its partner comes, so at most the unpaired tensors are held.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

from torchinferno.errors import CheckpointError

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
SCALE_SUFFIX = "_scale_inv"  # "X.weight" + SCALE_SUFFIX == "X.weight_scale_inv"
DEFAULT_BLOCK = 128


def is_fp8(t: torch.Tensor | torch.dtype) -> bool:
    dtype = t if isinstance(t, torch.dtype) else t.dtype
    return dtype in FP8_DTYPES


def scale_shape(weight_shape: tuple[int, ...], block: int = DEFAULT_BLOCK) -> tuple[int, int]:
    """Expected ``weight_scale_inv`` shape for a 2-D weight: ceil-division of each dim by ``block``."""
    n, k = weight_shape
    return (-(-n // block), -(-k // block))


def dequantize_fp8_block(
    weight_fp8: torch.Tensor,  # [N, K] float8 (any dtype is accepted: it is read as float)
    scale_inv: torch.Tensor,  # [ceil(N/block), ceil(K/block)]
    block: int = DEFAULT_BLOCK,
    out_dtype: torch.dtype = torch.bfloat16,
    name: str = "weight",
) -> torch.Tensor:  # [N, K] out_dtype
    """``weight.float() * scale_inv`` broadcast over ``block x block`` tiles (edge tiles partial).

    Computes in fp32 and casts once at the end. Raises CheckpointError naming ``name`` when the
    weight is not 2-D or the scale shape is not the ceil-division of the weight shape.
    """
    if weight_fp8.dim() != 2:
        raise CheckpointError(f"FP8 tensor '{name}' has shape {tuple(weight_fp8.shape)}: block dequantization needs a 2-D weight")
    want = scale_shape(tuple(weight_fp8.shape), block)
    if tuple(scale_inv.shape) != want:
        raise CheckpointError(
            f"'{name}{SCALE_SUFFIX}' has shape {tuple(scale_inv.shape)}, but weight {tuple(weight_fp8.shape)} "
            f"with {block}x{block} blocks needs {want}"
        )
    n, k = weight_fp8.shape
    s = scale_inv.float().repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]  # [N, K]
    return (weight_fp8.float() * s).to(out_dtype)


class Fp8Pairer:
    """Stream filter: ``X.weight`` (FP8) + ``X.weight_scale_inv`` -> one dequantized ``X.weight``.

    Non-FP8 tensors without a scale pass through unchanged. Errors (CheckpointError, naming the
    tensor): a scale whose weight is not FP8, an FP8 weight without a scale, a scale without a
    weight, a scale of the wrong shape. ``dequantized`` lists the names that were dequantized.
    """

    def __init__(self, block: int = DEFAULT_BLOCK, out_dtype: torch.dtype = torch.float32):
        self.block = block
        self.out_dtype = out_dtype
        self.dequantized: list[str] = []

    def __call__(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        weights: dict[str, torch.Tensor] = {}  # FP8 weights waiting for their scale
        scales: dict[str, torch.Tensor] = {}  # scales waiting for their weight (keyed by weight name)
        plain: set[str] = set()  # names of non-FP8 tensors already passed through
        for name, t in tensors:
            if name.endswith(SCALE_SUFFIX):
                base = name[: -len(SCALE_SUFFIX)]
                if base in plain:
                    raise CheckpointError(_not_fp8(base, name))
                if base in weights:
                    yield base, self._dequant(base, weights.pop(base), t)
                else:
                    scales[base] = t
            elif is_fp8(t):
                if name in scales:
                    yield name, self._dequant(name, t, scales.pop(name))
                else:
                    weights[name] = t
            else:
                if name in scales:
                    raise CheckpointError(_not_fp8(name, name + SCALE_SUFFIX))
                plain.add(name)
                yield name, t
        if weights:
            names = sorted(weights)
            raise CheckpointError(
                f"FP8 tensor '{names[0]}' has no '{names[0]}{SCALE_SUFFIX}' block scale"
                + (f" (and {len(names) - 1} more FP8 tensors without a scale)" if len(names) > 1 else "")
            )
        if scales:
            names = sorted(scales)
            raise CheckpointError(f"block scale '{names[0]}{SCALE_SUFFIX}' has no matching tensor '{names[0]}'"
                                  + (f" (and {len(names) - 1} more)" if len(names) > 1 else ""))

    def _dequant(self, name: str, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        self.dequantized.append(name)
        return dequantize_fp8_block(w, s, self.block, self.out_dtype, name=name)


def _not_fp8(weight: str, scale: str) -> str:
    return (f"tensor '{scale}' is a block scale but '{weight}' is not stored as FP8: "
            "block scales on non-FP8 weights are not supported yet")


def quantize_fp8_block(weight: torch.Tensor, block: int = DEFAULT_BLOCK, fp8_dtype: torch.dtype = torch.float8_e4m3fn,
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`dequantize_fp8_block` (for tests and experiments): per-tile ``amax / fp8_max``
    scales. Returns ``(weight_fp8 [N, K], scale_inv [ceil(N/block), ceil(K/block)] fp32)``."""
    n, k = weight.shape
    sn, sk = scale_shape((n, k), block)
    pad = torch.zeros(sn * block, sk * block, dtype=torch.float32, device=weight.device)
    pad[:n, :k] = weight.float()
    tiles = pad.view(sn, block, sk, block)
    amax = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12)  # [sn, sk]
    scale_inv = amax / torch.finfo(fp8_dtype).max
    q = (tiles / scale_inv[:, None, :, None]).view(sn * block, sk * block)[:n, :k]
    return q.to(fp8_dtype), scale_inv
