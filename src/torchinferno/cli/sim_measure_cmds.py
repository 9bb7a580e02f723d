"""``sim-calibrate`` (time real engine steps or read a served run's step log; fit the simulator's cost model) and
``sim-validate`` (the real engine or served results vs the simulator on the same workload). Thin: every command
calls ``torchinferno.sim``. See docs/SIMULATION.md."""

from __future__ import annotations

import argparse
import json

from torchinferno.cli.sim_cmds import cost_model_arg, engine_args, engine_config, ints
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
    engine_args(p)


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
        tf = {"device-bound": {"anchor": True, "device_bound_graphs": True}, "split": {"split": True}}.get(a.timeline_fit)
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
        elif a.fit_admission_to and a.api_model in ("fifo", "events"):
            from torchinferno.sim.validate import fit_api_server

            cal.extra["stream_coalesce"] = a.api_model == "events"  # fit_api_server also fits stream_token_s then
            adm, stream, err = fit_api_server(cal, a.fit_admission_to, a.seed, a.cost_model)
            cal.extra.update(admission_s=adm, stream_s=stream)
            cal.extra["admission_fit"] = {"results": list(a.fit_admission_to), "p50_ttft_tpot_error": err}
            per = (f"{stream * 1e6:.0f} us per streamed event + {cal.extra['stream_token_s'] * 1e6:.0f} us per token"
                   if a.api_model == "events" else f"{stream * 1e6:.0f} us per streamed token")
            print(f"sim-calibrate: API server {adm * 1e3:.2f} ms per request + {per} "
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
        grid = ProbeGrid(ints(a.batch_sizes, "--batch-sizes"), ints(a.context_lens, "--context-lens"),
                         a.decode_steps, seed=a.seed, clock=a.clock)
        cal, rows = calibrate_model(model, engine_config(a), grid, weights=a.fit_weights or "relative")
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
    cfg = engine_config(a)
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
    p.add_argument("--timeline-fit", default="default", choices=["default", "device-bound", "split"],
                   help="with --from-step-log: the timeline fit as before, or with the device clock anchored to the "
                        "measured waits and a decode graph's host side read off the steps right after small prefills "
                        "(issue 21: C 1 TTFT), or split: host terms regressed on the logged launch/wait times of a "
                        "step_log_version 3 log, device terms fitted behind them (docs/SIMULATION.md)")
    p.add_argument("--api-model", default="admission", choices=["admission", "fifo", "events", "gaps"],
                   help="with --fit-admission-to: admission time only, or one FIFO API stage of admissions and "
                        "streamed tokens fitted to p50 TTFT and TPOT (fifo), the same with a cost per streamed event "
                        "plus one per token, a request's tokens joining its queued event (events; docs/SIMULATION.md "
                        "'Session 21'), or fitted to when the step log says the results' requests reached the core "
                        "(gaps; results in run order)")
    p.add_argument("--fit-weights", default=None, choices=["relative", "sqrt", "time"],
                   help="how steps count in the fit: relative (each alike; default for probes), sqrt (default for "
                        "--from-step-log), time (long steps count most)")
    p.add_argument("--async-steps", action="store_true",
                   help="the --from-steps rows were timed under async scheduling (CUDA default; see cost_model.fit)")
    p.add_argument("--bench-prompt-tokens", type=int, default=32, help="the bench-generate run's --prompt-tokens")
    p.add_argument("--bench-new-tokens", type=int, default=64, help="the bench-generate run's --new-tokens")
    p.add_argument("--seed", type=int, default=0)
    cost_model_arg(p)
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
    cost_model_arg(p)
    p.set_defaults(func=_cmd_validate)
