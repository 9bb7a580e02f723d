"""``torchinferno.runtime.fake_dist``: fake process groups and collectives to plan a tensor-parallel world in
one process (thin re-exports of ``parallel.fake``)."""

from torchinferno.parallel.fake import (
    LocalFakeComm,
    ParallelPlan,
    fake_world,
    plan_parallel,
)

__all__ = ["LocalFakeComm", "ParallelPlan", "fake_world", "plan_parallel"]
