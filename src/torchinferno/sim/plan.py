"""``sim-plan``: the cheapest cluster shape that meets a latency SLO at a request rate.

Candidates: every TP size in ``tp_sizes``, colocated replica counts and P:D splits with at most
``max_gpus`` GPUs. Each is simulated on the same seeded workload; a plan meets the SLO when its p99 TTFT
and p99 TPOT are within bounds and every request completed. The answer is the feasible plan with the fewest
GPUs, ties broken by output throughput.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torchinferno.errors import ConfigError
from torchinferno.sim.calibration import Calibration
from torchinferno.sim.cluster import ClusterSpec, simulate_cluster
from torchinferno.sim.traffic import SimRequest

__all__ = ["SLO", "candidates", "plan"]


@dataclass(frozen=True)
class SLO:
    p99_ttft_s: float
    p99_tpot_s: float


def candidates(base: ClusterSpec, max_gpus: int, tp_sizes=(1, 2, 4, 8), disagg: bool = True) -> list[ClusterSpec]:
    out = []
    for tp in tp_sizes:
        n = max_gpus // tp
        for r in range(1, n + 1):
            out.append(replace(base, tp=tp, replicas=r, prefill_replicas=0))
        if disagg:
            for p in range(1, n):
                for d in range(1, n - p + 1):
                    out.append(replace(base, tp=tp, replicas=d, prefill_replicas=p))
    return sorted(out, key=lambda s: (s.num_gpus, s.tp, s.prefill_replicas))


def plan(base: ClusterSpec, cal: Calibration, requests: list[SimRequest], slo: SLO, max_gpus: int,
         tp_sizes=(1, 2, 4, 8), disagg: bool = True, log=print) -> dict:
    """Simulate candidates in increasing GPU count; stop after the first GPU count with a feasible plan."""
    if max_gpus < 1:
        raise ConfigError(f"max GPUs must be >= 1, got {max_gpus}")
    if not tp_sizes or any(t < 1 for t in tp_sizes):
        raise ConfigError(f"TP sizes must be >= 1, got {list(tp_sizes)}")
    rows, best, best_gpus = [], None, None
    for spec in candidates(base, max_gpus, tp_sizes, disagg):
        if best_gpus is not None and spec.num_gpus > best_gpus:
            break
        _, s = simulate_cluster(spec, cal, requests)
        ok = (s["completed"] == len(requests) and s["p99_ttft_s"] <= slo.p99_ttft_s
              and s["p99_tpot_s"] <= slo.p99_tpot_s)
        row = {"plan": spec.describe(), "gpus": spec.num_gpus, "tp": spec.tp, "replicas": spec.replicas,
               "prefill_replicas": spec.prefill_replicas, "meets_slo": ok, "p99_ttft_s": s["p99_ttft_s"],
               "p99_tpot_s": s["p99_tpot_s"], "output_throughput": s["output_throughput"]}
        if "kv" in s:  # a KV spec or memory was given: the pools and the largest batch they allowed
            row["kv"] = s["kv"]
        rows.append(row)
        log(f"  {row['plan']:<34} p99 TTFT {s['p99_ttft_s'] * 1e3:9.1f} ms  p99 TPOT {s['p99_tpot_s'] * 1e3:7.2f} ms  "
            f"{s['output_throughput']:9.0f} tok/s  {'meets' if ok else 'misses'} SLO")
        if ok and (best is None or row["output_throughput"] > best["output_throughput"]):
            best, best_gpus = row, spec.num_gpus
    return {"best": best, "candidates": rows, "slo": {"p99_ttft_s": slo.p99_ttft_s, "p99_tpot_s": slo.p99_tpot_s}}
