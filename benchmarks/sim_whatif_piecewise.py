"""What the simulator predicts piecewise CUDA graphs for mixed steps do (EngineConfig.cuda_graph_piecewise_tokens,
session 28), before or beside a GPU measurement: the timeline fitted on a served run's step log (default: H100 run
73's A calibration, 8B shape, whose mixed steps ran eagerly), Poisson arrivals of 128-token prompts and 128-token
outputs at several rates, the real scheduler (lone graph prefill on, the default). Mixed steps of at most 512 tokens
then pay ``launch_piecewise`` (each value of ``--launch-ms``) instead of the fitted eager launch. No GPU, no model.

    PYTHONPATH=src python3 benchmarks/sim_whatif_piecewise.py [--fit ...offline_timeline.json] [--launch-ms 1 3]
"""

from __future__ import annotations

from dataclasses import replace


def main(argv=None) -> int:
    from sim_whatif_common import fitted_timeline, poisson_serving, whatif_args

    from torchinferno.engine.config import EngineConfig

    p = whatif_args(__doc__)
    p.add_argument("--launch-ms", type=float, nargs="+", default=[1.0, 3.0],
                   help="host time of a piecewise mixed step's launch (33 graph replays + 32 eager attentions)")
    a = p.parse_args(argv)
    base = fitted_timeline(a.fit)
    pe = base.params
    print(f"timeline of {a.fit}: eager launch {pe['launch_eager'] * 1e3:.1f} ms + "
          f"{pe['launch_eager_seq'] * 1e3:.3f} ms/row, graph launch {pe['launch_graph'] * 1e3:.2f} ms")
    models = [("eager", base)] + [(f"pw {x:g} ms", replace(base, piecewise_graph_tokens=512,
                                                           params={**pe, "launch_piecewise": x * 1e-3}))
                                  for x in a.launch_ms]
    print("rate/s | " + " | ".join(f"{name}: TTFT p50/p99, TPOT p50/p99 ms, tok/s" for name, _ in models))
    for rate in a.rates:
        cells = []
        for _, tl in models:
            s, _ = poisson_serving(tl, EngineConfig(), rate, a.requests)
            cells.append(f"{s['p50_ttft_s'] * 1e3:.1f}/{s['p99_ttft_s'] * 1e3:.1f}, "
                         f"{s['p50_tpot_s'] * 1e3:.1f}/{s['p99_tpot_s'] * 1e3:.1f}, {s['output_throughput']:.0f}")
        print(f"{rate:g} | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
