"""``sim-validate``: the real engine and the simulator on the same workload, figures side by side.

For each concurrency level the same seeded workload (``requests`` prompts of ``input_len`` tokens generating
``output_len`` tokens, all available at t=0, at most ``concurrency`` in flight: bench-serve's closed loop) is
served twice through ``driver.run_workload``: by the real ``EngineCore`` over a ``UniprocExecutor`` on a wall
clock, or on this process's CPU-time clock with ``clock="cpu"`` (in process: no HTTP), and by the same core
class over a ``SimulatedExecutor`` with the calibration's cost model and the real executor's KV pool size and
step limits. Figures: output throughput, TTFT p50/p99,
TPOT p50/p99; each as ``{"predicted", "measured", "relative_error"}`` (``(predicted - measured) / measured``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from torchinferno.engine.config import EngineConfig
from torchinferno.engine.core import EngineCore
from torchinferno.engine.executor import UniprocExecutor
from torchinferno.sim.calibration import Calibration
from torchinferno.sim.driver import Replica, run_workload
from torchinferno.sim.executor import SimulatedExecutor, make_clock
from torchinferno.sim.traffic import TrafficSpec, generate

__all__ = ["FIGURES", "ValidateConfig", "compare", "validate"]

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
        sim_ex = SimulatedExecutor(calibration.cost, real_ex.config, num_blocks=real_ex.num_blocks,
                                   max_model_len=real_ex.max_model_len, device=str(real_ex.device))
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
    return {"calibration": calibration.to_dict(), "engine": real_ex.describe(),
            "workload": {"input_len": vc.input_len, "output_len": vc.output_len, "seed": vc.seed}, "clock": vc.clock,
            "levels": levels, "max_abs_relative_error": max(errs), "mean_abs_relative_error": sum(errs) / len(errs)}
