"""Paged KV cache tensors for any family, sized from a memory budget or a block count.

The layout comes from the family's ``kv_spec(config)`` (``models.protocol.KVSpec``): one tuple
of tensors per layer, each ``[num_blocks, block_size, *per_token_shape]``. Nothing here knows
whether a layer stores k/v, an MLA latent or anything else. A hybrid spec (``KVSpec.is_hybrid``) has two
groups with their own block counts: ``num_blocks`` whole-sequence blocks and ``num_sliding_blocks`` blocks of the
sliding group (freed behind the window by the scheduler).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torchinferno.errors import ConfigError
from torchinferno.models.protocol import KVSpec

__all__ = ["PagedKVCache", "allocate_kv_cache", "num_blocks_for_memory"]


def num_blocks_for_memory(spec: KVSpec, dtype: torch.dtype, block_size: int, memory_bytes: int) -> int:
    """How many whole blocks of ``spec`` fit in ``memory_bytes``."""
    per_block = spec.bytes_per_token(dtype) * block_size
    if per_block <= 0:
        raise ConfigError("the model's KV spec stores nothing per token")
    return int(memory_bytes) // per_block


@dataclass
class PagedKVCache:
    """The cache tensors plus the facts needed to address them.

    ``tensors[layer]`` is what the model's forward receives as ``kv_caches[layer]``.
    """

    spec: KVSpec
    tensors: list[tuple[torch.Tensor, ...]]
    num_blocks: int
    block_size: int
    dtype: torch.dtype
    device: torch.device
    num_sliding_blocks: int | None = None  # hybrid specs: blocks of the sliding group's pool
    packed: bool = False  # tensors with a rate (one row per window) keep rows_per_block rows per block

    @property
    def num_tokens(self) -> int:
        """Token capacity of the whole pool (hybrid: of the whole group; the sliding pool holds windows)."""
        return self.num_blocks * self.block_size

    @property
    def bytes_per_token(self) -> int:
        return self.spec.bytes_per_token(self.dtype)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.tensors for t in layer)


def allocate_kv_cache(
    spec: KVSpec,
    block_size: int,
    dtype: torch.dtype,
    device: str | torch.device,
    num_blocks: int | None = None,
    memory_bytes: int | None = None,
    num_sliding_blocks: int | None = None,
    pack: bool = False,
) -> PagedKVCache:
    """Allocate once (zero-filled): ``num_blocks`` wins; else as many blocks as ``memory_bytes`` holds.
    Hybrid specs: the sliding group gets ``num_sliding_blocks`` (default ``num_blocks``); ``pack``: tensors with a
    rate (``KVLayerSpec.rates``) keep only ``rows_per_block`` rows per block."""
    if num_blocks is None:
        if memory_bytes is None:
            raise ConfigError("give num_blocks or a KV cache memory budget")
        num_blocks = num_blocks_for_memory(spec, dtype, block_size, memory_bytes)
        if num_blocks < 1:
            need = spec.bytes_per_token(dtype) * block_size
            raise ConfigError(f"KV cache memory {memory_bytes} bytes holds no block (one block needs {need} bytes)")
    if num_blocks < 1:
        raise ConfigError(f"num_blocks must be >= 1, got {num_blocks}")
    device = torch.device(device)
    if not spec.is_hybrid:
        num_sliding_blocks = None
    elif num_sliding_blocks is None:
        num_sliding_blocks = num_blocks
    if num_sliding_blocks is not None and num_sliding_blocks < 1:
        raise ConfigError(f"num_sliding_blocks must be >= 1, got {num_sliding_blocks}")
    tensors = spec.allocate(num_blocks, block_size, dtype, device, num_sliding_blocks, pack)
    return PagedKVCache(spec, tensors, num_blocks, block_size, dtype, device, num_sliding_blocks, pack)
