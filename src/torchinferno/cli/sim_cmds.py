"""Simulation commands (thin: every command calls ``torchinferno.sim``): ``sim-smoke``, ``traffic-smoke``,
``sim-plan`` (``sim-calibrate`` / ``sim-validate``, which measure a real engine, are in ``cli.sim_measure_cmds``).
See docs/SIMULATION.md."""

from __future__ import annotations

import argparse
import json
import math

from torchinferno.cli.sim_kv_args import add_kv_spec_args, kv_from_args


def engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-num-seqs", type=int, default=None, help="default: the device's (CPU 64, CUDA 256)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: the device's (CPU 512, CUDA 8192)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--kv-cache-dtype", default="auto", help="auto, bfloat16, float16, float32, fp8, fp8_e5m2")
    p.add_argument("--kv-cache-memory", default=None,
                   help="KV pool bytes per replica, e.g. 20GiB (default: sim commands --num-blocks blocks; a model: "
                        "the engine's default sizing)")
    p.add_argument("--graph-prefill-alone", action=argparse.BooleanOptionalAction, default=True,
                   help="a lone waiting prompt that the calibration's prefill graphs replay runs in a step of its own "
                        "(serve's flag; needs a timeline calibration with graphs)")


def engine_config(a):
    from torchinferno.engine.config import EngineConfig

    return EngineConfig(max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens,
                        block_size=a.block_size, max_model_len=a.max_model_len,
                        kv_cache_dtype=None if a.kv_cache_dtype == "auto" else a.kv_cache_dtype,
                        kv_cache_memory=a.kv_cache_memory, graph_prefill_alone=a.graph_prefill_alone)


def ints(text: str, flag: str = "list") -> tuple[int, ...]:
    from torchinferno.errors import ConfigError

    try:
        vals = tuple(int(x) for x in text.replace(",", " ").split())
    except ValueError:
        raise ConfigError(f"{flag} must be integers separated by spaces or commas, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise ConfigError(f"{flag} must be integers >= 1, got {text!r}")
    return vals


def _workload_args(p: argparse.ArgumentParser, requests: int, rate: float) -> None:
    p.add_argument("--requests", "--num-prompts", dest="requests", type=int, default=requests)
    p.add_argument("--request-rate", "--rate", dest="rate", type=float, default=rate, help="requests/s (inf: all at t=0)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps (1 = Poisson)")
    p.add_argument("--burst-size", type=int, default=1, help="on/off bursts of this many back-to-back requests")
    p.add_argument("--input-len", default="uniform:64:512", help="prompt length: N, uniform:LO:HI, lognormal:MEAN:SIGMA")
    p.add_argument("--output-len", default="uniform:32:256", help="output length (same forms)")
    p.add_argument("--prefix-groups", type=int, default=0, help="shared prompt prefixes (0: none)")
    p.add_argument("--prefix-len", type=int, default=0)
    p.add_argument("--trace", default=None, help="replay a JSONL trace or a bench-serve result JSON instead")
    p.add_argument("--seed", type=int, default=0)


def _workload(a):
    from torchinferno.sim.traffic import TrafficSpec, generate, load_trace

    if a.trace:
        return load_trace(a.trace, seed=a.seed, rate=None if math.isinf(a.rate) else a.rate)
    return generate(TrafficSpec(num_requests=a.requests, rate=a.rate, burstiness=a.burstiness, burst_size=a.burst_size,
                                prompt_len=a.input_len, output_len=a.output_len, prefix_groups=a.prefix_groups,
                                prefix_len=a.prefix_len, seed=a.seed))


def _cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calibration", default=None, help="calibration file (sim-calibrate); explicit costs override it")
    p.add_argument("--prefill-us-per-token", type=float, default=None)
    p.add_argument("--decode-us-per-token", type=float, default=None)
    p.add_argument("--step-us", type=float, default=None, help="fixed cost per step (explicit costs; default 0)")
    p.add_argument("--network-latency-us", type=float, default=10.0, help="P/D link latency")
    p.add_argument("--network-gbps", type=float, default=400.0, help="P/D link bandwidth in Gbit/s")
    p.add_argument("--tp-latency-us", type=float, default=5.0)
    p.add_argument("--tp-gbps", type=float, default=3200.0, help="TP link bandwidth in Gbit/s (NVLink-class)")
    p.add_argument("--kv-bytes-per-token", type=int, default=None, help="default: the calibration's, else 131072 (8B-class)")
    p.add_argument("--router", default="least_loaded", choices=["round_robin", "least_loaded", "prefix_aware", "cache_aware"])
    p.add_argument("--num-blocks", type=int, default=4096, help="KV blocks per replica")
    p.add_argument("--max-concurrency", type=int, default=None)
    # a what-if on the calibration (sim-validate / sim-calibrate run the real engine, whose mode the calibration has)
    p.add_argument("--cuda-graph-mixed-mode", choices=("piecewise", "full"), default=None,
                   help="what-if on a timeline calibration with graphs: full prices the steps the calibrated engine "
                        "ran from piecewise graphs as whole-step graph replays (serve's flag). Default: as calibrated")
    cost_model_arg(p)
    engine_args(p)
    add_kv_spec_args(p)


def _calibration(a):
    from torchinferno.sim.calibration import Calibration
    from torchinferno.sim.cost_model import CostModel

    cal = Calibration.load(a.calibration) if a.calibration else Calibration(
        cost=CostModel.per_token(2e-6, 4e-6), device="cuda", hidden_size=4096, num_layers=32, kv_bytes_per_token=131072)
    if a.prefill_us_per_token is not None or a.decode_us_per_token is not None or a.step_us is not None:
        c = cal.cost
        cal.cost = CostModel.per_token(
            a.prefill_us_per_token * 1e-6 if a.prefill_us_per_token is not None else c.coef["prefill_tokens"],
            a.decode_us_per_token * 1e-6 if a.decode_us_per_token is not None else c.coef["decode_tokens"],
            a.step_us * 1e-6 if a.step_us is not None else 0.0)
        cal.source = "explicit"
        cal.timeline = None  # explicit per-token costs are a linear model
    _mixed_graph_what_if(cal, a.cuda_graph_mixed_mode)
    if a.kv_bytes_per_token is not None:
        cal.kv_bytes_per_token = a.kv_bytes_per_token
    cal.kv_bytes_per_token = cal.kv_bytes_per_token or 131072
    return cal


def _mixed_graph_what_if(cal, mode: str | None) -> None:
    """``--cuda-graph-mixed-mode``: None / as calibrated leaves the calibration; ``full`` turns its piecewise steps into
    whole-step graph replays (``TimelineModel.with_mixed_graphs``); asking for piecewise from a whole-step calibration
    is an error (it never measured a piecewise launch)."""
    from torchinferno.errors import ConfigError
    from torchinferno.sim.timeline import TimelineModel

    if mode is None:
        return
    tl = TimelineModel.from_dict(cal.timeline) if cal.timeline else None
    if tl is None or not tl.graphs:
        raise ConfigError("--cuda-graph-mixed-mode needs a timeline calibration of an engine with CUDA graphs "
                          "(sim-calibrate from a CUDA step log)")
    if mode == "full":
        cal.timeline = tl.with_mixed_graphs().as_dict()
    elif tl.mixed_graph_tokens:
        raise ConfigError("--cuda-graph-mixed-mode piecewise: this calibration ran its mixed steps as whole-step graphs "
                          "and has no piecewise launch cost; calibrate on a piecewise run")


def _base_spec(a, cal, **kw):
    """The cluster of the flags; step limits the flags leave unset take the calibration device's defaults."""
    from torchinferno.sim.cluster import ClusterSpec
    from torchinferno.sim.cost_model import LinkModel

    return ClusterSpec(router=a.router, device=cal.device, num_blocks=a.num_blocks, max_model_len=a.max_model_len or 8192,
                       engine=engine_config(a), tp_link=LinkModel(a.tp_latency_us * 1e-6, a.tp_gbps * 1e9 / 8),
                       pd_link=LinkModel(a.network_latency_us * 1e-6, a.network_gbps * 1e9 / 8),
                       cost_model=a.cost_model, kv=kv_from_args(a), **kw)


def _row(name: str, s: dict) -> str:
    return (f"  {name:<34} makespan {s['duration_s']:8.3f} s  {s['output_throughput']:9.0f} tok/s  "
            f"TTFT p50/p99 {s['p50_ttft_s'] * 1e3:8.2f}/{s['p99_ttft_s'] * 1e3:8.2f} ms  "
            f"TPOT p50/p99 {s['p50_tpot_s'] * 1e3:6.3f}/{s['p99_tpot_s'] * 1e3:6.3f} ms")


def _kv_line(s: dict) -> str | None:
    """The replicas' KV pools (summaries of runs given a KV spec or --kv-cache-memory only)."""
    kv = s.get("kv")
    if kv is None:
        return None
    sliding = (f" + {kv['num_sliding_blocks']} sliding blocks (window {kv['sliding_window']})"
               if kv["num_sliding_blocks"] is not None else "")
    return (f"    KV per replica: {kv['num_blocks']} blocks x {kv['block_size']}{sliding}"
            f"{' of ' + kv['model'] if kv['model'] else ''}; largest batch {kv['max_batch_seqs']} sequences")


def _cmd_sim_smoke(a) -> int:
    from torchinferno.sim.cluster import simulate_cluster

    cal, reqs = _calibration(a), _workload(a)
    n = a.gpus
    plans = [("colocated", _base_spec(a, cal, replicas=n))]
    if n >= 2:
        p = max(1, n // 2)
        plans.append(("disaggregated", _base_spec(a, cal, replicas=n - p, prefill_replicas=p)))
    print(f"sim-smoke: {len(reqs)} requests, {n} GPUs, costs from {cal.source}")
    out = {}
    for name, spec in plans:
        _, s = simulate_cluster(spec, cal, reqs, a.max_concurrency)
        out[name] = s
        print(_row(f"{name} ({spec.describe()})", s))
        if _kv_line(s):
            print(_kv_line(s))
    if a.json_output:
        with open(a.json_output, "w") as f:
            json.dump(out, f, indent=2)
    return 0


def _cmd_traffic_smoke(a) -> int:
    from torchinferno.sim.cluster import simulate_cluster
    from torchinferno.sim.traffic import summarize_arrivals

    cal, reqs = _calibration(a), _workload(a)
    arr = summarize_arrivals(reqs)
    print(f"traffic-smoke: {arr['requests']} requests over {arr['span_s']:.3f} s (offered {arr['offered_rate']:.1f} req/s, "
          f"gap CV {arr['gap_cv']:.2f}, burst size {a.burst_size}); mean prompt {arr['mean_prompt_len']:.0f}, "
          f"mean output {arr['mean_output_len']:.0f} tokens")
    _, s = simulate_cluster(_base_spec(a, cal, replicas=a.gpus), cal, reqs, a.max_concurrency)
    print(_row(f"{a.gpus} replica(s), costs from {cal.source}", s))
    if _kv_line(s):
        print(_kv_line(s))
    print(f"  achieved {s['request_throughput']:.1f} req/s; TTFT p90 {s['p90_ttft_s'] * 1e3:.2f} ms; "
          f"TPOT p90 {s['p90_tpot_s'] * 1e3:.3f} ms; preemptions {s['preemptions']}")
    if a.json_output:
        with open(a.json_output, "w") as f:
            json.dump({"arrivals": arr, "summary": s}, f, indent=2)
    return 0


def _cmd_plan(a) -> int:
    from torchinferno.sim.plan import SLO, plan

    cal, reqs = _calibration(a), _workload(a)
    print(f"sim-plan: {len(reqs)} requests at {a.rate:g} req/s; SLO p99 TTFT {a.slo_ttft_ms:g} ms, "
          f"p99 TPOT {a.slo_tpot_ms:g} ms; at most {a.max_gpus} GPUs")
    res = plan(_base_spec(a, cal), cal, reqs, SLO(a.slo_ttft_ms * 1e-3, a.slo_tpot_ms * 1e-3), a.max_gpus,
               ints(a.tp_sizes, "--tp-sizes"), not a.no_disagg)
    best = res["best"]
    print(f"sim-plan: {best['plan'] if best else 'no plan meets the SLO within --max-gpus'}")
    if best and _kv_line(best):
        print(_kv_line(best))
    if a.json_output:
        with open(a.json_output, "w") as f:
            json.dump(res, f, indent=2)
    return 0 if best else 1


def cost_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cost-model", default="auto", choices=["auto", "timeline", "linear"],
                   help="auto: the timeline model (host launch overlapped with device time, sim.timeline) when the "
                        "calibration has one, else the linear per-step model")


def register(sub: argparse._SubParsersAction) -> None:
    for name, hlp, fn, reqs, rate in (
        ("sim-smoke", "simulate colocated vs disaggregated prefill/decode on the real scheduler", _cmd_sim_smoke, 64, 20.0),
        ("traffic-smoke", "seeded bursty traffic through the simulator: rates, makespan, TTFT/TPOT", _cmd_traffic_smoke, 32, 20.0),
        ("sim-plan", "fewest GPUs (TP x replicas x P:D) that meet a latency SLO at a request rate", _cmd_plan, 200, 20.0),
    ):
        p = sub.add_parser(name, help=hlp)
        _workload_args(p, reqs, rate)
        _cluster_args(p)
        if name != "sim-plan":
            p.add_argument("--gpus", type=int, default=2, help="replicas (sim-smoke splits them P:D for the comparison)")
        else:
            p.add_argument("--slo-ttft-ms", type=float, default=500.0)
            p.add_argument("--slo-tpot-ms", type=float, default=50.0)
            p.add_argument("--max-gpus", type=int, default=8)
            p.add_argument("--tp-sizes", default="1 2 4 8")
            p.add_argument("--no-disagg", action="store_true", help="colocated plans only")
        p.add_argument("--json-output", default=None)
        p.set_defaults(func=fn)
