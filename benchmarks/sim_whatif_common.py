"""Shared by the sim_whatif_*.py scripts: the timeline fitted on a served run, and one simulated serving of Poisson
arrivals through the real engine core (no GPU, no model)."""

from __future__ import annotations

import argparse
import json


def whatif_args(doc: str) -> argparse.ArgumentParser:
    """The options every what-if takes: the fit file, the rates, requests per rate."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--fit", default="benchmarks/results/run73/offline_timeline.json",
                   help="sim_offline_validate.py output whose a_to_b timeline is used")
    p.add_argument("--rates", type=float, nargs="+", default=[5, 20, 50, 100, 200])
    p.add_argument("--requests", type=int, default=400)
    return p


def fitted_timeline(path: str):
    from torchinferno.sim.timeline import TimelineModel

    with open(path) as f:
        fit = json.load(f)["a_to_b"]  # sim_offline_validate's output, or a run's saved {"a_to_b": timeline, ...}
    return TimelineModel.from_dict(fit.get("timeline", fit))


def poisson_serving(timeline, config, rate: float, requests: int, prompt: int = 128, output: int = 128,
                    seed: int = 1) -> tuple[dict, object]:
    """``requests`` Poisson arrivals at ``rate``/s of ``prompt`` + ``output`` tokens on one simulated replica whose
    engine runs ``config`` -> (the run's summary, its engine core)."""
    from torchinferno.engine.core import EngineCore
    from torchinferno.sim.driver import Replica, run_workload
    from torchinferno.sim.executor import SimulatedExecutor
    from torchinferno.sim.traffic import TrafficSpec, generate

    reqs = generate(TrafficSpec(num_requests=requests, rate=rate, prompt_len=f"fixed:{prompt}",
                                output_len=f"fixed:{output}", seed=seed))
    ex = SimulatedExecutor(timeline, config, num_blocks=20000, max_model_len=4096, device="cuda")
    core = EngineCore(ex)
    return run_workload(reqs, [Replica(core, ex.clock, "sim")]).summary(), core
