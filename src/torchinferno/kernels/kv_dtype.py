"""Storage dtypes of the paged KV cache, FP8 included, for the torch paths.

An FP8 cache (``torch.float8_e4m3fn`` / ``float8_e5m2``) holds unscaled values: a per-tensor
scale of 1.0, which is what vLLM's ``--kv-cache-dtype fp8`` uses without calibrated scales.
Values beyond the format's finite maximum saturate (clamped) instead of becoming NaN. Readers
cast the stored values to their compute dtype; the Triton kernels do the same in registers.
"""

from __future__ import annotations

import torch

from torchinferno.errors import ConfigError

FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)

# --kv-cache-dtype spellings -> storage dtype (None: the model's parameter dtype).
KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def parse_kv_cache_dtype(value: str | torch.dtype | None) -> torch.dtype | None:
    """A ``--kv-cache-dtype`` spelling (or a dtype, or None) -> storage dtype; None means the model's dtype."""
    if value is None or isinstance(value, torch.dtype):
        return value
    if value not in KV_CACHE_DTYPES:
        raise ConfigError(f"unknown kv cache dtype {value!r} (valid: {', '.join(KV_CACHE_DTYPES)})")
    return KV_CACHE_DTYPES[value]


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_KV_DTYPES


def kv_store_values(values: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """``values`` as the cache stores them: cast to ``cache_dtype``; FP8 saturates at its finite max."""
    if cache_dtype in FP8_KV_DTYPES:
        fmax = torch.finfo(cache_dtype).max
        return values.clamp(-fmax, fmax).to(cache_dtype)
    return values.to(cache_dtype)


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """FP8 tensors viewed as uint8 (same bytes), others unchanged: ``index_copy_`` and some
    gathers are not implemented for float8 on every device."""
    return t.view(torch.uint8) if t.dtype in FP8_KV_DTYPES else t


def store_rows(cache: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """``cache.view(-1, *S)[slots] = values`` stored as :func:`kv_store_values` (every slot valid)."""
    flat = raw_bytes(cache.view(-1, *cache.shape[2:]))
    flat.index_copy_(0, slots, raw_bytes(kv_store_values(values, cache.dtype)))


def gather_blocks(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """``cache[blocks]`` (any integer index tensor) in the cache's dtype, FP8 included."""
    return raw_bytes(cache)[blocks].view(cache.dtype)
