"""``torchinferno.runtime.paged``: paged KV allocation and materialization (thin re-exports of ``torchinferno.cache``
and the gather/write helpers of ``models.common.attention``)."""

from torchinferno.cache.block_pool import BlockPool, NoFreeBlocksError
from torchinferno.cache.kv_cache import PagedKVCache, allocate_kv_cache, num_blocks_for_memory
from torchinferno.models.common.attention import gather_kv, write_kv

__all__ = ["BlockPool", "NoFreeBlocksError", "PagedKVCache", "allocate_kv_cache", "num_blocks_for_memory",
           "gather_kv", "write_kv"]
