"""What the simulator predicts lone graph prefill steps do (EngineConfig.graph_prefill_alone, session 27), before a
GPU measures it: the timeline fitted on a served run's step log (default: H100 run 73's A calibration, 8B shape),
Poisson arrivals of 128-token prompts and 128-token outputs at several rates, the real scheduler with and without
the option. No GPU, no model; about 10 s on a CPU core.

    PYTHONPATH=src python3 benchmarks/sim_whatif_lone_prefill.py [--fit benchmarks/results/run73/offline_timeline.json]
"""

from __future__ import annotations

def main(argv=None) -> int:
    from sim_whatif_common import fitted_timeline, poisson_serving, whatif_args

    from torchinferno.engine.config import EngineConfig

    a = whatif_args(__doc__).parse_args(argv)
    tl = fitted_timeline(a.fit)
    print(f"timeline of {a.fit}: graphs {tl.graphs}, prefill graphs up to {tl.prefill_graph_tokens} tokens")
    print("rate/s | TTFT p50 ms off -> on | TTFT p99 | TPOT p50 ms | TPOT p99 | tok/s | lone steps")
    for rate in a.rates:
        res = []
        for alone in (False, True):
            summary, core = poisson_serving(tl, EngineConfig(graph_prefill_alone=alone), rate, a.requests)
            res.append((summary, core.scheduler.num_lone_prefills))
        (off, _), (on, n) = res

        def ms(key: str) -> str:
            return f"{off[key] * 1e3:.1f} -> {on[key] * 1e3:.1f}"

        print(f"{rate:g} | {ms('p50_ttft_s')} | {ms('p99_ttft_s')} | {ms('p50_tpot_s')} | {ms('p99_tpot_s')} | "
              f"{off['output_throughput']:.0f} -> {on['output_throughput']:.0f} | "
              f"{n}/{a.requests}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
