"""KV append into the paged cache: ``cache.view(-1, Hkv, D)[slot_mapping[t]] = k[t]`` (and v).

One program per new token writes its K and V rows; ``slot_mapping[t] < 0`` (a padded row of a
CUDA-graph bucket) writes nothing. Reads strided ``k``/``v`` views (slices of the qkv output).
Caches must be contiguous ``[num_blocks, block_size, Hkv, D]``. An FP8 cache stores the values
unscaled and saturated at the format's finite max (``kernels.kv_dtype``, same as the torch path).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchinferno.kernels.kv_dtype import is_fp8
from torchinferno.kernels.triton import next_pow2


@triton.jit
def _kv_append_kernel(K, V, KC, VC, SLOTS, stride_kt, stride_kh, stride_vt, stride_vh,
                      H, D, DV, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                      SAT: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(SLOTS + t).to(tl.int64)
    if slot >= 0:
        h = tl.arange(0, BLOCK_H)
        d = tl.arange(0, BLOCK_D)
        m = (h[:, None] < H) & (d[None, :] < D)
        k = tl.load(K + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=m)
        if SAT > 0:  # FP8 cache: saturate, then round to the storage format
            k = tl.clamp(k.to(tl.float32), -SAT, SAT)
        tl.store(KC + slot * (H * D) + h[:, None] * D + d[None, :], k.to(KC.dtype.element_ty), mask=m)
        dv = tl.arange(0, BLOCK_DV)
        mv = (h[:, None] < H) & (dv[None, :] < DV)
        v = tl.load(V + t * stride_vt + h[:, None] * stride_vh + dv[None, :], mask=mv)
        if SAT > 0:
            v = tl.clamp(v.to(tl.float32), -SAT, SAT)
        tl.store(VC + slot * (H * DV) + h[:, None] * DV + dv[None, :], v.to(VC.dtype.element_ty), mask=mv)


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """k [T, Hkv, D], v [T, Hkv, Dv] -> caches at flat slots (slot -1 = skip). In place."""
    T, H, D = k.shape
    DV = v.shape[-1]
    if T == 0:
        return
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "paged caches must be contiguous"
    _kv_append_kernel[(T,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                            H, D, DV, BLOCK_H=next_pow2(H), BLOCK_D=next_pow2(D), BLOCK_DV=next_pow2(DV),
                            SAT=torch.finfo(k_cache.dtype).max if is_fp8(k_cache.dtype) else 0.0, num_warps=4)
