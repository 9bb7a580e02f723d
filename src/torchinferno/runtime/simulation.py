"""``torchinferno.runtime.simulation``: time-sliced virtual GPUs (``workbench.timeslice``) and the serving
simulator's virtual-clock executor and driver (``sim/``); thin re-exports."""

from torchinferno.sim.driver import run_workload
from torchinferno.sim.executor import SimulatedExecutor, VirtualClock
from torchinferno.workbench.timeslice import (
           TimesliceConfig,
           profile_timeslice,
           replay_timeslice,
)

__all__ = ["SimulatedExecutor", "TimesliceConfig", "VirtualClock", "profile_timeslice", "replay_timeslice",
           "run_workload"]
