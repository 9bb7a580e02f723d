"""``sim-validate``: the real engine and the simulator on the same workload, figures side by side.

For each concurrency level the same seeded workload (``requests`` prompts of ``input_len`` tokens generating
``output_len`` tokens, all available at t=0, at most ``concurrency`` in flight: bench-serve's closed loop) is
served twice through ``driver.run_workload``: by the real ``EngineCore`` over a ``UniprocExecutor`` on a wall
clock, or on this process's CPU-time clock with ``clock="cpu"`` (in process: no HTTP), and by the same core
class over a ``SimulatedExecutor`` with the calibration's cost model and the real executor's KV pool size (both
pools for a hybrid spec: the sliding-window pool mirrored) and step limits. Figures: output throughput, TTFT p50/p99,
TPOT p50/p99; each as ``{"predicted", "measured", "relative_error"}`` (``(predicted - measured) / measured``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from torchinferno.engine.config import EngineConfig
from torchinferno.engine.core import EngineCore
from torchinferno.engine.executor import UniprocExecutor
from torchinferno.errors import ConfigError
from torchinferno.sim.calibration import Calibration
from torchinferno.sim.driver import Replica, run_workload
from torchinferno.sim.executor import SimulatedExecutor, make_clock
from torchinferno.sim.traffic import TrafficSpec, generate, load_trace

__all__ = ["FIGURES", "ValidateConfig", "compare", "measured_from_bench", "fit_admission", "fit_stream_replay",
           "replayed_delays", "served_run", "simulate_served", "validate", "validate_served"]

FIGURES = ("output_throughput", "p50_ttft_s", "p99_ttft_s", "p50_tpot_s", "p99_tpot_s")


@dataclass
class ValidateConfig:
    concurrency: tuple[int, ...] = (1, 4, 16)
    requests_per_level: int = 0  # 0: max(8, 2 * concurrency)
    input_len: str = "uniform:32:256"
    output_len: str = "uniform:16:64"
    seed: int = 0
    clock: str = "wall"  # how the real run is timed: "wall" or "cpu" (process CPU time; see executor.CpuClock)
    warmup_requests: int = 8  # untimed requests of the workload's shapes served first (0: none)
    cost_model: str = "auto"  # Calibration.model_for: auto (timeline when the calibration has one) | timeline | linear


def compare(predicted: dict, measured: dict) -> dict:
    out = {}
    for k in FIGURES:
        p, m = predicted[k], measured[k]
        out[k] = {"predicted": p, "measured": m, "relative_error": (p - m) / m if m else float("nan")}
    return out


def validate(model, calibration: Calibration, engine_config: EngineConfig, vc: ValidateConfig, log=print) -> dict:
    vocab = getattr(model.config, "vocab_size", 1000) or 1000
    real_ex = UniprocExecutor(model, engine_config)
    if vc.warmup_requests:  # first shapes pay compiles / GEMM heuristics / allocator growth: not timed
        warm = generate(TrafficSpec(num_requests=vc.warmup_requests, prompt_len=vc.input_len, output_len="fixed:4",
                                    vocab_size=vocab, seed=vc.seed + 10_007))
        core = EngineCore(real_ex, (), vocab)
        run_workload(warm, [Replica(core, make_clock(vc.clock), "warmup")], max_concurrency=max(vc.concurrency))
        core.reset_prefix_cache()
    levels = {}
    for c in vc.concurrency:
        n = vc.requests_per_level or max(8, 2 * c)
        reqs = generate(TrafficSpec(num_requests=n, prompt_len=vc.input_len, output_len=vc.output_len,
                                    vocab_size=vocab, seed=vc.seed + c))
        real = EngineCore(real_ex, (), vocab)
        real.reset_prefix_cache()
        t0 = time.perf_counter()
        measured = run_workload(reqs, [Replica(real, make_clock(vc.clock), "real")], max_concurrency=c).summary()
        wall_real = time.perf_counter() - t0
        sim_ex = SimulatedExecutor(calibration.model_for(vc.cost_model), real_ex.config, num_blocks=real_ex.num_blocks,
                                   max_model_len=real_ex.max_model_len, device=str(real_ex.device))
        if real_ex.num_sliding_blocks is not None:  # hybrid KV spec: the real engine's plan_kv_cache pools, mirrored
            sim_ex.num_sliding_blocks, sim_ex.sliding_window = real_ex.num_sliding_blocks, real_ex.sliding_window
        t0 = time.perf_counter()
        predicted = run_workload(reqs, [Replica(EngineCore(sim_ex), sim_ex.clock, "sim")], max_concurrency=c).summary()
        wall_sim = time.perf_counter() - t0
        figs = compare(predicted, measured)
        levels[str(c)] = {"requests": n, "figures": figs, "wall_s_real": wall_real, "wall_s_sim": wall_sim}
        log(f"concurrency {c:>3} ({n} requests; real {wall_real:.1f} s, simulated in {wall_sim * 1e3:.0f} ms)")
        for k, v in figs.items():
            log(f"  {k:<18} predicted {v['predicted']:>10.4f}  measured {v['measured']:>10.4f}  "
                f"error {v['relative_error'] * 100:+6.1f}%")
    errs = [abs(v["relative_error"]) for lv in levels.values() for v in lv["figures"].values()]
    return {"calibration": calibration.to_dict(), "engine": real_ex.describe(), "simulated_engine": sim_ex.describe(),
            "workload": {"input_len": vc.input_len, "output_len": vc.output_len, "seed": vc.seed}, "clock": vc.clock,
            "levels": levels, "max_abs_relative_error": max(errs), "mean_abs_relative_error": sum(errs) / len(errs)}


def measured_from_bench(doc: dict) -> dict:
    """The ``FIGURES`` of a bench-serve (or ``vllm bench serve``) result JSON, in seconds."""
    def ms(name: str, q: str) -> float:
        key = f"p{q}_{name}_ms" if f"p{q}_{name}_ms" in doc else ("median_" + name + "_ms" if q == "50" else None)
        if key is None or key not in doc:
            raise ConfigError(f"bench result has no {q}th percentile of {name} (run bench-serve with "
                              "--metric-percentiles 50,90,99)")
        return float(doc[key]) / 1e3

    return {"output_throughput": float(doc["output_throughput"]), "p50_ttft_s": ms("ttft", "50"),
            "p99_ttft_s": ms("ttft", "99"), "p50_tpot_s": ms("tpot", "50"), "p99_tpot_s": ms("tpot", "99")}


def _served_config(calibration: Calibration) -> tuple[EngineConfig, dict]:
    limits = calibration.extra.get("engine_limits")
    if not limits:
        raise ConfigError("the calibration records no engine limits (KV blocks, step budget): fit it from the served "
                          "run's step log (sim-calibrate --from-step-log) to validate against bench-serve results")
    cfg = EngineConfig(block_size=int(limits["block_size"]), max_num_seqs=limits.get("max_num_seqs"),
                       max_num_batched_tokens=limits.get("max_num_batched_tokens"),
                       enable_prefix_caching=bool(limits.get("enable_prefix_caching", True)),
                       async_scheduling=bool(calibration.extra.get("async_scheduling", False)),
                       graph_prefill_alone=bool(limits.get("lone_prefill_tokens", 0)))
    return cfg, limits


def _load_result(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"bench result {path}: {e}") from None


def _served_workload(path: str, seed: int) -> tuple[dict, list]:
    """A bench-serve result and its requests (``sim.traffic.load_trace``), read once per result."""
    return _load_result(path), load_trace(path, seed=seed)


def replayed_delays(step_log: str, work: list[tuple[dict, list]], warmups: int | None = None) -> list[dict]:
    """Per result of ``work`` (``_served_workload`` pairs, in the order they were run against the server that wrote
    ``step_log``): request id -> replayed admission delay (``sim.arrival_replay``)."""
    from torchinferno.sim.arrival_replay import core_timeline, replay_delays

    delays = replay_delays(core_timeline(step_log), [doc for doc, _ in work],
                           [[r.arrival_s for r in reqs] for _, reqs in work], warmups)
    return [{r.request_id: d for r, d in zip(reqs, ds)} for (_, reqs), ds in zip(work, delays)]


def simulate_served(calibration: Calibration, doc: dict, reqs: list, admission_s: float | None = None,
                    cost_model: str = "auto", stream_s: float | None = None, entry_delays: dict | None = None,
                    stream_token_s: float | None = None) -> dict:
    """The simulator's figures for one bench-serve result ``doc`` and its requests (``_served_workload``), as
    ``driver.summarize`` gives them. ``cost_model``: ``Calibration.model_for``'s choice. ``entry_delays``
    (``replayed_delays``): replayed admissions, which replace the calibration's admission time."""
    return served_run(calibration, doc, reqs, admission_s, cost_model, stream_s, entry_delays,
                      stream_token_s=stream_token_s).summary()


def served_run(calibration: Calibration, doc: dict, reqs: list, admission_s: float | None = None,
               cost_model: str = "auto", stream_s: float | None = None, entry_delays: dict | None = None,
               replica_hook=None, latency_s: float | None = None, stream_token_s: float | None = None):
    """``simulate_served``'s ``driver.RunResult`` (per-request records); ``replica_hook(replica)`` sees the
    simulated replica before the run (``arrival_replay.StepRecorder``). With ``entry_delays``, the calibration's
    ``extra["finish_latency_s"]`` (concurrency -> seconds, ``sim.first_token.fit_finish_latency``; absent: 0) delays
    the client's finish of each request, as the replayed refill delays assume."""
    cfg, limits = _served_config(calibration)
    sim_ex = SimulatedExecutor(calibration.model_for(cost_model), cfg, num_blocks=int(limits["num_blocks"]),
                               max_model_len=int(limits["max_model_len"]), device=calibration.device)
    if limits.get("num_sliding_blocks"):  # a hybrid KV spec's served engine: its sliding pool too
        sim_ex.num_sliding_blocks, sim_ex.sliding_window = int(limits["num_sliding_blocks"]), int(limits["sliding_window"])
    adm = calibration.extra.get("admission_s", 0.0) if admission_s is None else admission_s
    stream = calibration.extra.get("stream_s", 0.0) if stream_s is None else stream_s
    lat = calibration.extra.get("latency_s", 0.0) if latency_s is None else latency_s
    tok = calibration.extra.get("stream_token_s", 0.0) if stream_token_s is None else stream_token_s
    fin = 0.0
    if entry_delays is not None:
        from torchinferno.sim.first_token import finish_latency_for

        adm = lat = 0.0
        fin = finish_latency_for(calibration.extra.get("finish_latency_s"), doc.get("max_concurrency"))
    rep = Replica(EngineCore(sim_ex), sim_ex.clock, "sim")
    if replica_hook is not None:
        replica_hook(rep)
    return run_workload(reqs, [rep],
                        max_concurrency=doc.get("max_concurrency"), admission_s=adm, stream_s=stream,
                        entry_delays=entry_delays, latency_s=lat, finish_latency_s=fin,
                        stream_coalesce=bool(calibration.extra.get("stream_coalesce", False)),
                        stream_token_s=tok)


def fit_stream_replay(calibration: Calibration, results: list[str], step_log: str, seed: int = 0,
                      cost_model: str = "auto", warmups: int | None = None) -> tuple[float, float]:
    """The API server's per-streamed-token time (``driver.run_workload``'s ``stream_s``) that best predicts the p50
    TPOT of ``results`` with their admissions replayed from ``step_log`` (the run they came from): a grid.
    Returns ``(seconds, mean |relative error| of p50 TTFT and TPOT)``."""
    work = [_served_workload(p, seed) for p in results]
    delays = replayed_delays(step_log, work, warmups)
    meas = [measured_from_bench(doc) for doc, _ in work]

    def err(st: float) -> float:
        e = []
        for (doc, reqs), m, dl in zip(work, meas, delays):
            got = simulate_served(calibration, doc, reqs, 0.0, cost_model, st, dl)
            e += [abs(got[k] - m[k]) / m[k] for k in ("p50_ttft_s", "p50_tpot_s")]
        return sum(e) / len(e)

    best = min((err(st), st) for st in (0.0, 5e-6, 10e-6, 20e-6, 40e-6, 60e-6, 80e-6, 120e-6))
    return best[1], best[0]


def fit_api_server(calibration: Calibration, results: list[str], seed: int = 0,
                   cost_model: str = "auto", admission_s: float | None = None) -> tuple[float, float, float]:
    """The API server as one FIFO stage (``driver.run_workload``'s ``admission_s`` per request and ``stream_s`` per
    streamed token) that best predicts the p50 TTFT and p50 TPOT of ``results`` (bench-serve runs of the server
    whose step log gave ``calibration``): a grid search. Returns ``(admission_s, stream_s, mean |relative error|)``.
    With ``calibration.extra["stream_coalesce"]`` (``stream_s`` per streamed event) a second grid then fits the
    per-token cost beside it (``stream_token_s``, stored in ``calibration.extra``) at the admission time found.
    ``admission_s``: held at that value (fitted elsewhere), only the streaming costs are searched."""
    work = [_served_workload(p, seed) for p in results]
    meas = [measured_from_bench(doc) for doc, _ in work]

    def err(a: float, st: float, tok: float = 0.0) -> float:
        e = []
        for (doc, reqs), m in zip(work, meas):
            got = simulate_served(calibration, doc, reqs, a, cost_model, st, stream_token_s=tok)
            e += [abs(got[k] - m[k]) / m[k] for k in ("p50_ttft_s", "p50_tpot_s")]
        return sum(e) / len(e)

    grid_a = [0.0, 0.25e-3, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 3e-3] if admission_s is None else [admission_s]
    grid_s = [0.0, 5e-6, 10e-6, 20e-6, 30e-6, 40e-6, 50e-6, 60e-6, 70e-6, 80e-6, 100e-6, 120e-6]
    best = min((err(a, st), a, st) for a in grid_a for st in grid_s)
    if not calibration.extra.get("stream_coalesce"):
        return best[1], best[2], best[0]
    a = best[1]
    grid_t = [0.0, 5e-6, 10e-6, 20e-6, 30e-6, 40e-6, 60e-6, 80e-6]
    e, st, tok = min((err(a, st, tok), st, tok) for st in grid_s for tok in grid_t)
    calibration.extra["stream_token_s"] = tok
    return a, st, e


def fit_admission(calibration: Calibration, results: list[str], seed: int = 0,
                  cost_model: str = "auto") -> tuple[float, float]:
    """The API server's per-request admission time (``driver.run_workload``'s ``admission_s``) that best predicts
    the p50 TTFT of ``results`` (bench-serve runs of the server whose step log gave ``calibration``): a grid over
    0-20 ms refined around its best point. Returns ``(seconds, mean |relative error| of p50 TTFT)``."""
    work = [_served_workload(p, seed) for p in results]
    measured = [measured_from_bench(doc)["p50_ttft_s"] for doc, _ in work]

    def err(a: float) -> float:
        pred = [simulate_served(calibration, doc, reqs, a, cost_model)["p50_ttft_s"] for doc, reqs in work]
        return sum(abs(x - m) / m for x, m in zip(pred, measured)) / len(measured)

    grid = [0.0, 0.1e-3, 0.25e-3, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3, 6e-3, 8e-3, 12e-3, 20e-3]
    best_e, best = min((err(a), a) for a in grid)
    i = grid.index(best)
    lo, hi = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
    for a in (lo + (hi - lo) * k / 8 for k in range(1, 8)):
        e = err(a)
        if e < best_e:
            best_e, best = e, a
    return best, best_e


def validate_served(calibration: Calibration, results: list[str], seed: int = 0, log=print,
                    cost_model: str = "auto", replay_arrivals: str | None = None, warmups: int | None = None) -> dict:
    """The simulator against served runs: each of ``results`` is a bench-serve result JSON (its requests'
    lengths, rate, burstiness and concurrency cap are replayed through the simulator, ``sim.traffic.load_trace``)
    and ``calibration`` must carry the served engine's limits (``sim-calibrate --from-step-log`` records them) and
    may carry the API server's admission time (``fit_admission``, ``--fit-admission-to``).
    ``replay_arrivals``: the step log of the served run that produced ``results`` (given in run order): its
    requests' arrivals at the core are replayed instead of the admission time (``sim.arrival_replay``; ``warmups``:
    bench-serve warm-ups per result when the results do not record them).
    Same output shape as ``validate``, levels keyed by the result's concurrency (or file name)."""
    levels = {}
    work = [_served_workload(p, seed) for p in results]
    delays = replayed_delays(replay_arrivals, work, warmups) if replay_arrivals else [None] * len(work)
    for path, (doc, reqs), dl in zip(results, work, delays):
        measured = measured_from_bench(doc)
        cap = doc.get("max_concurrency")
        t0 = time.perf_counter()
        predicted = simulate_served(calibration, doc, reqs, cost_model=cost_model, entry_delays=dl)
        n = len(reqs)
        wall_sim = time.perf_counter() - t0
        figs = compare(predicted, measured)
        name = str(cap) if cap is not None else Path(path).stem
        levels[name] = {"requests": n, "figures": figs, "result": str(path), "wall_s_sim": wall_sim}
        log(f"concurrency {name:>3} ({n} requests of {path}; simulated in {wall_sim * 1e3:.0f} ms)")
        for k, v in figs.items():
            log(f"  {k:<18} predicted {v['predicted']:>10.4f}  measured {v['measured']:>10.4f}  "
                f"error {v['relative_error'] * 100:+6.1f}%")
    errs = [abs(v["relative_error"]) for lv in levels.values() for v in lv["figures"].values()]
    return {"calibration": calibration.to_dict(), "engine": "served (bench-serve results)", "levels": levels,
            "cost_model": type(calibration.model_for(cost_model)).__name__, "replay_arrivals": replay_arrivals,
            "max_abs_relative_error": max(errs), "mean_abs_relative_error": sum(errs) / len(errs)}
