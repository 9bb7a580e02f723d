"""``torchinferno.runtime.prefix_cache``: the automatic prefix cache (chained block hashes, LRU eviction),
which is the paged block pool itself (a thin re-export of ``cache.block_pool``)."""

from torchinferno.cache.block_pool import BlockPool, NoFreeBlocksError, hash_block_tokens, hash_token_blocks

__all__ = ["BlockPool", "NoFreeBlocksError", "hash_block_tokens", "hash_token_blocks"]
