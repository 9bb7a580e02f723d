"""``torchinferno.runtime.traffic``: seeded bursty traffic and trace replay (``sim.traffic``); thin re-exports."""

from torchinferno.sim.traffic import (
    LengthDist,
    SimRequest,
    TrafficSpec,
    arrival_times,
    generate,
    load_trace,
)

__all__ = ["LengthDist", "SimRequest", "TrafficSpec", "arrival_times", "generate", "load_trace"]
