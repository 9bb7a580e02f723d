"""What the simulator predicts lone graph prefill steps do (EngineConfig.graph_prefill_alone, session 27), before a
GPU measures it: the timeline fitted on a served run's step log (default: H100 run 73's A calibration, 8B shape),
Poisson arrivals of 128-token prompts and 128-token outputs at several rates, the real scheduler with and without
the option. No GPU, no model; about 10 s on a CPU core.

    PYTHONPATH=src python3 benchmarks/sim_whatif_lone_prefill.py [--fit benchmarks/results/run73/offline_timeline.json]
"""

from __future__ import annotations

import argparse
import json


def main(argv=None) -> int:
    from torchinferno.engine.config import EngineConfig
    from torchinferno.engine.core import EngineCore
    from torchinferno.sim.driver import Replica, run_workload
    from torchinferno.sim.executor import SimulatedExecutor
    from torchinferno.sim.timeline import TimelineModel
    from torchinferno.sim.traffic import TrafficSpec, generate

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fit", default="benchmarks/results/run73/offline_timeline.json",
                   help="sim_offline_validate.py output whose a_to_b timeline is used")
    p.add_argument("--rates", type=float, nargs="+", default=[5, 20, 50, 100, 200])
    p.add_argument("--requests", type=int, default=400)
    a = p.parse_args(argv)
    tl = TimelineModel.from_dict(json.load(open(a.fit))["a_to_b"]["timeline"])
    print(f"timeline of {a.fit}: graphs {tl.graphs}, prefill graphs up to {tl.prefill_graph_tokens} tokens")
    print("rate/s | TTFT p50 ms off -> on | TTFT p99 | TPOT p50 ms | TPOT p99 | tok/s | lone steps")
    for rate in a.rates:
        reqs = generate(TrafficSpec(num_requests=a.requests, rate=rate, prompt_len="fixed:128",
                                    output_len="fixed:128", seed=1))
        res = []
        for alone in (False, True):
            ex = SimulatedExecutor(tl, EngineConfig(graph_prefill_alone=alone), num_blocks=20000, max_model_len=4096,
                                   device="cuda")
            core = EngineCore(ex)
            res.append((run_workload(reqs, [Replica(core, ex.clock, "sim")]).summary(), core.scheduler.num_lone_prefills))
        (off, _), (on, n) = res

        def ms(key: str) -> str:
            return f"{off[key] * 1e3:.1f} -> {on[key] * 1e3:.1f}"

        print(f"{rate:g} | {ms('p50_ttft_s')} | {ms('p99_ttft_s')} | {ms('p50_tpot_s')} | {ms('p99_tpot_s')} | "
              f"{off['output_throughput']:.0f} -> {on['output_throughput']:.0f} | "
              f"{n}/{a.requests}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
