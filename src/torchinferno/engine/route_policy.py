"""Routing policies: which of N replicas takes a request (``serve --data-parallel-size``, ``router``, research).

A policy sees the request's tokens (token ids in-process; UTF-8 bytes of the prompt text in the remote ``router``,
which never tokenizes) and one ``ReplicaState`` per replica (load = requests running + waiting there, KV usage,
alive), and returns a ``Route``. It never calls a replica: states come from the caller (the stats each engine core
sends with every step, or the router's own in-flight counts), so choosing is cheap and synchronous.

* ``round-robin``: the next live replica in turn.
* ``least-loaded``: the live replica with the fewest requests in flight, then the lowest KV usage, then the lowest
  index.
* ``cache-aware`` (SGLang's cache-aware router, our code): one approximate ``RadixTree`` per replica of the
  prefixes sent there (inserted on admit, the whole sequence again on finish, LRU-bounded by ``max_tree_tokens``,
  cleared when a replica dies). When the live loads are unbalanced (``max - min > balance_abs`` and
  ``max > balance_rel * min``) the least-loaded replica wins; otherwise the replica with the longest match, if that
  match is at least ``min_match_tokens`` and ``cache_threshold`` of the request, ties going to the less loaded;
  otherwise the least loaded.

``RouterStats`` counts, per policy, the tokens looked up and the tokens matched in the chosen replica's tree (the
router's predicted hit rate; the replicas' real prefix-cache hits are in their own stats).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from torchinferno.engine.radix_tree import RadixTree
from torchinferno.errors import ConfigError

__all__ = ["POLICIES", "ReplicaState", "Route", "RouterStats", "RoutingPolicy", "make_policy"]

POLICIES = ("round-robin", "least-loaded", "cache-aware")


@dataclass(frozen=True)
class ReplicaState:
    load: int = 0  # requests running + waiting
    kv_usage: float = 0.0  # 0-1
    alive: bool = True


@dataclass(frozen=True)
class Route:
    replica: int
    matched_tokens: int  # of the request, in the chosen replica's tree (0 for policies without trees)
    reason: str  # "round_robin" | "least_loaded" | "cache" | "balance"


@dataclass
class RouterStats:
    routed: int = 0
    query_tokens: int = 0
    matched_tokens: int = 0
    per_replica: list[int] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.matched_tokens / self.query_tokens if self.query_tokens else 0.0


class RoutingPolicy:
    """Base: bookkeeping shared by every policy. Subclasses implement ``choose``."""

    name = ""

    def __init__(self, num_replicas: int):
        if num_replicas < 1:
            raise ConfigError(f"a router needs at least one replica (got {num_replicas})")
        self.num_replicas = num_replicas
        self.stats = RouterStats(per_replica=[0] * num_replicas)

    def choose(self, tokens: Sequence[int], states: Sequence[ReplicaState]) -> Route:
        raise NotImplementedError

    def route(self, tokens: Sequence[int], states: Sequence[ReplicaState]) -> Route:
        """Choose a replica and record the request as admitted there. Raises ``ConfigError`` if none is alive."""
        if len(states) != self.num_replicas:
            raise ValueError(f"expected {self.num_replicas} replica states, got {len(states)}")
        if not any(s.alive for s in states):
            raise ConfigError("no replica is alive")
        r = self.choose(tokens, states)
        s = self.stats
        s.routed += 1
        s.query_tokens += len(tokens)
        s.matched_tokens += r.matched_tokens
        s.per_replica[r.replica] += 1
        s.reasons[r.reason] = s.reasons.get(r.reason, 0) + 1
        self.admitted(r.replica, tokens)
        return r

    # hooks (no-ops but for cache-aware)
    def admitted(self, replica: int, tokens: Sequence[int]) -> None:
        pass

    def finished(self, replica: int, tokens: Sequence[int]) -> None:
        """A request ended on ``replica``; ``tokens`` = prompt + generated (what that replica now caches)."""

    def replica_died(self, replica: int) -> None:
        pass


def _least_loaded(states: Sequence[ReplicaState], among: Sequence[int] | None = None) -> int:
    idx = [i for i in (range(len(states)) if among is None else among) if states[i].alive]
    return min(idx, key=lambda i: (states[i].load, states[i].kv_usage, i))


class RoundRobin(RoutingPolicy):
    name = "round-robin"

    def __init__(self, num_replicas: int):
        super().__init__(num_replicas)
        self._next = 0

    def choose(self, tokens, states) -> Route:
        for _ in range(self.num_replicas):
            i = self._next % self.num_replicas
            self._next += 1
            if states[i].alive:
                return Route(i, 0, "round_robin")
        raise ConfigError("no replica is alive")  # unreachable: route() checked


class LeastLoaded(RoutingPolicy):
    name = "least-loaded"

    def choose(self, tokens, states) -> Route:
        return Route(_least_loaded(states), 0, "least_loaded")


class CacheAware(RoutingPolicy):
    name = "cache-aware"

    def __init__(self, num_replicas: int, *, balance_abs: int = 32, balance_rel: float = 1.5,
                 cache_threshold: float = 0.0, min_match_tokens: int = 16, max_tree_tokens: int | None = None):
        super().__init__(num_replicas)
        self.balance_abs, self.balance_rel = balance_abs, balance_rel
        self.cache_threshold, self.min_match_tokens = cache_threshold, min_match_tokens
        self.trees = [RadixTree(max_tree_tokens) for _ in range(num_replicas)]

    def balanced(self, states: Sequence[ReplicaState]) -> bool:
        loads = [s.load for s in states if s.alive]
        hi, lo = max(loads), min(loads)
        return not (hi - lo > self.balance_abs and hi > self.balance_rel * lo)

    def choose(self, tokens, states) -> Route:
        if not self.balanced(states):
            i = _least_loaded(states)
            return Route(i, self.trees[i].match(tokens), "balance")
        live = [i for i, s in enumerate(states) if s.alive]
        matches = {i: self.trees[i].match(tokens) for i in live}
        best = max(matches.values())
        if best >= max(1, self.min_match_tokens) and best >= self.cache_threshold * len(tokens):
            i = _least_loaded(states, [j for j in live if matches[j] == best])
            return Route(i, best, "cache")
        i = _least_loaded(states)
        return Route(i, matches[i], "least_loaded")

    def admitted(self, replica, tokens) -> None:
        self.trees[replica].insert(tokens)

    def finished(self, replica, tokens) -> None:
        self.trees[replica].insert(tokens)

    def replica_died(self, replica: int) -> None:
        self.trees[replica].clear()


def make_policy(name: str, num_replicas: int, **cache_aware_options) -> RoutingPolicy:
    """A fresh policy by its flag spelling (``round-robin``, ``least-loaded``, ``cache-aware``; ``_`` works too)."""
    key = name.replace("_", "-")
    if key == "round-robin":
        return RoundRobin(num_replicas)
    if key == "least-loaded":
        return LeastLoaded(num_replicas)
    if key == "cache-aware":
        return CacheAware(num_replicas, **cache_aware_options)
    raise ConfigError(f"unknown --router-policy {name!r} (valid: {', '.join(POLICIES)})")
