"""``torchinferno.runtime.prefix_cache``: the automatic prefix cache (chained block hashes, LRU eviction), which is
the paged block pool itself (``cache.block_pool``), and KV snapshot/restore of a cached prefix to and from a
safetensors file (``cache.prefix_snapshot``). Thin re-exports."""

from torchinferno.cache.block_pool import (
           BlockPool,
           NoFreeBlocksError,
           hash_block_tokens,
           hash_token_blocks,
)
from torchinferno.cache.prefix_snapshot import (
           PrefixSnapshot,
           restore_prefix,
           save_prefix,
)

__all__ = ["BlockPool", "NoFreeBlocksError", "PrefixSnapshot", "hash_block_tokens", "hash_token_blocks",
           "restore_prefix", "save_prefix"]
