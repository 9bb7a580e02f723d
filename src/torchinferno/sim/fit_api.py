"""Fitting the simulator's cost models from Python (what ``sim-calibrate`` does, without the CLI).

    from torchinferno.sim.fit_api import fit_step_logs, timeline_from_step_logs
    cal = fit_step_logs(["steps_a.jsonl.gz"])                # Calibration: linear + timeline, engine limits
    cal.save("served.json")
    model, err = timeline_from_step_logs(["steps_a.jsonl.gz"])  # the TimelineModel alone

``fit_step_logs`` = ``sim-calibrate --from-step-log``; ``timeline_from_probes`` fits the timeline to synchronous
``(features, seconds)`` probe rows (``sim-calibrate --steps-out`` files, ``calibrate.read_steps``).
"""

from __future__ import annotations

from torchinferno.sim.calibration import Calibration
from torchinferno.sim.step_log_fit import calibration_from_step_logs, read_step_log, timeline_flags
from torchinferno.sim.timeline import TimelineModel
from torchinferno.sim.timeline_fit import fit_timeline, iterations_from_probe_rows, iterations_from_step_log

__all__ = ["fit_step_logs", "timeline_from_probes", "timeline_from_step_logs"]


def fit_step_logs(paths: list[str], cost_model: str = "auto", weights: str = "sqrt",
                  timeline_weights: str = "time", log=lambda *a: None) -> Calibration:
    """A calibration from served step logs (``step_log_fit.calibration_from_step_logs``)."""
    return calibration_from_step_logs(list(paths), log=log, weights=weights, cost_model=cost_model,
                                      timeline_weights=timeline_weights)


def timeline_from_step_logs(paths: list[str], weights: str = "time") -> tuple[TimelineModel, float]:
    """The ``TimelineModel`` of one engine's step logs and its mean |relative error| on loop periods."""
    its, flags = [], None
    for p in paths:
        meta, rows = read_step_log(p)
        flags = flags or timeline_flags(meta)
        its = iterations_from_step_log(rows, its)
    return fit_timeline(its, weights=weights, **flags)


def timeline_from_probes(rows: list[tuple[tuple, float]], weights: str = "relative") -> tuple[TimelineModel, float]:
    """The ``TimelineModel`` of synchronous probe rows (a CPU engine: no overlap, no graphs)."""
    return fit_timeline(iterations_from_probe_rows(rows), graphs=False, overlap=False, weights=weights)
