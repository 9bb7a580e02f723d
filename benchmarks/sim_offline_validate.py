"""Offline check of the simulator on recorded served runs (issue 21): fit on run A's step log, predict run B's
bench-serve results (and B -> A), next to the noise floor (A's measured figures as a "prediction" of B's).
No GPU and no model: everything comes from the files of a run directory (``steps_{a,b}.jsonl[.gz]``,
``bench_{a,b}_c{C}.json``), e.g. ``benchmarks/results/run37``.

    PYTHONPATH=src python3 benchmarks/sim_offline_validate.py benchmarks/results/run37 --json-output out.json

``--anchor-device --device-bound-graphs``: the timeline fit option of issue 21 (sim.timeline_fit; ``--fix NAME=S,...``
holds parameters). ``--replay-arrivals``: each predicted run's arrivals at the engine core replayed from its own step log (a diagnosis;
docs/SIMULATION.md); ``--api gaps``: the API stage fitted to the calibration run's recorded arrival delays.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

FIGS = ("output_throughput", "p50_ttft_s", "p99_ttft_s", "p50_tpot_s", "p99_tpot_s")


def _level_key(path: str) -> tuple[int, float]:
    """Closed-loop levels (``_c{C}``) by concurrency, then Poisson levels (``_r{rate}``) by rate."""
    m = re.search(r"_([cr])([\d.]+)\.json$", path)
    return (0 if m.group(1) == "c" else 1, float(m.group(2)))


def _files(run: Path, name: str) -> tuple[Path, list[str]] | None:
    """Run ``name``'s step log and bench results, or None when the directory holds no such run."""
    steps = next((p for p in (run / f"steps_{name}.jsonl.gz", run / f"steps_{name}.jsonl") if p.exists()), None)
    if steps is None:
        return None
    bench = sorted((str(p) for p in (*run.glob(f"bench_{name}_c*.json"), *run.glob(f"bench_{name}_r*.json"))),
                   key=_level_key)
    return steps, bench


def _logged_meta(steps: Path) -> dict:
    """The meta line of a step log (its first line)."""
    import gzip

    with (gzip.open if steps.suffix == ".gz" else open)(steps, "rt") as f:
        return json.loads(f.readline())["meta"]


def _stats(errs: list[float]) -> dict:
    a = [abs(e) for e in errs]
    return {"mean_abs": sum(a) / len(a), "max_abs": max(a), "within_10pct": sum(x <= 0.10 for x in a), "figures": len(a)}


def noise_floor(bench_a: list[str], bench_b: list[str]) -> dict:
    from torchinferno.sim.validate import measured_from_bench

    errs, levels = [], {}
    for pa, pb in zip(bench_a, bench_b):
        ma, mb = (measured_from_bench(json.loads(Path(p).read_text())) for p in (pa, pb))
        e = {k: (ma[k] - mb[k]) / mb[k] for k in FIGS}
        levels[Path(pb).stem] = e
        errs += e.values()
    return {"levels": levels, **_stats(errs)}


def one_way(steps: Path, fit_bench: list[str], pred_bench: list[str], cost_model: str, weights: str,
            api: str = "admission", pred_steps: Path | None = None, timeline_fit: dict | None = None,
            finish_latency: bool = False, stream_coalesce: bool = False, pred_config: Path | None = None,
            what_if_full: bool = False) -> dict:
    """Calibrate on ``steps`` + ``fit_bench``, predict ``pred_bench``. ``pred_steps``: replay the predicted run's
    arrivals at the core from its step log (``--replay-arrivals``); the API stage is then the streaming cost only,
    fitted with the calibration run's own arrivals replayed. ``pred_config``: the predicted run's step log, whose
    scheduling options (lone graph prefill) and piecewise / whole-step graph limits the simulated engine takes (a fit
    on piecewise steps predicting a ``--cuda-graph-mixed-mode full`` run prices its mixed steps as graph replays:
    ``TimelineModel.with_mixed_graphs``). ``what_if_full``: predict as if the predicted run's piecewise steps had
    replayed whole-step graphs (``--cuda-graph-mixed-mode full``): a prediction of a run not made yet."""
    from torchinferno.sim.step_log_fit import calibration_from_step_logs, timeline_flags
    from torchinferno.sim.validate import fit_admission, fit_api_server, fit_stream_replay, validate_served

    t0 = time.perf_counter()
    cal = calibration_from_step_logs([str(steps)], log=lambda *a: None, cost_model=cost_model,
                                     timeline_weights=weights, timeline_fit=timeline_fit)
    fit_s = time.perf_counter() - t0
    cal.extra["stream_coalesce"] = stream_coalesce  # the API stage's model, fitted and predicted with it
    if pred_config is not None:  # the predicted run's engine (run c: another lone-prefill or piecewise setting)
        meta = _logged_meta(pred_config)
        cal.extra["engine_limits"]["lone_prefill_tokens"] = int(meta.get("lone_prefill_tokens", 0))
        if cal.timeline and cal.timeline.get("graphs"):  # its steps up to this many tokens piecewise / whole (0: eager)
            flags = timeline_flags(meta)
            cal.timeline = {**cal.timeline, "piecewise_graph_tokens": flags["piecewise_graph_tokens"],
                            "mixed_graph_tokens": flags["mixed_graph_tokens"]}
    if pred_steps is not None:
        adm = 0.0
        if finish_latency:
            from torchinferno.sim.first_token import fit_finish_latency

            cal.extra["finish_latency_s"] = fit_finish_latency(str(steps), fit_bench)
        stream, _ = fit_stream_replay(cal, fit_bench, str(steps), cost_model=cost_model)
        cal.extra["stream_s"] = stream
    elif api == "gaps":
        from torchinferno.sim.fit_api_gaps import fit_api_from_arrivals

        adm, stream, lat, _ = fit_api_from_arrivals(cal, fit_bench, str(steps), cost_model=cost_model)
        cal.extra.update(stream_s=stream, latency_s=lat)
    elif api == "fifo":
        adm, stream, _ = fit_api_server(cal, fit_bench, cost_model=cost_model)
        cal.extra["stream_s"] = stream
    elif api == "fifo-c1":  # admission from the lowest level alone (TTFT = API + one step there), then streaming
        adm, _ = fit_admission(cal, fit_bench[:1], cost_model=cost_model)
        adm, stream, _ = fit_api_server(cal, fit_bench, cost_model=cost_model, admission_s=adm)
        cal.extra["stream_s"] = stream
    else:
        adm, _ = fit_admission(cal, fit_bench, cost_model=cost_model)
    cal.extra["admission_s"] = adm
    if what_if_full and cal.timeline and cal.timeline.get("graphs"):  # after the API fit, which saw the real engine
        from torchinferno.sim.timeline import TimelineModel

        cal.timeline = TimelineModel.from_dict(cal.timeline).with_mixed_graphs().as_dict()
    res = validate_served(cal, pred_bench, log=lambda *a: None, cost_model=cost_model,
                          replay_arrivals=str(pred_steps) if pred_steps is not None else None)
    errs = [v["relative_error"] for lv in res["levels"].values() for v in lv["figures"].values()]
    return {"calibrated_on": str(steps), "fit_seconds": fit_s, "admission_s": adm,
            "replayed_arrivals": str(pred_steps) if pred_steps is not None else None,
            "stream_s": cal.extra.get("stream_s", 0.0), "stream_token_s": cal.extra.get("stream_token_s", 0.0),
            "latency_s": cal.extra.get("latency_s", 0.0),
            "finish_latency_s": cal.extra.get("finish_latency_s"),
            "timeline": cal.timeline,
            "levels": {c: {k: v for k, v in lv.items() if k != "result"} for c, lv in res["levels"].items()},
            **_stats(errs)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="directory with steps_a/b and bench_a/b_c*.json")
    p.add_argument("--cost-model", default="timeline", choices=["timeline", "linear"])
    p.add_argument("--timeline-weights", default="time", choices=["time", "sqrt", "relative"])
    p.add_argument("--api", default="fifo", choices=["admission", "fifo", "fifo-c1", "gaps"],
                   help="API server model fitted on the calibration run's results: admission time per request "
                        "(fitted to p50 TTFT), one FIFO stage of admissions and streamed tokens (p50 TTFT + TPOT), "
                        "or that stage fitted to the calibration run's recorded arrivals at the core (gaps); fifo-c1: "
                        "the stage's admission fitted on the lowest level alone (C 1), its streaming on all")
    p.add_argument("--replay-arrivals", action="store_true",
                   help="replay each predicted run's request arrivals at the engine core from its own step log "
                        "(a diagnosis: what is left when the admission process is known); API stage: streaming only")
    p.add_argument("--anchor-device", action=argparse.BooleanOptionalAction, default=None,
                   help="timeline fit: re-anchor the replay's device clock to each measured result wait (fit_timeline's "
                        "anchor)")
    p.add_argument("--device-bound-graphs", action="store_true",
                   help="timeline fit: a decode graph's host side read off the iterations right after small prefills, "
                        "its device side fitted (fit_timeline's device_bound_graphs)")
    p.add_argument("--finish-latency", action="store_true",
                   help="with --replay-arrivals: the client's finish latency per level fitted on the calibration run "
                        "(sim.first_token.fit_finish_latency; needs per-request TTFTs in the results)")
    p.add_argument("--split", action="store_true",
                   help="timeline fit: host terms from the logged launch/wait times (step_log_version 3), device terms "
                        "fitted behind them (fit_timeline's split)")
    p.add_argument("--trim", type=float, default=None,
                   help="timeline fit: drop iterations measured more than this many times slower than predicted (3)")
    p.add_argument("--fix", default=None, metavar="NAME=SECONDS,...",
                   help="timeline fit: hold these parameters at these values (not fitted)")
    p.add_argument("--stream-coalesce", action=argparse.BooleanOptionalAction, default=True,
                   help="API stage: stream_s per streamed event, a request's tokens joining its still-queued event "
                        "(driver.run_workload's stream_coalesce), plus a fitted cost per token (stream_token_s); "
                        "--no-stream-coalesce: stream_s per token, one at a time (session 20's model)")
    p.add_argument("--what-if-mixed-full", action="store_true",
                   help="predict each run as if its piecewise steps had replayed whole-step graphs "
                        "(--cuda-graph-mixed-mode full; the API stage is fitted before the change): the 'errors' are "
                        "then the predicted change against the measured piecewise run")
    p.add_argument("--json-output", default=None)
    a = p.parse_args(argv)
    run = Path(a.run)
    tf = {"device_bound_graphs": a.device_bound_graphs}
    if a.anchor_device is not None:
        tf["anchor"] = a.anchor_device
    if a.split:
        tf["split"] = True
    if a.trim is not None:
        tf["trim"] = a.trim
    if a.fix:
        tf["fixed"] = {k: float(v) for k, v in (kv.split("=") for kv in a.fix.split(","))}
    (sa, ba), b_run, c_run = _files(run, "a"), _files(run, "b"), _files(run, "c")
    out = {"run": str(run), "cost_model": a.cost_model, "timeline_fit": tf,
           "api": "replay" if a.replay_arrivals else a.api, "stream_coalesce": a.stream_coalesce}
    names = []

    def way(steps, fit_bench, pred_bench, pred_steps):
        return one_way(steps, fit_bench, pred_bench, a.cost_model, a.timeline_weights, a.api,
                       pred_steps if a.replay_arrivals else None, tf, a.finish_latency, a.stream_coalesce,
                       pred_config=pred_steps, what_if_full=a.what_if_mixed_full)

    if b_run is not None:  # A and B served alike: the noise floor, and each one's fit predicting the other
        sb, bb = b_run
        out["noise_floor_a_vs_b"] = noise_floor(ba, bb)
        out["a_to_b"], out["b_to_a"] = way(sa, ba, bb, sb), way(sb, bb, ba, sa)
        names += ["noise_floor_a_vs_b", "a_to_b", "b_to_a"]
    if c_run is not None:  # run c changed a serve flag: what it did (A's figures against C's), each fit predicting the other
        sc, bc = c_run
        out["measured_a_vs_c"] = noise_floor(ba, bc)
        out["a_to_c"], out["c_to_a"] = way(sa, ba, bc, sc), way(sc, bc, ba, sa)
        names += ["measured_a_vs_c", "a_to_c", "c_to_a"]
    for name in names:
        r = out[name]
        print(f"{name:<20} mean |error| {r['mean_abs'] * 100:5.1f}%  max {r['max_abs'] * 100:5.1f}%  "
              f"within 10%: {r['within_10pct']}/{r['figures']}")
    for name in [n for n in names if "_to_" in n]:
        for c, lv in out[name]["levels"].items():
            print(f"  {name} C={c:>4}: " + "  ".join(f"{k} {v['relative_error'] * 100:+5.1f}%"
                                                    for k, v in lv["figures"].items()))
    if a.json_output:
        Path(a.json_output).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
