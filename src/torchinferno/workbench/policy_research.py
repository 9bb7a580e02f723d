"""Policy research: routing, scheduling and prefix-cache policies compared on one trace, through ``ResearchHarness``.

Every experiment serves the same requests on ``num_replicas`` replicas (``sim.policy_bench``: live = real engine cores
on a tiny or given model, each on its own measured clock; sim = the same cores over the simulator's cost model) and
reports one row: output throughput, TTFT / TPOT percentiles (ms), the replicas' prefix-cache hit rate and the router's.

Experiments (``live:`` and/or ``sim:`` prefixed):

* ``route/<policy>``: each routing policy (``engine.route_policy.POLICIES``), FCFS scheduling, LRU prefix cache;
* ``sched/<policy>``: each scheduling policy (fcfs, sjf, priority) under cache-aware routing; ``priority`` serves a
  conversation's later turns first (priority = -turn for the chat trace's ``c<i>-t<k>`` ids, 0 otherwise);
* ``cache/lru``, ``cache/fifo``, ``cache/off``: the prefix cache evicting least recently used blocks first, or the
  blocks registered longest ago first (``cache.block_pool``), against no prefix caching; cache-aware routing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from torchinferno.engine.config import EngineConfig
from torchinferno.engine.route_policy import POLICIES
from torchinferno.errors import ConfigError
from torchinferno.sim.policy_bench import (
    RunSetup,
    engine_config_for,
    live_replicas,
    run_policy,
    sim_replicas,
)
from torchinferno.sim.traffic import SimRequest
from torchinferno.workbench.research import ResearchHarness

__all__ = ["SCHEDULING", "PolicyStudy", "policy_harness", "priorities_by_turn", "warm_up"]

SCHEDULING = ("fcfs", "sjf", "priority")
GROUPS = ("route", "sched", "cache")
_TURN = re.compile(r"^c\d+-t(\d+)$")


def priorities_by_turn(requests: list[SimRequest]) -> dict[str, int]:
    out = {}
    for r in requests:
        m = _TURN.match(r.request_id)
        out[r.request_id] = -int(m.group(1)) if m else 0
    return out


@dataclass
class PolicyStudy:
    """What to compare. ``model`` is needed for ``live``; ``cost_model`` (a ``sim.cost_model.CostModel``) for ``sim``.
    ``num_blocks`` sizes every replica's KV pool (live and simulated alike)."""

    requests: list[SimRequest]
    engine_config: EngineConfig
    num_blocks: int
    model: object = None
    cost_model: object = None
    num_replicas: int = 2
    modes: tuple[str, ...] = ("live",)
    groups: tuple[str, ...] = GROUPS
    routing: tuple[str, ...] = POLICIES
    timer: str = "thread"
    max_model_len: int = 2048
    raw: dict = field(default_factory=dict)  # experiment name -> the full summary dict

    def __post_init__(self) -> None:
        for m in self.modes:
            if m not in ("live", "sim"):
                raise ConfigError(f"unknown mode {m!r} (valid: live, sim)")
        for g in self.groups:
            if g not in GROUPS:
                raise ConfigError(f"unknown experiment group {g!r} (valid: {', '.join(GROUPS)})")
        if "live" in self.modes and self.model is None:
            raise ConfigError("live experiments need a model")
        if "sim" in self.modes and self.cost_model is None:
            raise ConfigError("simulated experiments need a cost model")


def _row(s: dict) -> dict:
    ms = lambda k: round(s[k] * 1e3, 3) if not math.isnan(s[k]) else s[k]
    return {"output_tok_s": round(s["output_throughput"], 1), "ttft_p50_ms": ms("p50_ttft_s"),
            "ttft_p90_ms": ms("p90_ttft_s"), "ttft_p99_ms": ms("p99_ttft_s"), "tpot_p50_ms": ms("p50_tpot_s"),
            "tpot_p99_ms": ms("p99_tpot_s"), "prefix_hit_rate": round(s["prefix_hit_rate"], 4),
            "router_hit_rate": round(s["router_hit_rate"], 4), "per_replica": s["per_replica_requests"]}


def _setups(study: PolicyStudy) -> list[tuple[str, RunSetup]]:
    out = []
    if "route" in study.groups:
        out += [(f"route/{p}", RunSetup(p, study.num_replicas)) for p in study.routing]
    if "sched" in study.groups:
        out += [(f"sched/{s}", RunSetup("cache-aware", study.num_replicas, scheduling=s)) for s in SCHEDULING]
    if "cache" in study.groups:
        out += [("cache/lru", RunSetup("cache-aware", study.num_replicas)),
                ("cache/fifo", RunSetup("cache-aware", study.num_replicas, eviction="fifo")),
                ("cache/off", RunSetup("cache-aware", study.num_replicas, enable_prefix_caching=False))]
    return out


def policy_harness(study: PolicyStudy, harness: ResearchHarness | None = None) -> ResearchHarness:
    """Register one experiment per (mode, setup) of ``study`` (module docstring); returns the harness."""
    h = harness or ResearchHarness()
    prios = priorities_by_turn(study.requests)
    cfg = replace(study.engine_config, num_gpu_blocks=study.num_blocks)
    for mode in study.modes:
        for name, setup in _setups(study):
            full = f"{mode}:{name}"

            def run(mode=mode, setup=setup, full=full) -> dict:
                ecfg = engine_config_for(cfg, setup)
                if mode == "live":
                    _release_device_memory()  # the previous run's KV pools and graphs
                    reps = live_replicas(study.model, ecfg, setup.num_replicas, study.timer, prios)
                else:
                    reps = sim_replicas(study.cost_model, ecfg, setup.num_replicas, study.num_blocks,
                                        study.max_model_len, prios)
                s = run_policy(study.requests, reps, setup)
                study.raw[full] = s
                return _row(s)

            h.register(full, run, f"{setup.policy} routing, {setup.scheduling} scheduling, "
                                  f"prefix cache {setup.eviction if setup.enable_prefix_caching else 'off'} ({mode})")
    return h


def _release_device_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def warm_up(study: PolicyStudy, n: int = 8) -> None:
    """Serve the first ``n`` requests once, untimed (first shapes pay allocator growth and kernel selection)."""
    if "live" not in study.modes:
        return
    cfg = replace(study.engine_config, num_gpu_blocks=study.num_blocks)
    reps = live_replicas(study.model, cfg, 1, study.timer)
    run_policy([SimRequest(r.request_id, 0.0, r.prompt_token_ids, min(r.output_len, 4)) for r in study.requests[:n]],
               reps, RunSetup("round-robin", 1))


def policy_smoke_harness(harness: ResearchHarness | None = None, live: bool = True) -> ResearchHarness:
    """``research-smoke``'s policy experiments on a small shared-system-prompt chat trace (3 system prompts x 2 users x
    2 turns): every group simulated, and the routing group live on the widened tiny llama3 (a few seconds)."""
    import torch

    from torchinferno.sim.chat_trace import ChatTraceSpec, shared_system_prompt
    from torchinferno.sim.cost_model import CostModel
    from torchinferno.sim.policy_bench import bench_model

    h = harness or ResearchHarness()
    reqs = shared_system_prompt(ChatTraceSpec(3, 2, 2, 128, "uniform:8:24", "uniform:8:16", rate=16.0, think_s=0.5,
                                              vocab_size=259))
    cfg = EngineConfig(block_size=16, max_num_seqs=16)
    cost = CostModel.per_token(30e-6, 60e-6, 7e-3)
    if live:
        torch.set_num_threads(1)
        study = PolicyStudy(reqs, cfg, 32, bench_model(max_len=1024), modes=("live",), groups=("route",),
                            max_model_len=1024)
        warm_up(study, 4)
        policy_harness(study, h)
    return policy_harness(PolicyStudy(reqs, cfg, 32, cost_model=cost, modes=("sim",), max_model_len=1024), h)
