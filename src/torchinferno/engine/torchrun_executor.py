"""``TorchrunExecutor``: the engine under ``torchrun`` (every launched process is one tensor-parallel rank).

torchrun starts the same command ``WORLD_SIZE`` times; each process builds its rank of the model
(``parallel.load.build_rank_model``: only its shards are read) and runs the *same* engine on it in lockstep,
as vLLM's external-launcher mode does: the scheduler is deterministic given the same requests in the same
order, so every rank launches the same steps and their collectives pair up; every rank samples the same
tokens (all-gathered logits, same seeds). RANK / WORLD_SIZE / LOCAL_RANK are read through ``env.py`` only;
the process group joins torchrun's rendezvous (``env://``).

Invariants: the scheduler's block count and context length are the minimum over ranks (all-reduced at start),
so every rank can hold every block table; only offline engines (``LLM``, ``llama-bench-suite`` offline runs,
``serve --engine-in-process``) run this way, since a separate engine-core process would not be a torchrun rank.
"""

from __future__ import annotations

import atexit
import datetime

import torch
import torch.distributed as dist

from torchinferno.engine.config import EngineConfig
from torchinferno.engine.executor import UniprocExecutor
from torchinferno.errors import ConfigError

__all__ = ["TorchrunExecutor", "torchrun_world"]


def torchrun_world() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` when this process was launched by torchrun with more than one rank."""
    from torchinferno.env import read_env

    e = read_env()
    if e.torchrun_rank is None or not e.torchrun_world_size or e.torchrun_world_size < 2:
        return None
    return e.torchrun_rank, e.torchrun_world_size, e.torchrun_local_rank or 0


class TorchrunExecutor(UniprocExecutor):
    """This torchrun rank's ``Worker`` (its shard of the model, its KV cache, its runner); see the module doc."""

    def __init__(self, spec, config: EngineConfig):
        from torchinferno.parallel.comm import Comm
        from torchinferno.parallel.config import ParallelConfig
        from torchinferno.parallel.load import build_rank_model

        world = torchrun_world()
        if world is None:
            raise ConfigError("TorchrunExecutor needs a torchrun launch (RANK and WORLD_SIZE > 1)")
        from torchinferno.parallel.checks import check_split_spec, parallel_world

        rank, size, local = world
        ranks, mode = parallel_world(config)
        if ranks not in (1, size):
            raise ConfigError(f"--{mode}-parallel-size {ranks} does not match torchrun's world of {size} ranks")
        check_split_spec(spec, size, mode)
        backend = "nccl" if spec.device.startswith("cuda") else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local)
        self._owns_group = not dist.is_initialized()
        if self._owns_group:
            dist.init_process_group(backend, init_method="env://", rank=rank, world_size=size)
            # A gloo group still alive when the interpreter exits can abort the rank ("terminate called without an
            # active exception", SIGABRT) after its work is done: destroy it at exit unless shutdown() did.
            atexit.register(_destroy_group)
        self.comm = Comm(ParallelConfig(tp_size=size, rank=rank, backend=backend, mode=mode))
        super().__init__(build_rank_model(spec, self.comm), config)
        agreed = torch.tensor([self.num_blocks, self.max_model_len, self.num_sliding_blocks or 0,
                               self.prefill_graph_tokens], device=self.device if backend == "nccl" else "cpu")
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)  # every rank's scheduler makes the same steps
        self.num_blocks, self.max_model_len, sliding, self.prefill_graph_tokens = (int(v) for v in agreed.tolist())
        self.num_sliding_blocks = sliding if self.num_sliding_blocks is not None else None
        self.model_config = getattr(self.model, "full_config", self.model.config)

    def shutdown(self) -> None:
        super().shutdown()
        if self._owns_group:
            _destroy_group()
            self._owns_group = False

    def describe(self) -> str:
        return (f"{super().describe()}, {self.comm.pcfg.mode}-parallel rank {self.comm.rank}/{self.comm.world_size} "
                "under torchrun")


def _destroy_group() -> None:
    """Meet the other ranks (gloo: a bounded barrier, so a dead peer cannot hang the exit), then tear the group down:
    no rank destroys it while another is still in a collective."""
    if not dist.is_initialized():
        return
    if dist.get_backend() == "gloo":
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
        except RuntimeError:  # a peer is gone: nothing left to wait for
            pass
    dist.destroy_process_group()


def parallel_executor(spec, config: EngineConfig):
    """The executor of a ``tensor_parallel_size > 1`` engine: this torchrun rank's when launched by torchrun,
    else worker processes started here (``MultiprocExecutor``)."""
    if torchrun_world() is not None:
        return TorchrunExecutor(spec, config)
    from torchinferno.engine.multiproc_executor import MultiprocExecutor

    return MultiprocExecutor(spec, config)
