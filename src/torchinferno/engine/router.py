"""Prefix-aware routing across engine replicas (for experiments).

A request goes to the replica whose prefix cache holds the longest leading run of its tokens
(measured in whole blocks through the same chained block hashes the replicas use); when no
replica holds a useful prefix, or matches tie, the least loaded replica wins. A replica that
matches but is overloaded compared with the least loaded one (``max_load_gap``) loses to it,
so a popular prefix cannot pin all traffic on one replica.

A replica is anything with ``cached_prefix_tokens(prompt_ids) -> int`` and ``load() -> int``
(``LLMEngine`` has both); ``add_request`` / ``step`` also need the ``LLMEngine`` methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.outputs import RequestOutput

__all__ = ["PrefixRouter", "Replica", "RouteDecision"]


class Replica(Protocol):
    def cached_prefix_tokens(self, prompt_token_ids: list[int]) -> int: ...

    def load(self) -> int: ...


@dataclass
class RouteDecision:
    replica: int
    matched_tokens: int
    reason: str  # "prefix" | "least_loaded"


@dataclass
class RouterStats:
    routed: int = 0
    prefix_routed: int = 0
    per_replica: list[int] = field(default_factory=list)


class PrefixRouter:
    """Route requests over ``replicas`` by longest cached prefix, else least load."""

    def __init__(self, replicas: Sequence, min_match_tokens: int = 1, max_load_gap: int | None = None):
        if not replicas:
            raise ValueError("PrefixRouter needs at least one replica")
        self.replicas = list(replicas)
        self.min_match_tokens = min_match_tokens
        self.max_load_gap = max_load_gap
        self.stats = RouterStats(per_replica=[0] * len(self.replicas))
        self._owner: dict[str, int] = {}

    def route(self, prompt_token_ids: list[int]) -> RouteDecision:
        loads = [r.load() for r in self.replicas]
        least = min(range(len(loads)), key=lambda i: (loads[i], i))
        matches = [r.cached_prefix_tokens(prompt_token_ids) for r in self.replicas]
        best = max(matches)
        if best >= self.min_match_tokens:
            cands = [i for i, m in enumerate(matches) if m == best]
            pick = min(cands, key=lambda i: (loads[i], i))
            if self.max_load_gap is None or loads[pick] - loads[least] <= self.max_load_gap:
                return RouteDecision(pick, best, "prefix")
        return RouteDecision(least, matches[least], "least_loaded")

    # ------------------------------------------------------------------ driving LLMEngine replicas
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams | None = None) -> RouteDecision:
        d = self.route(prompt_token_ids)
        self.replicas[d.replica].add_request(request_id, prompt_token_ids, params)
        self._owner[request_id] = d.replica
        self.stats.routed += 1
        self.stats.prefix_routed += d.reason == "prefix"
        self.stats.per_replica[d.replica] += 1
        return d

    def abort_request(self, request_id: str) -> bool:
        i = self._owner.pop(request_id, None)
        return False if i is None else self.replicas[i].abort_request(request_id)

    def has_unfinished(self) -> bool:
        return any(r.has_unfinished() for r in self.replicas)

    def step(self) -> list[RequestOutput]:
        """One step of every replica with work (sequentially; replicas are independent)."""
        out: list[RequestOutput] = []
        for r in self.replicas:
            if r.has_unfinished():
                out.extend(r.step())
        for o in out:
            if o.finished:
                self._owner.pop(o.request_id, None)
        return out
