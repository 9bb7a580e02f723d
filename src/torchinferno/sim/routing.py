"""Routers over simulated replicas: ``round_robin``, ``least_loaded``, ``prefix_aware``, ``cache_aware``.

A router is called as ``router(request, candidates) -> Replica`` at the request's send time, with the
replicas that may take it (all entry replicas, or the decode replicas of a P/D cluster). ``prefix_aware``
is the engine's own ``engine.router.PrefixRouter`` (longest cached prefix in whole blocks, else least
loaded) over the replicas' real block pools (an oracle: it sees every pool); ``cache_aware`` is the serving
router's policy (``engine.route_policy``: its own approximate prefix trees, load-balance threshold), as
``serve --data-parallel-size`` and ``router`` run it.
"""

from __future__ import annotations

from torchinferno.engine.router import PrefixRouter
from torchinferno.errors import ConfigError

__all__ = ["ROUTERS", "make_router"]

ROUTERS = ("round_robin", "least_loaded", "prefix_aware", "cache_aware")


class _RoundRobin:
    def __init__(self):
        self.next: dict[int, int] = {}

    def __call__(self, req, cands):
        k = id(cands)
        i = self.next.get(k, 0)
        self.next[k] = i + 1
        return cands[i % len(cands)]


def _least_loaded(req, cands):
    best = cands[0]
    bl = best.load()
    for r in cands[1:]:
        lv = r.load()
        if lv < bl:
            best, bl = r, lv
    return best


class _PrefixAware:
    def __init__(self, max_load_gap: int | None = None):
        self.routers: dict[int, PrefixRouter] = {}
        self.max_load_gap = max_load_gap

    def __call__(self, req, cands):
        k = id(cands)
        r = self.routers.get(k)
        if r is None:
            r = self.routers[k] = PrefixRouter([c.core for c in cands], max_load_gap=self.max_load_gap)
        return cands[r.route(req.prompt_token_ids).replica]


class _CacheAware:
    def __init__(self):
        self.routers: dict[int, object] = {}

    def __call__(self, req, cands):
        from torchinferno.engine.route_policy import make_policy
        from torchinferno.sim.policy_bench import PolicyRouter

        k = id(cands)
        r = self.routers.get(k)
        if r is None:
            pool = cands[0].core.pool
            r = self.routers[k] = PolicyRouter(make_policy("cache-aware", len(cands), min_match_tokens=pool.block_size,
                                                           max_tree_tokens=pool.num_blocks * pool.block_size))
        return r(req, cands)


def make_router(name: str, max_load_gap: int | None = 8):
    """A fresh router by name (state such as the round-robin cursor is per router)."""
    if name == "round_robin":
        return _RoundRobin()
    if name == "least_loaded":
        return _least_loaded
    if name == "prefix_aware":
        return _PrefixAware(max_load_gap)
    if name == "cache_aware":
        return _CacheAware()
    raise ConfigError(f"unknown router {name!r} (valid: {', '.join(ROUTERS)})")
