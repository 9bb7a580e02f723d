"""Simulation commands (thin: every command calls ``torchinferno.sim``): ``sim-calibrate``, ``sim-validate``,
``sim-smoke``, ``traffic-smoke``, ``sim-plan``. See docs/SIMULATION.md."""

from __future__ import annotations

import argparse
import json
import math

from torchinferno.cli.sim_kv_args import add_kv_spec_args, kv_from_args
from torchinferno.errors import ConfigError


def _model_args(p: argparse.ArgumentParser) -> None:
    from torchinferno.cli.common import DEFAULT_MODEL

    p.add_argument("model", nargs="?", default=None, help=f"registry name, HF dir, .gguf or hub id (default: {DEFAULT_MODEL})")
    p.add_argument("--model-kind", default=None, help="family of a tiny random model instead of a checkpoint (llama3, ...)")
    p.add_argument("--size", default="debug", help="named size of --model-kind (default: debug)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                   help="time real steps by wall clock, or by this process's CPU time (a 1-thread engine on a shared "
                        "host: time spent descheduled by other jobs does not count)")
    _engine_args(p)


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-num-seqs", type=int, default=None, help="default: the device's (CPU 64, CUDA 256)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: the device's (CPU 512, CUDA 8192)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--kv-cache-dtype", default="auto", help="auto, bfloat16, float16, float32, fp8, fp8_e5m2")
    p.add_argument("--kv-cache-memory", default=None,
                   help="KV pool bytes per replica, e.g. 20GiB (default: sim commands --num-blocks blocks; a model: "
                        "the engine's default sizing)")


def _engine_config(a):
    from torchinferno.engine.config import EngineConfig

    return EngineConfig(max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens,
                        block_size=a.block_size, max_model_len=a.max_model_len,
                        kv_cache_dtype=None if a.kv_cache_dtype == "auto" else a.kv_cache_dtype,
                        kv_cache_memory=a.kv_cache_memory)


def _load_model(a):
    import torch

    from torchinferno.cli.common import DEFAULT_MODEL
    from torchinferno.engine.assembly import ModelSpec, build_model
    from torchinferno.errors import ConfigError

    if a.threads is not None:
        if a.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {a.threads}")
        torch.set_num_threads(a.threads)
    if a.model_kind and a.model:
        raise ConfigError("give either MODEL or --model-kind, not both")
    kw = {"dtype": a.dtype, "device": a.device, "cache_dir": a.cache_dir}
    spec = ModelSpec(model_kind=a.model_kind, size=a.size, **kw) if a.model_kind else ModelSpec(model=a.model or DEFAULT_MODEL, **kw)
    model = build_model(spec)
    model.name_or_path = spec.name if not a.model_kind else f"tiny-{a.model_kind}-{a.size}"
    return model


def _ints(text: str, flag: str = "list") -> tuple[int, ...]:
    from torchinferno.errors import ConfigError

    try:
        vals = tuple(int(x) for x in text.replace(",", " ").split())
    except ValueError:
        raise ConfigError(f"{flag} must be integers separated by spaces or commas, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise ConfigError(f"{flag} must be integers >= 1, got {text!r}")
    return vals


def _cmd_calibrate(a) -> int:
    from torchinferno.sim.calibrate import (
        ProbeGrid,
        calibrate_model,
        fit_rows,
        read_steps,
        rows_from_bench_generate,
        write_steps,
    )
    from torchinferno.sim.calibration import Calibration

    if a.from_step_log:
        from torchinferno.sim.step_log_fit import calibration_from_step_logs

        if a.from_steps or a.from_bench_generate:
            raise ConfigError("--from-step-log fits a served engine alone: leave out --from-steps / --from-bench-generate")
        tf = {"anchor": True, "device_bound_graphs": True} if a.timeline_fit == "device-bound" else None
        cal = calibration_from_step_logs(a.from_step_log, weights=a.fit_weights or "sqrt", cost_model=a.cost_model,
                                         timeline_fit=tf)
        if a.fit_admission_to and a.api_model == "gaps":
            from torchinferno.sim.fit_api_gaps import fit_api_from_arrivals

            if len(a.from_step_log) != 1:
                raise ConfigError("--api-model gaps needs exactly one --from-step-log (the run the results came from)")
            adm, stream, lat, err = fit_api_from_arrivals(cal, a.fit_admission_to, a.from_step_log[0], a.seed,
                                                          a.cost_model)
            cal.extra.update(admission_s=adm, stream_s=stream, latency_s=lat)
            cal.extra["admission_fit"] = {"results": list(a.fit_admission_to), "arrival_delay_error": err}
            print(f"sim-calibrate: API server {adm * 1e3:.2f} ms per request + {stream * 1e6:.0f} us per streamed token "
                  f"after {lat * 1e3:.1f} ms latency (recorded arrival delays at the core within {err * 100:.1f}% "
                  "on average)")
        elif a.fit_admission_to and a.api_model == "fifo":
            from torchinferno.sim.validate import fit_api_server

            adm, stream, err = fit_api_server(cal, a.fit_admission_to, a.seed, a.cost_model)
            cal.extra.update(admission_s=adm, stream_s=stream)
            cal.extra["admission_fit"] = {"results": list(a.fit_admission_to), "p50_ttft_tpot_error": err}
            print(f"sim-calibrate: API server {adm * 1e3:.2f} ms per request + {stream * 1e6:.0f} us per streamed token "
                  f"(p50 TTFT and TPOT of {len(a.fit_admission_to)} bench results within {err * 100:.1f}% on average)")
        elif a.fit_admission_to:
            from torchinferno.sim.validate import fit_admission

            adm, err = fit_admission(cal, a.fit_admission_to, a.seed, a.cost_model)
            cal.extra["admission_s"] = adm
            cal.extra["admission_fit"] = {"results": list(a.fit_admission_to), "p50_ttft_error": err}
            print(f"sim-calibrate: API admission {adm * 1e3:.2f} ms per request (p50 TTFT of "
                  f"{len(a.fit_admission_to)} bench results within {err * 100:.1f}% on average)")
    elif a.fit_admission_to:
        raise ConfigError("--fit-admission-to needs --from-step-log (the served engine the results measured)")
    elif a.from_steps or a.from_bench_generate:
        rows, src = [], []
        for path in a.from_steps or []:
            rows += read_steps(path)
            src.append(f"steps:{path}")
        for path in a.from_bench_generate or []:
            rows += rows_from_bench_generate(path, a.bench_prompt_tokens, a.bench_new_tokens)
            src.append(f"bench-generate:{path}")
        cost, err = fit_rows(rows, async_steps=a.async_steps, weights=a.fit_weights or "relative")
        cal = Calibration(cost=cost, num_samples=len(rows), fit_error=err, source=",".join(src),
                          model=a.model or "unknown", device=a.device, threads=a.threads or 0,
                          extra={"async_scheduling": a.async_steps})
        _add_probe_timeline(cal, rows, a.cost_model, a.async_steps)
    else:
        import torch

        model = _load_model(a)
        grid = ProbeGrid(_ints(a.batch_sizes, "--batch-sizes"), _ints(a.context_lens, "--context-lens"),
                         a.decode_steps, seed=a.seed, clock=a.clock)
        cal, rows = calibrate_model(model, _engine_config(a), grid, weights=a.fit_weights or "relative")
        cal.threads = torch.get_num_threads() if a.device == "cpu" else 0
        _add_probe_timeline(cal, rows, a.cost_model, bool(cal.extra.get("async_scheduling")))
        if a.steps_out:
            write_steps(rows, a.steps_out)
    cal.save(a.out)
    c = cal.cost
    terms = ", ".join(f"{k} {v:.3g}" for k, v in c.coef.items() if v)
    print(f"sim-calibrate: {cal.num_samples} steps fitted (mean |error| {cal.fit_error * 100:.1f}%): "
          f"step = {c.c0 * 1e3:.3f} ms + [{terms}] s; knee {c.knee:g} tokens -> {a.out}")
    if cal.timeline:
        tl = ", ".join(f"{k} {v * 1e3:.4g} ms" for k, v in cal.timeline["params"].items() if v)
        print(f"sim-calibrate: timeline (mean |error| {cal.timeline['fit_error'] * 100:.1f}%): {tl}")
    return 0


def _add_probe_timeline(cal, rows, choice: str, async_steps: bool) -> None:
    """Fit the timeline model from synchronous probe rows into ``cal`` (``--cost-model auto|timeline``)."""
    if choice == "linear":
        return
    if async_steps:  # probe rows of an async engine mix two steps per row: only a step log separates them
        if choice == "timeline":
            raise ConfigError("--cost-model timeline under async scheduling needs a served step log "
                              "(serve --step-log, then sim-calibrate --from-step-log)")
        return
    from torchinferno.sim.timeline_fit import fit_timeline, iterations_from_probe_rows

    its = iterations_from_probe_rows(rows)
    tl, err = fit_timeline(its, graphs=False, overlap=False, weights="relative")
    cal.timeline = {**tl.as_dict(), "fit_error": err, "num_samples": len(its)}


def _cmd_validate(a) -> int:
    from torchinferno.sim.calibrate import ProbeGrid, calibrate_model
    from torchinferno.sim.calibration import Calibration
    from torchinferno.sim.validate import ValidateConfig, validate

    if a.bench_results:
        from torchinferno.sim.validate import validate_served

        if not a.calibration:
            raise ConfigError("--bench-results needs --calibration (sim-calibrate --from-step-log of the served run)")
        return _report_validation(a, validate_served(Calibration.load(a.calibration), a.bench_results, a.seed,
                                                     cost_model=a.cost_model, replay_arrivals=a.replay_arrivals,
                                                     warmups=a.replay_warmups))
    if a.replay_arrivals:
        raise ConfigError("--replay-arrivals needs --bench-results (the served run whose step log it is)")
    model = _load_model(a)
    cfg = _engine_config(a)
    if a.calibration:
        cal = Calibration.load(a.calibration)
    else:
        print("sim-validate: no --calibration: probing the model first")
        cal, rows = calibrate_model(model, cfg, ProbeGrid(clock=a.clock))
        _add_probe_timeline(cal, rows, a.cost_model, bool(cal.extra.get("async_scheduling")))
    vc = ValidateConfig(tuple(a.concurrency), a.requests, a.input_len, a.output_len, a.seed, a.clock,
                        cost_model=a.cost_model)
    return _report_validation(a, validate(model, cal, cfg, vc))


def _report_validation(a, res: dict) -> int:
    print(f"sim-validate: max |relative error| {res['max_abs_relative_error'] * 100:.1f}%, "
          f"mean {res['mean_abs_relative_error'] * 100:.1f}%")
    if a.json_output:
        with open(a.json_output, "w") as f:
            json.dump(res, f, indent=2)
    return 0


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
    _cost_model_arg(p)
    _engine_args(p)
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
    if a.kv_bytes_per_token is not None:
        cal.kv_bytes_per_token = a.kv_bytes_per_token
    cal.kv_bytes_per_token = cal.kv_bytes_per_token or 131072
    return cal


def _base_spec(a, cal, **kw):
    """The cluster of the flags; step limits the flags leave unset take the calibration device's defaults."""
    from torchinferno.sim.cluster import ClusterSpec
    from torchinferno.sim.cost_model import LinkModel

    return ClusterSpec(router=a.router, device=cal.device, num_blocks=a.num_blocks, max_model_len=a.max_model_len or 8192,
                       engine=_engine_config(a), tp_link=LinkModel(a.tp_latency_us * 1e-6, a.tp_gbps * 1e9 / 8),
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
               _ints(a.tp_sizes, "--tp-sizes"), not a.no_disagg)
    best = res["best"]
    print(f"sim-plan: {best['plan'] if best else 'no plan meets the SLO within --max-gpus'}")
    if best and _kv_line(best):
        print(_kv_line(best))
    if a.json_output:
        with open(a.json_output, "w") as f:
            json.dump(res, f, indent=2)
    return 0 if best else 1


def _cost_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cost-model", default="auto", choices=["auto", "timeline", "linear"],
                   help="auto: the timeline model (host launch overlapped with device time, sim.timeline) when the "
                        "calibration has one, else the linear per-step model")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim-calibrate", help="time real engine steps at a grid of shapes; fit the simulator's cost model")
    _model_args(p)
    p.add_argument("--out", default="calibration.json")
    p.add_argument("--batch-sizes", default="1 2 4 8 16")
    p.add_argument("--context-lens", default="32 256 512")
    p.add_argument("--decode-steps", type=int, default=16)
    p.add_argument("--steps-out", default=None, help="also write the measured steps (JSONL)")
    p.add_argument("--from-steps", action="append", default=None,
                   help="fit from a steps JSONL (--steps-out) instead of probing a model (repeatable)")
    p.add_argument("--from-bench-generate", action="append", default=None,
                   help="add decode rows from a bench-generate --json-output report (repeatable; no prefill information)")
    p.add_argument("--from-step-log", action="append", default=None,
                   help="fit from a served run's step log (serve --step-log FILE; .gz too; repeatable): the served "
                        "engine's steps and limits, no model needed")
    p.add_argument("--fit-admission-to", nargs="+", default=None, metavar="JSON",
                   help="with --from-step-log: bench-serve results of the same served run; fit the API server's "
                        "per-request admission time (HTTP, tokenization, the hop to the core) to their p50 TTFT")
    p.add_argument("--timeline-fit", default="default", choices=["default", "device-bound"],
                   help="with --from-step-log: the timeline fit as before, or with the device clock anchored to the "
                        "measured waits and a decode graph's host side read off the steps right after small prefills "
                        "(issue 21: C 1 TTFT; docs/SIMULATION.md)")
    p.add_argument("--api-model", default="admission", choices=["admission", "fifo", "gaps"],
                   help="with --fit-admission-to: admission time only, or one FIFO API stage of admissions and "
                        "streamed tokens fitted to p50 TTFT and TPOT (fifo) or to when the step log says the results' "
                        "requests reached the core (gaps; results in run order)")
    p.add_argument("--fit-weights", default=None, choices=["relative", "sqrt", "time"],
                   help="how steps count in the fit: relative (each alike; default for probes), sqrt (default for "
                        "--from-step-log), time (long steps count most)")
    p.add_argument("--async-steps", action="store_true",
                   help="the --from-steps rows were timed under async scheduling (CUDA default; see cost_model.fit)")
    p.add_argument("--bench-prompt-tokens", type=int, default=32, help="the bench-generate run's --prompt-tokens")
    p.add_argument("--bench-new-tokens", type=int, default=64, help="the bench-generate run's --new-tokens")
    p.add_argument("--seed", type=int, default=0)
    _cost_model_arg(p)
    p.set_defaults(func=_cmd_calibrate)

    p = sub.add_parser("sim-validate", help="real engine vs simulator on the same workload: predicted vs measured")
    _model_args(p)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--calibration", default=None, help="calibration file (default: probe the model first)")
    p.add_argument("--requests", type=int, default=0, help="requests per concurrency level (default max(8, 2 x level))")
    p.add_argument("--input-len", default="uniform:32:256")
    p.add_argument("--output-len", default="uniform:16:64")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bench-results", nargs="+", default=None, metavar="JSON",
                   help="validate against served runs instead: bench-serve result files (their lengths, rate and "
                        "concurrency are replayed; --calibration from the server's step log); no model is loaded")
    p.add_argument("--replay-arrivals", default=None, metavar="STEP_LOG",
                   help="with --bench-results (in run order): replay when each request reached the engine core, from "
                        "the step log of the server that produced the results, instead of the calibration's admission "
                        "time (docs/SIMULATION.md)")
    p.add_argument("--replay-warmups", type=int, default=None, metavar="N",
                   help="bench-serve warm-ups before each result, for results that do not record num_warmups "
                        "(default min(2, concurrency): benchmarks/served_sim_validate.py)")
    p.add_argument("--json-output", default=None)
    _cost_model_arg(p)
    p.set_defaults(func=_cmd_validate)

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
