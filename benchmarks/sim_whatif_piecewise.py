"""What the simulator predicts piecewise CUDA graphs for mixed steps do (EngineConfig.cuda_graph_piecewise_tokens,
session 28), before or beside a GPU measurement: the timeline fitted on a served run's step log (default: H100 run
73's A calibration, 8B shape, whose mixed steps ran eagerly), Poisson arrivals of 128-token prompts and 128-token
outputs at several rates, the real scheduler (lone graph prefill on, the default). Mixed steps of at most 512 tokens
then pay ``launch_piecewise`` (each value of ``--launch-ms``) instead of the fitted eager launch. No GPU, no model.

    PYTHONPATH=src python3 benchmarks/sim_whatif_piecewise.py [--fit ...offline_timeline.json] [--launch-ms 1 3]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace


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
    p.add_argument("--launch-ms", type=float, nargs="+", default=[1.0, 3.0],
                   help="host time of a piecewise mixed step's launch (33 graph replays + 32 eager attentions)")
    a = p.parse_args(argv)
    base = TimelineModel.from_dict(json.load(open(a.fit))["a_to_b"]["timeline"])
    pe = base.params
    print(f"timeline of {a.fit}: eager launch {pe['launch_eager'] * 1e3:.1f} ms + "
          f"{pe['launch_eager_seq'] * 1e3:.3f} ms/row, graph launch {pe['launch_graph'] * 1e3:.2f} ms")
    models = [("eager", base)] + [(f"pw {x:g} ms", replace(base, piecewise_graph_tokens=512,
                                                           params={**pe, "launch_piecewise": x * 1e-3}))
                                  for x in a.launch_ms]
    print("rate/s | " + " | ".join(f"{name}: TTFT p50/p99, TPOT p50/p99 ms, tok/s" for name, _ in models))
    for rate in a.rates:
        reqs = generate(TrafficSpec(num_requests=a.requests, rate=rate, prompt_len="fixed:128",
                                    output_len="fixed:128", seed=1))
        cells = []
        for _, tl in models:
            ex = SimulatedExecutor(tl, EngineConfig(), num_blocks=20000, max_model_len=4096, device="cuda")
            s = run_workload(reqs, [Replica(EngineCore(ex), ex.clock, "sim")]).summary()
            cells.append(f"{s['p50_ttft_s'] * 1e3:.1f}/{s['p99_ttft_s'] * 1e3:.1f}, "
                         f"{s['p50_tpot_s'] * 1e3:.1f}/{s['p99_tpot_s'] * 1e3:.1f}, {s['output_throughput']:.0f}")
        print(f"{rate:g} | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
