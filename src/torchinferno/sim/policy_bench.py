"""Routing / scheduling policy comparisons on one workload: live on a real model, or simulated (``bench-router``,
``research``).

Live: N replicas of a real ``EngineCore`` (one ``UniprocExecutor`` each, sharing the model's weights) in this process,
driven by ``sim.driver.run_workload``. Replicas run in parallel in the modelled world but are stepped one at a time
here, so each has its own virtual clock advanced by the *measured* duration of each of its steps (this thread's CPU
time by default: on a shared host, time spent descheduled does not count; run torch with one thread). Simulated: the
same cores over ``SimulatedExecutor`` (a ``CostModel``). The router is the serving router's own
``engine.route_policy`` policy, seeing each replica's requests in flight and KV usage.

Figures per run: ``sim.driver.summarize`` (throughput, TTFT / TPOT / ITL percentiles) plus ``prefix_hit_rate`` (prompt
tokens the replicas' real prefix caches served / prompt tokens admitted, over the run), ``router_hit_rate`` (the
router's own tree's prediction) and per-replica request counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from torchinferno.engine.config import EngineConfig
from torchinferno.engine.core import EngineCore
from torchinferno.engine.route_policy import ReplicaState, make_policy
from torchinferno.errors import ConfigError
from torchinferno.sim.driver import Replica, run_workload
from torchinferno.sim.executor import VirtualClock
from torchinferno.sim.traffic import SimRequest

__all__ = ["MeasuredReplica", "PolicyRouter", "RunSetup", "bench_model", "live_replicas", "run_policy", "sim_replicas"]

TIMERS = {"thread": time.thread_time, "wall": time.perf_counter}


class MeasuredReplica(Replica):
    """A real engine core on its own virtual clock, advanced by each step's measured duration (module docstring).
    ``priorities``: request id -> priority (lower first) for a core with ``scheduling_policy="priority"``."""

    def __init__(self, core: EngineCore, name: str, timer=time.thread_time, priorities: dict | None = None):
        super().__init__(core, VirtualClock(), name, priorities=priorities)
        self.timer = timer
        self.busy_s = 0.0

    def step(self) -> tuple[float, list]:
        t0 = self.timer()
        outs = self.core.step()
        dt = self.timer() - t0
        self.busy_s += dt
        self.clock.advance(dt)
        return self.clock.now(), outs


class PolicyRouter:
    """``run_workload``'s router over a ``RoutingPolicy``: states from the candidates' cores."""

    def __init__(self, policy):
        self.policy = policy

    def __call__(self, req: SimRequest, cands: list[Replica]) -> Replica:
        states = [ReplicaState(c.load(), c.core.pool.usage) for c in cands]
        return cands[self.policy.route(req.prompt_token_ids, states).replica]


@dataclass
class RunSetup:
    """One run: ``policy`` routes over ``num_replicas`` replicas whose cores use ``scheduling`` (fcfs, sjf,
    priority), ``enable_prefix_caching`` and the prefix cache's ``eviction`` order (lru, fifo)."""

    policy: str = "cache-aware"
    num_replicas: int = 2
    scheduling: str = "fcfs"
    enable_prefix_caching: bool = True
    policy_options: dict | None = None
    eviction: str = "lru"


def live_replicas(model, engine_config: EngineConfig, n: int, timer: str = "thread",
                  priorities: dict | None = None) -> list[Replica]:
    from torchinferno.engine.executor import UniprocExecutor

    if timer not in TIMERS:
        raise ConfigError(f"unknown timer {timer!r} (valid: {', '.join(TIMERS)})")
    vocab = getattr(model.config, "vocab_size", None)
    return [MeasuredReplica(EngineCore(UniprocExecutor(model, engine_config), (), vocab), f"r{i}", TIMERS[timer],
                            priorities) for i in range(n)]


def sim_replicas(cost_model, engine_config: EngineConfig, n: int, num_blocks: int, max_model_len: int,
                 priorities: dict | None = None) -> list[Replica]:
    from torchinferno.sim.executor import SimulatedExecutor

    reps = []
    for i in range(n):
        ex = SimulatedExecutor(cost_model, engine_config, num_blocks=num_blocks, max_model_len=max_model_len)
        rep = MeasuredReplica(EngineCore(ex), f"s{i}", priorities=priorities)
        rep.clock = ex.clock  # the cost model advances it; the measured time is the simulator's, not counted
        rep.timer = lambda: 0.0
        reps.append(rep)
    return reps


def engine_config_for(base: EngineConfig, setup: RunSetup) -> EngineConfig:
    return replace(base, scheduling_policy=setup.scheduling, enable_prefix_caching=setup.enable_prefix_caching,
                   prefix_cache_eviction=setup.eviction)


def run_policy(requests: list[SimRequest], replicas: list[Replica], setup: RunSetup,
               max_concurrency: int | None = None) -> dict:
    """Serve ``requests`` on fresh ``replicas`` routed by ``setup.policy``; the figures of the module docstring."""
    opts = dict(setup.policy_options or {})
    if setup.policy.replace("_", "-") == "cache-aware":
        pool = replicas[0].core.pool
        opts.setdefault("min_match_tokens", pool.block_size)
        opts.setdefault("max_tree_tokens", pool.num_blocks * pool.block_size)
    policy = make_policy(setup.policy, len(replicas), **opts)
    q0 = [(r.core.pool.prefix_queries, r.core.pool.prefix_hits) for r in replicas]
    res = run_workload(requests, replicas, PolicyRouter(policy), max_concurrency=max_concurrency)
    out = res.summary()
    q = sum(r.core.pool.prefix_queries - a for r, (a, _) in zip(replicas, q0))
    h = sum(r.core.pool.prefix_hits - b for r, (_, b) in zip(replicas, q0))
    out["prefix_hit_rate"] = h / q if q else 0.0
    out["router_hit_rate"] = policy.stats.hit_rate
    out["per_replica_requests"] = "/".join(str(x) for x in policy.stats.per_replica)
    out["preemptions"] = sum(r.core.stats().num_preemptions for r in replicas)
    return out


def bench_model(size: str = "bench", device: str = "cpu", dtype: str = "float32", max_len: int = 2048):
    """The model the live comparisons run: ``bench`` = the llama3 debug shape widened (hidden 128, 4 layers) with a
    ``max_len`` context, randomly initialized (seeded); any other name is a named llama3 size (e.g. ``llama3-8b``:
    full-size random weights, for the device run)."""
    import torch

    from torchinferno.models.registry import get_family
    from torchinferno.testing import randomize_

    fam = get_family("llama3")
    if size == "bench":
        from torchinferno.models.llama3.config import debug_config

        torch.manual_seed(0)
        cfg = debug_config(max_seq_len=max_len, hidden_size=128, intermediate_size=384, num_hidden_layers=4)
        m = randomize_(fam.build(cfg, device=device).to(getattr(torch, dtype)).eval())
        m.family = fam
        return m
    from torchinferno.engine.assembly import ModelSpec, build_model

    return build_model(ModelSpec(model_kind="llama3", size=size, dtype=dtype, device=device))
