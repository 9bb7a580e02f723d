"""What the simulator predicts whole-step CUDA graphs for mixed steps do (``--cuda-graph-mixed-mode full``, session
30), before a GPU measures them: the timeline fitted on a served run's step log (default: H100 run 77's A
calibration, 8B shape, whose mixed steps ran piecewise at ~9 ms of launch), Poisson arrivals of 128-token prompts and
128-token outputs at several rates, the real scheduler (lone graph prefill on, the default, and off: every arriving
prompt joins the decodes' step). The full column prices every step of at most 512 tokens as a graph replay
(``TimelineModel.with_mixed_graphs``: the decode graphs' launch, the same device work). No GPU, no model.

    PYTHONPATH=src python3 benchmarks/sim_whatif_mixed_graphs.py [--fit benchmarks/results/run77/default_timeline.json]
"""

from __future__ import annotations


def main(argv=None) -> int:
    from sim_whatif_common import fitted_timeline, poisson_serving, whatif_args

    from torchinferno.engine.config import EngineConfig

    p = whatif_args(__doc__)
    p.set_defaults(fit="benchmarks/results/run77/default_timeline.json", rates=[8, 16, 32, 64, 128])
    a = p.parse_args(argv)
    base = fitted_timeline(a.fit)
    pe = base.params
    print(f"timeline of {a.fit}: piecewise launch {pe['launch_piecewise'] * 1e3:.2f} ms (steps <= "
          f"{base.piecewise_graph_tokens} tokens), graph launch {pe['launch_graph'] * 1e3:.2f} ms, host step "
          f"{pe['host_step'] * 1e3:.2f} ms")
    models = [("piecewise", base), ("full", base.with_mixed_graphs())]
    print("lone | rate/s | TTFT p50 ms piecewise -> full | TTFT p99 | TPOT p50 ms | TPOT p99 | tok/s")
    for alone in (True, False):
        for rate in a.rates:
            got = [poisson_serving(tl, EngineConfig(graph_prefill_alone=alone), rate, a.requests)[0]
                   for _, tl in models]

            def ms(key: str) -> str:
                return f"{got[0][key] * 1e3:.1f} -> {got[1][key] * 1e3:.1f}"

            print(f"{'on' if alone else 'off'} | {rate:g} | {ms('p50_ttft_s')} | {ms('p99_ttft_s')} | "
                  f"{ms('p50_tpot_s')} | {ms('p99_tpot_s')} | "
                  f"{got[0]['output_throughput']:.0f} -> {got[1]['output_throughput']:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
