"""Cluster model: replicas (each a TP group of ``tp`` devices), colocated or prefill/decode roles, a router
and network links, all simulated with the real ``EngineCore`` per replica.

* A TP group's step costs the calibrated model's ``CostModel.with_tp`` (compute split over ``tp`` ranks,
  ring all-reduces over ``tp_link``).
* P/D: ``prefill_replicas`` > 0 makes that many prefill replicas (each request prefilled there and sampled
  once) and ``replicas`` decode replicas; the first token is the prefill replica's, the prompt KV then
  crosses ``pd_link`` (``prompt_len * kv_bytes_per_token / tp`` bytes per rank, in parallel; with ``kv``, the
  spec's ``sequence_bytes`` of the prompt instead) and the
  decode replica holds it without recomputing it.
* GPUs used = ``(replicas + prefill_replicas) * tp``.
* KV pools per replica: ``kv`` (a model's ``KVSpec``, ``sim.kv_source``) sizes them with the engine's planner
  (``sim.kv_capacity``; a hybrid spec gets its sliding pool) from ``engine.kv_cache_memory`` bytes, else with
  ``num_blocks`` whole blocks; without ``kv``, ``engine.kv_cache_memory`` is ``kv_cache_memory //
  (kv_bytes_per_token x block_size)`` whole blocks (one pool, every token at the calibration's bytes), else
  ``num_blocks``. Either way the memory is per replica (all its TP ranks together).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torchinferno.engine.config import EngineConfig
from torchinferno.engine.core import EngineCore
from torchinferno.errors import ConfigError
from torchinferno.sim.calibration import Calibration
from torchinferno.sim.cost_model import LinkModel
from torchinferno.sim.driver import Replica, RunResult, run_workload
from torchinferno.sim.executor import SimulatedExecutor
from torchinferno.sim.kv_source import ModelKV
from torchinferno.sim.routing import make_router
from torchinferno.sim.traffic import SimRequest

__all__ = ["ClusterSpec", "build_replicas", "simulate_cluster"]


@dataclass
class ClusterSpec:
    replicas: int = 1  # colocated replicas, or decode replicas when prefill_replicas > 0
    prefill_replicas: int = 0
    tp: int = 1
    router: str = "least_loaded"
    tp_link: LinkModel = field(default_factory=lambda: LinkModel(5e-6, 400e9))  # NVLink-class
    pd_link: LinkModel = field(default_factory=lambda: LinkModel(10e-6, 50e9))  # a 400 Gb/s NIC
    num_blocks: int = 4096  # KV blocks per replica
    max_model_len: int = 8192
    device: str = "cuda"
    engine: EngineConfig = field(default_factory=EngineConfig)
    tp_efficiency: float = 0.9
    cost_model: str = "auto"  # Calibration.model_for: auto | timeline | linear
    kv: ModelKV | None = None  # the simulated model's KV layout (None: one whole-context pool)

    def __post_init__(self) -> None:
        for name in ("replicas", "tp", "num_blocks"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.prefill_replicas < 0:
            raise ConfigError(f"prefill_replicas must be >= 0, got {self.prefill_replicas}")

    @property
    def num_gpus(self) -> int:
        return (self.replicas + self.prefill_replicas) * self.tp

    def describe(self) -> str:
        shape = (f"{self.prefill_replicas}P:{self.replicas}D" if self.prefill_replicas else f"{self.replicas} colocated")
        return f"{shape} x TP{self.tp} ({self.num_gpus} GPUs, {self.router})"


def build_replicas(spec: ClusterSpec, cal: Calibration) -> list[Replica]:
    cost = cal.model_for(spec.cost_model)
    if spec.tp > 1:
        if not (cal.hidden_size and cal.num_layers):
            raise ConfigError("TP > 1 needs the calibration's hidden_size and num_layers (sim-calibrate records them)")
        cost = cost.with_tp(spec.tp, spec.tp_link, cal.hidden_size, cal.num_layers, efficiency=spec.tp_efficiency)
    reps, kv_kw = [], _kv_kwargs(spec, cal)
    roles = [("prefill", spec.prefill_replicas), ("decode" if spec.prefill_replicas else "both", spec.replicas)]
    for role, n in roles:
        for i in range(n):
            ex = SimulatedExecutor(cost, spec.engine, max_model_len=spec.max_model_len, device=spec.device, **kv_kw)
            reps.append(Replica(EngineCore(ex), ex.clock, f"{role[0]}{i}", role))
    return reps


def _kv_kwargs(spec: ClusterSpec, cal: Calibration) -> dict:
    """``SimulatedExecutor`` keywords for the replica's KV pools (module docstring)."""
    import torch

    mem = spec.engine.kv_cache_memory
    if spec.kv is not None:
        dtype = spec.engine.kv_cache_dtype or torch.bfloat16
        return {"num_blocks": spec.num_blocks, "kv_spec": spec.kv.spec, "kv_dtype": dtype, "kv_cache_memory": mem}
    if mem is None:
        return {"num_blocks": spec.num_blocks}
    per_block = (cal.kv_bytes_per_token or 0) * spec.engine.block_size
    if per_block <= 0:
        raise ConfigError("a KV cache memory without a model's KV spec needs kv_bytes_per_token (--kv-bytes-per-token)")
    if mem < per_block:
        raise ConfigError(f"KV cache memory {mem} bytes holds no block (one block needs {per_block} bytes)")
    return {"num_blocks": mem // per_block}


def kv_summary(reps: list[Replica], spec: ClusterSpec) -> dict:
    """Every replica's KV pools and the largest batch any of them ran (``EngineStats.max_batch_seqs``)."""
    ex = reps[0].core.executor  # every replica of a cluster has the same pools
    return {"model": spec.kv.describe() if spec.kv is not None else None, "kv_cache_memory": spec.engine.kv_cache_memory,
            "num_blocks": ex.num_blocks, "num_sliding_blocks": ex.num_sliding_blocks,
            "sliding_window": ex.sliding_window if ex.num_sliding_blocks is not None else 0,
            "block_size": ex.block_size, "max_batch_seqs": max(r.core.stats().max_batch_seqs for r in reps)}


def simulate_cluster(spec: ClusterSpec, cal: Calibration, requests: list[SimRequest],
                     max_concurrency: int | None = None) -> tuple[RunResult, dict]:
    """Run ``requests`` on the cluster; returns the run and its summary (plus per-replica counts)."""
    reps = build_replicas(spec, cal)
    kvb = cal.kv_bytes_per_token
    if spec.kv is not None:  # the bytes a sequence holds in the pools (hybrid: whole entries + one window)
        import torch

        dtype, bs = spec.engine.kv_cache_dtype or torch.bfloat16, spec.engine.block_size

        def prompt_bytes(n: int) -> int:
            return spec.kv.spec.sequence_bytes(dtype, n, bs)
    else:
        def prompt_bytes(n: int) -> int:
            return n * kvb

    def transfer(req: SimRequest) -> float:
        return spec.pd_link.transfer_s(prompt_bytes(req.prompt_len) / spec.tp)

    res = run_workload(requests, reps, make_router(spec.router), max_concurrency=max_concurrency, transfer=transfer)
    summ = res.summary()
    summ["cluster"] = spec.describe()
    summ["num_gpus"] = spec.num_gpus
    summ["per_replica_requests"] = {r.name: r.num_added for r in reps}
    summ["preemptions"] = sum(r.core.stats().num_preemptions for r in reps)
    summ["prefix_hit_rate"] = _hit_rate(reps)
    if spec.kv is not None or spec.engine.kv_cache_memory is not None:  # default runs keep their old summary
        summ["kv"] = kv_summary(reps, spec)
    return res, summ


def _hit_rate(reps: list[Replica]) -> float:
    q = sum(r.core.pool.prefix_queries for r in reps)
    return sum(r.core.pool.prefix_hits for r in reps) / q if q else 0.0
