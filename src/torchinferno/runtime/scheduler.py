"""``torchinferno.runtime.scheduler``: disaggregated prefill/decode planning (``sim.cluster``, ``sim.plan``);
thin re-exports. The engine's own continuous-batching scheduler is ``engine.scheduler.Scheduler``."""

from torchinferno.sim.cluster import ClusterSpec, simulate_cluster
from torchinferno.sim.plan import SLO, plan

__all__ = ["SLO", "ClusterSpec", "plan", "simulate_cluster"]
