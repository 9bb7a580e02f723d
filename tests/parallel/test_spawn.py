"""run_ranks: results per rank; a rank that dies before delivering fails the run with a one-line error, a crash
in teardown after every rank delivered does not lose the results."""

import os
import signal

import pytest

from torchinferno.errors import TorchInfernoError
from torchinferno.parallel.spawn import run_ranks


def _sum_rank(comm):
    import torch
    import torch.distributed as dist

    t = torch.tensor([comm.rank + 1.0])
    dist.all_reduce(t)
    return comm.rank, float(t)


def _dies_early(comm):
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return comm.rank


def _aborts_in_teardown(comm):
    import torch.distributed as dist

    dist.destroy_process_group = lambda: os.abort()  # stands in for gloo's SIGABRT on the way out
    return comm.rank


def test_results_in_rank_order_and_failures():
    assert run_ranks(_sum_rank, 2, timeout_s=60) == [(0, 3.0), (1, 3.0)]
    with pytest.raises(TorchInfernoError, match="rank died"):
        run_ranks(_dies_early, 2, timeout_s=60)
    assert run_ranks(_aborts_in_teardown, 2, timeout_s=60) == [0, 1]
