"""Run a function on N local ranks of a ``torch.distributed`` world (spawned processes, loopback rendezvous).

Used by the multi-process executor and by tests: a free port is picked here, every process joins the
group with ``init_process_group`` and is joined with a timeout; a rank that fails or hangs takes the others
down (no process outlives :func:`run_ranks`).
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from torchinferno.errors import TorchInfernoError
from torchinferno.parallel.comm import Comm
from torchinferno.parallel.config import ParallelConfig
from torchinferno.ports import free_port, once_more_if_port_taken

log = logging.getLogger(__name__)


def init_rank(rank: int, world: int, port: int, backend: str = "gloo", timeout_s: float = 120.0,
              mode: str = "tensor") -> Comm:
    """Join the loopback world as ``rank``; the returned :class:`Comm` uses the default group. On CPU (gloo)
    the rank takes its share of the cores for intra-op threads (ranks on one host would oversubscribe them)."""
    import datetime
    import os

    import torch

    if backend == "gloo":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return Comm(ParallelConfig(tp_size=world, rank=rank, backend=backend, mode=mode))


def _entry(rank: int, fn: Callable, world: int, port: int, backend: str, args: tuple, results, mode: str) -> None:
    comm = init_rank(rank, world, port, backend, mode=mode)
    try:
        results.put((rank, pickle.dumps(fn(comm, *args))))  # plain bytes: no shared-memory handles to a dead process
        dist.barrier()  # no rank tears the group down while another is still in a collective with it
    finally:
        dist.destroy_process_group()
    # Done and delivered: leave without interpreter finalization, where gloo's worker threads are at times
    # destroyed while joinable ("terminate called without an active exception", SIGABRT after a clean run).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(fn: Callable[..., Any], world: int, *args, backend: str = "gloo", timeout_s: float = 120.0,
              mode: str = "tensor") -> list[Any]:
    """``[fn(comm, *args) for each rank]`` computed in ``world`` spawned processes (``fn`` importable, results
    picklable). Raises TorchInfernoError naming the rank if one fails or the world outlives ``timeout_s``.
    A rendezvous port taken by another process between picking and binding it is retried once on a new port."""
    return once_more_if_port_taken(lambda: _run_ranks(fn, world, args, backend, timeout_s, mode))


def _run_ranks(fn: Callable[..., Any], world: int, args: tuple, backend: str, timeout_s: float,
               mode: str) -> list[Any]:
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = free_port()
    procs = mp.start_processes(_entry, args=(fn, world, port, backend, args, results, mode), nprocs=world, join=False,
                               start_method="spawn")
    deadline = time.monotonic() + timeout_s
    out: dict[int, Any] = {}

    def drain() -> None:  # read while ranks run: a large result would block its writer on the pipe
        while not results.empty():
            rank, value = results.get()
            out[rank] = pickle.loads(value)

    try:
        while not procs.join(timeout=0.2):
            drain()
            if time.monotonic() > deadline:
                raise TorchInfernoError(f"tensor-parallel world of {world} did not finish within {timeout_s:.0f} s")
    except mp.ProcessRaisedException as e:
        raise TorchInfernoError(f"a tensor-parallel rank failed: {str(e).strip().splitlines()[-1]}") from None
    except mp.ProcessExitedException as e:  # killed by a signal or a nonzero exit without a Python exception
        drain()
        if len(out) < world:  # a rank died before delivering its result: the run failed
            raise TorchInfernoError(f"a tensor-parallel rank died: {e}") from None
        log.warning("every rank delivered its result, then %s (ignored: teardown after the work)", e)
    finally:
        for p in procs.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
    drain()
    return [out[r] for r in range(world)]
