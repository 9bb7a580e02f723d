"""``torchinferno.runtime.prefix``: prefix-aware routing across replicas and the chained block hashes that
identify a token prefix (thin re-exports of ``engine.router`` and ``cache.block_pool``)."""

from torchinferno.cache.block_pool import hash_block_tokens, hash_token_blocks
from torchinferno.engine.router import PrefixRouter, Replica, RouteDecision

__all__ = ["PrefixRouter", "Replica", "RouteDecision", "hash_block_tokens", "hash_token_blocks"]
