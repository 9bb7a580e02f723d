"""The API server's FIFO stage fitted to when requests reached the engine core (``sim-calibrate --api-model gaps``).

``validate.fit_api_server`` fits the stage (``admission_s`` per request, ``stream_s`` per streamed token:
``driver.run_workload``) to the client's p50 TTFT and TPOT, so it also absorbs whatever the engine model gets wrong.
Here it is fitted to the admission delays themselves: the step log of the served run says when each request reached
the core (``sim.arrival_replay``), i.e. how long after its release (the level's start for the first wave; the finish
that freed its slot for a closed-loop refill). Per level the 50th and 90th percentiles of the wave's spread and of the
refill delays, read from a simulated run's steps exactly as from the served log, are matched to the recorded ones
(grid search, mean relative error with a 1 ms floor). The
fitted stage is then used without the log, on runs that have none.
"""

from __future__ import annotations

import numpy as np

from torchinferno.sim.calibration import Calibration

__all__ = ["delay_stats", "fit_api_from_arrivals", "simulated_delays"]

GRID_ADMISSION = (0.0, 0.25e-3, 0.5e-3, 1e-3, 1.5e-3, 2e-3)
GRID_STREAM = (0.0, 10e-6, 20e-6, 40e-6, 60e-6, 80e-6)
GRID_LATENCY = (0.0, 1e-3, 2e-3, 3e-3)


def simulated_delays(calibration: Calibration, doc: dict, reqs: list, admission_s: float, stream_s: float,
                     cost_model: str = "auto", latency_s: float = 0.0) -> list[float]:
    """The admission delays of one simulated level (``validate.served_run`` with this API stage), read from its
    steps the way ``arrival_replay`` reads a served log (arrivals placed in their step window)."""
    from torchinferno.sim.arrival_replay import StepRecorder, replay_delays, timeline_from_rows
    from torchinferno.sim.validate import served_run

    box = {}

    def hook(rep):
        box["rec"] = StepRecorder(rep)

    served_run(calibration, doc, reqs, admission_s, cost_model, stream_s, replica_hook=hook, latency_s=latency_s)
    rec = box["rec"]
    (delays,) = replay_delays(timeline_from_rows(rec.meta, rec.rows), [{**doc, "num_warmups": 0}],
                              [[r.arrival_s for r in reqs]])
    return delays


def delay_stats(delays: list[float], cap: int | None) -> list[float]:
    """50th and 90th percentiles of the wave's spread (the first ``cap`` requests' delays less the first one's) and
    of the refills' delays (the rest, when any)."""
    cap = cap or len(delays)
    out = []
    for grp in ([d - delays[0] for d in delays[:cap]], delays[cap:]):
        if len(grp) > 1:
            out += [float(np.percentile(grp, 50)), float(np.percentile(grp, 90))]
    return out


def fit_api_from_arrivals(calibration: Calibration, results: list[str], step_log: str, seed: int = 0,
                          cost_model: str = "auto", warmups: int | None = None) -> tuple[float, float, float, float]:
    """``(admission_s, stream_s, latency_s, mean relative error of the delay percentiles)`` of the FIFO API stage
    (and the pure latency in front of it: ``driver.run_workload``) whose
    simulated admission delays best match those ``step_log`` recorded for ``results`` (bench-serve results of that
    server, in run order)."""
    from torchinferno.sim.validate import _served_workload, replayed_delays

    work = [_served_workload(p, seed) for p in results]
    recorded = replayed_delays(step_log, work, warmups)
    targets = [delay_stats([dl[r.request_id] for r in reqs], doc.get("max_concurrency"))
               for (doc, reqs), dl in zip(work, recorded)]

    def err(adm: float, stream: float, lat: float) -> float:
        e = []
        for (doc, reqs), want in zip(work, targets):
            got = delay_stats(simulated_delays(calibration, doc, reqs, adm, stream, cost_model, lat),
                              doc.get("max_concurrency"))
            e += [abs(g - w) / max(w, 1e-3) for g, w in zip(got, want)]
        return sum(e) / len(e)

    best = min((err(a, s, lat), a, s, lat) for a in GRID_ADMISSION for s in GRID_STREAM for lat in GRID_LATENCY)
    return best[1], best[2], best[3], best[0]
