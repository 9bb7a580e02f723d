"""The simulator against served runs (issue 21), in one command: serve a model twice with ``--step-log`` (runs A
and B), drive each with ``bench-serve`` at each concurrency, fit a calibration from A's step log
(``sim-calibrate --from-step-log``, the API server's admission time fitted to A's TTFTs) and predict B's bench-serve results with it (``sim-validate --bench-results``):
out-of-sample, against what a user measures over HTTP; and B -> A, next to the noise floor (A's figures as a
prediction of B's), for the timeline and the linear cost models (``sim_offline_validate.py``, which re-runs the same
comparison later from the saved files without a GPU).

    PYTHONPATH=src python3 benchmarks/served_sim_validate.py --device cuda --out $OUT/sim21
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path


def serve_and_bench(args, run: str, out: Path) -> list[str]:
    from torchinferno.bench.local_server import LocalServer, free_port
    from torchinferno.bench.serve_client import ServeBenchConfig, run_serve_bench

    port = free_port()
    which = [args.model] if args.model else ["--model-kind", args.model_kind, "--model-size", args.model_size]
    argv = ["torchinferno", "serve", *which, "--device", args.device, "--dtype", args.dtype, "--port", str(port),
            "--step-log", str(out / f"steps_{run}.jsonl"), *shlex.split(args.serve_flags),
            *(shlex.split(args.c_flags) if run == "c" else [])]
    paths = []
    t = time.perf_counter()
    with LocalServer(argv, port, log_path=out / f"server_{run}.log", startup_timeout_s=args.startup_timeout) as s:
        print(f"[{run}] server ready in {time.perf_counter() - t:.1f} s", flush=True)
        # closed-loop levels (C requests in flight), then open-loop Poisson levels. Every level has its own seed, so
        # its prompts are its own: runs 74-77 gave both Poisson levels seed 0, and the second level's prompts were
        # the first's, so 112 of each prompt's 128 tokens were prefix-cache hits there. The result records the seed,
        # and sim-validate draws the same arrival gaps from it (sim.traffic.load_trace).
        levels = [(f"c{c}", max(args.min_requests, args.waves * c) if c < 256 else 2 * c, c, float("inf"), c)
                  for c in args.concurrency]
        levels += [(f"r{r:g}", args.rate_requests, None, r, 1000 + i) for i, r in enumerate(args.request_rates)]
        for name, n, c, rate, seed in levels:
            cfg = ServeBenchConfig(base_url=s.base_url, num_prompts=n, input_len=args.input_len, output_len=args.output_len,
                                   max_concurrency=c, request_rate=rate, ignore_eos=True, seed=seed, disable_tqdm=True,
                                   num_warmups=min(2, c or 2), prompt_format="tokens").validate()
            r = run_serve_bench(cfg, log=lambda *_: None)
            p = out / f"bench_{run}_{name}.json"
            p.write_text(json.dumps(r))
            paths.append(str(p))
            print(f"[{run}] {name:>5}: {r['output_throughput']:9.1f} tok/s  TTFT p50 {r['median_ttft_ms']:.0f} ms  "
                  f"TPOT p50 {r['median_tpot_ms']:.2f} ms  ({r['completed']}/{n})", flush=True)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--model-kind", default="llama3")
    p.add_argument("--model-size", default="llama3-8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--serve-flags", default="", help="extra serve flags for both runs")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 16, 64, 256])
    p.add_argument("--waves", type=int, default=4)
    p.add_argument("--min-requests", type=int, default=32,
                   help="requests per level at least (run 37 sent 8 at C=1: its TTFT p50 moved 34%% between runs A and B)")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--out", required=True)
    p.add_argument("--request-rates", type=float, nargs="*", default=[],
                   help="open-loop levels too: Poisson arrivals at these rates (requests/s), --rate-requests each")
    p.add_argument("--rate-requests", type=int, default=200)
    p.add_argument("--runs", nargs="+", default=["a", "b"], choices=["a", "b", "c"],
                   help="which servings to run (one alone: a quick served figure, e.g. with other --serve-flags); "
                        "c: a third serving with --c-flags added, which the simulator calibrated on A predicts")
    p.add_argument("--c-flags", default="--no-graph-prefill-alone",
                   help="run c's extra serve flags (default: without lone graph prefill steps)")
    p.add_argument("--skip-analysis", action="store_true",
                   help="serve and bench only (the fits take minutes of CPU: run sim_offline_validate.py on the files later)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from sim_offline_validate import main as offline

    for run in args.runs:
        serve_and_bench(args, run, out)
    if args.skip_analysis or not {"a", "b"} <= set(args.runs):
        return 0
    summary = {}
    for cm in ("timeline", "linear"):  # fit on A -> predict B and back, next to the A-vs-B noise floor
        print(f"\n== cost model {cm}", flush=True)
        offline([str(out), "--cost-model", cm, "--json-output", str(out / f"offline_{cm}.json")])
        d = json.loads((out / f"offline_{cm}.json").read_text())
        summary[cm] = {k: {m: d[k][m] for m in ("mean_abs", "max_abs", "within_10pct")}
                       for k in ("noise_floor_a_vs_b", "a_to_b", "b_to_a")}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
