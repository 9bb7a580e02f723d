"""``torchinferno.runtime.prefix``: prefix-aware routing across replicas: the per-replica radix tree of token
prefixes (``engine.radix_tree``), the routing policies of ``serve --data-parallel-size`` and ``router``
(``engine.route_policy``), the in-process ``PrefixRouter`` (``engine.router``) and the chained block hashes that
identify a token prefix (``cache.block_pool``). Thin re-exports."""

from torchinferno.cache.block_pool import hash_block_tokens, hash_token_blocks
from torchinferno.engine.radix_tree import RadixTree
from torchinferno.engine.route_policy import (
           POLICIES,
           ReplicaState,
           Route,
           RouterStats,
           RoutingPolicy,
           make_policy,
)
from torchinferno.engine.router import PrefixRouter, Replica, RouteDecision

__all__ = [
           "POLICIES",
           "PrefixRouter",
           "RadixTree",
           "Replica",
           "ReplicaState",
           "Route",
           "RouteDecision",
           "RouterStats",
           "RoutingPolicy",
           "hash_block_tokens",
           "hash_token_blocks",
           "make_policy",
]
