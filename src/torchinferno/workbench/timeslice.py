"""Time-sliced virtual GPUs: N ranks sharing one device under a round-robin quantum.

``replay_timeslice`` is the scheduler alone (pure Python, no device): each virtual rank has an amount of work
(microseconds of device time it needs, e.g. a measured workload x ``--profile-scale``); ranks take turns in a
ready queue, each running for at most ``time_slice_us`` of work. Semantics:

* switching the device from one rank to another costs ``context_switch_us`` (overhead, no work done); the
  first slice and a rank continuing after its own slice (it is the only one left) pay none;
* a rank whose work ends inside its slice yields at once (the slice is shorter);
* a preempted rank (quantum spent, work left) goes to the back of the queue and resumes where it stopped.

Every slice is one timeline record: rank, start/end, overhead, work done, work left. The summary gives the
makespan, each rank's completion time and slowdown against having the device alone, the device's busy
fraction, and the overhead share. ``profile_timeslice`` measures the representative workload for real (the
same generation as ``profile-run``) and writes the README's artifacts.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

from torchinferno.errors import ConfigError

__all__ = ["TimesliceConfig", "replay_timeslice", "profile_timeslice"]


@dataclass(frozen=True)
class TimesliceConfig:
    virtual_gpus: int = 8
    time_slice_us: float = 1000.0
    context_switch_us: float = 25.0
    profile_scale: float = 1.0
    rank_work_scale: tuple[float, ...] = ()  # per-rank multiplier of the measured work (default: all 1)

    def validate(self) -> "TimesliceConfig":
        if self.virtual_gpus < 1:
            raise ConfigError(f"--virtual-gpus must be >= 1, got {self.virtual_gpus}")
        if not self.time_slice_us > 0:
            raise ConfigError(f"--time-slice-us must be > 0, got {self.time_slice_us}")
        if self.context_switch_us < 0:
            raise ConfigError(f"--context-switch-us must be >= 0, got {self.context_switch_us}")
        if not self.profile_scale > 0:
            raise ConfigError(f"--profile-scale must be > 0, got {self.profile_scale}")
        if self.rank_work_scale and (len(self.rank_work_scale) != self.virtual_gpus or min(self.rank_work_scale) < 0):
            raise ConfigError(f"--rank-work-scale needs {self.virtual_gpus} non-negative values (one per virtual GPU), "
                              f"got {list(self.rank_work_scale)}")
        return self

    def rank_work(self, measured_us: float) -> list[float]:
        scales = self.rank_work_scale or (1.0,) * self.virtual_gpus
        return [measured_us * self.profile_scale * s for s in scales]


def replay_timeslice(work_us: list[float], time_slice_us: float, context_switch_us: float) -> tuple[list[dict], dict]:
    """Round-robin replay of ``work_us[r]`` per rank (module docstring) -> (timeline, summary)."""
    remaining = list(work_us)
    queue = deque(r for r, w in enumerate(work_us) if w > 0)
    done_at = [0.0 if w == 0 else None for w in work_us]
    timeline: list[dict] = []
    now = overhead_total = 0.0
    last = None
    while queue:
        r = queue.popleft()
        overhead = context_switch_us if last is not None and last != r else 0.0
        start = now
        run = min(time_slice_us, remaining[r])
        now += overhead + run
        remaining[r] -= run
        overhead_total += overhead
        timeline.append({"slice": len(timeline), "rank": r, "start_us": start, "end_us": now, "overhead_us": overhead,
                         "work_us": run, "work_left_us": remaining[r],
                         "event": "finished" if remaining[r] <= 0 else "preempted"})
        if remaining[r] > 0:
            queue.append(r)
        else:
            done_at[r] = now
        last = r
    total_work = sum(work_us)
    summary = {
        "virtual_gpus": len(work_us), "time_slice_us": time_slice_us, "context_switch_us": context_switch_us,
        "makespan_us": now, "total_work_us": total_work, "total_overhead_us": overhead_total,
        "device_busy_fraction": total_work / now if now else 0.0,
        "overhead_fraction": overhead_total / now if now else 0.0,
        "slices": len(timeline), "context_switches": sum(1 for e in timeline if e["overhead_us"] > 0),
        "ranks": [{"rank": r, "work_us": w, "completion_us": done_at[r],
                   "slowdown_vs_dedicated": (done_at[r] / w) if w else None} for r, w in enumerate(work_us)],
    }
    return timeline, summary


def profile_timeslice(out_dir: str | Path, run_cfg, ts: TimesliceConfig, iters: int = 3) -> dict:
    """Measure ``run_cfg``'s generation (median of ``iters`` timed runs, one profiled), replay it across
    ``ts.virtual_gpus`` time-sliced ranks and write the artifacts; returns the manifest."""
    import inspect
    import statistics

    from torchinferno.workbench.artifacts import ArtifactDir
    from torchinferno.workbench.profiling import environment, memory_profile, model_bytes, profile_calls, reset_memory
    from torchinferno.workbench.repro_templates import timeslice_repro
    from torchinferno.workbench.run_config import build_model, generate_tokens, make_prompts

    run_cfg.validate()
    ts.validate()
    out = ArtifactDir(out_dir, "profile-timeslice")
    out.json("run_config.json", {**run_cfg.to_dict(), "timeslice": asdict(ts)}, "the workload and the time-slicing setup")
    out.json("environment.json", environment(), "python/torch/CUDA versions and devices")
    model = build_model(run_cfg)
    prompts = make_prompts(run_cfg, model.config.vocab_size)
    generate_tokens(model, prompts, run_cfg)  # warm-up: first-use costs are not the workload's
    reset_memory(run_cfg.device)
    times = []
    for _ in range(max(1, iters)):
        sync = _sync(run_cfg.device)
        t0 = time.perf_counter()
        tokens = generate_tokens(model, prompts, run_cfg)
        sync()
        times.append((time.perf_counter() - t0) * 1e6)
    measured_us = statistics.median(times)
    _, ops = profile_calls(lambda: generate_tokens(model, prompts, run_cfg), run_cfg.device,
                           out.path("chrome_trace.json"), label="representative workload")
    out.existing("chrome_trace.json", "chrome-trace", "torch.profiler trace of one representative run")
    out.json("operator_profile.json", {"workload": "representative generation (prefill + decode)", "operators": ops},
             "torch.profiler key averages of the representative workload (us)")
    out.json("representative_output.json", {"input_ids": prompts, "token_ids": tokens, "measured_us": times,
                                            "median_us": measured_us},
             "the measured workload: prompts, generated tokens, wall time of each timed run")
    out.json("memory_profile.json", memory_profile(run_cfg.device, {"weight_bytes": model_bytes(model)}),
             "allocator statistics (CUDA) or RSS (CPU) of the representative workload")
    work = ts.rank_work(measured_us)
    timeline, summary = replay_timeslice(work, ts.time_slice_us, ts.context_switch_us)
    summary.update(measured_workload_us=measured_us, profile_scale=ts.profile_scale)
    out.json("timeslice_timeline.json", {"slices": timeline},
             "every slice: rank, start/end, context-switch overhead, work done, work left (us)")
    out.json("timeslice_summary.json", summary, "makespan, per-rank completion and slowdown, busy and overhead fractions")
    script = timeslice_repro(work, ts, summary["makespan_us"], inspect.getsource(replay_timeslice))
    out.python("timeslice_repro.py", script,
               "standalone: replays the timeline from the recorded work and checks the makespan")
    return out.finish(virtual_gpus=ts.virtual_gpus, measured_workload_us=round(measured_us, 1),
                      makespan_us=round(summary["makespan_us"], 1),
                      device_busy_fraction=round(summary["device_busy_fraction"], 4),
                      context_switches=summary["context_switches"])


def _sync(device: str):
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None
