"""Fake process groups and collectives: plan a tensor-parallel world of N ranks in one process
(``runtime.fake_dist`` re-exports this module).

:func:`fake_world` joins a world of ``world_size`` ranks that exists only in this process: torch's ``fake``
backend (``FakeStore``; every collective returns at once and leaves its input as it is) when torch ships
it, else a :class:`LocalFakeComm` that issues no ``torch.distributed`` call at all. Either way the sharded
modules run their real code with real shapes and :class:`~torchinferno.parallel.comm.Comm` tallies each
collective, so a sharding plan's shapes, per-rank memory and collective counts can be checked without N
devices (the values are not a real world's: the sums are missing).

:func:`plan_parallel` is the "70B planning" of ``plan-parallel``: a family's model built on ``meta`` (no
weights) and sharded as rank 0 of ``tp`` ranks, with bytes of weights and KV per rank and the collectives
(and bytes) of one decode step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from torchinferno.models.protocol import KVSpec
from torchinferno.parallel.comm import Comm
from torchinferno.parallel.config import ParallelConfig


class LocalFakeComm(Comm):
    """A :class:`Comm` of a world that does not exist: tallies every collective, runs none."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            self._tally("all_reduce", x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return x
        self._tally("all_gather", x)
        return torch.cat([x] * self.world_size, dim=-1)

    def broadcast_object(self, obj, src: int = 0):
        return obj

    def barrier(self) -> None:
        pass


def torch_fake_store():
    """torch's ``FakeStore`` class, or None when this torch has no fake process group."""
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError:
        return None
    return FakeStore


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0, use_torch: bool = True) -> Iterator[Comm]:
    """A :class:`Comm` for ``rank`` of a fake world of ``world_size`` ranks (torch's fake backend if
    available and ``use_torch``, else :class:`LocalFakeComm`); the default group is destroyed on exit."""
    pcfg = ParallelConfig(tp_size=world_size, rank=rank, backend="fake")
    store = torch_fake_store() if use_torch else None
    if store is None or dist.is_initialized():
        yield LocalFakeComm(pcfg)
        return
    dist.init_process_group("fake", store=store(), rank=rank, world_size=world_size)
    try:
        yield Comm(pcfg)
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True)
class ParallelPlan:
    """One rank's share of a model at tensor-parallel size ``tp`` (rank 0; ranks differ only by padding)."""

    family: str
    size: str
    tp: int
    dtype: str
    weight_bytes: int  # this rank's parameters
    full_weight_bytes: int  # the unsharded model's
    kv_bytes_per_token: int  # this rank's cache per token (all layers)
    all_reduces_per_step: int
    all_gathers_per_step: int
    decode_batch: int
    all_reduce_bytes: int  # payload of one decode step's all-reduces (per rank)
    all_gather_bytes: int  # this rank's contribution to the logits all-gather of one decode step
    ring_bytes_sent: int  # bytes a rank sends in one decode step (ring all-reduce 2(N-1)/N, all-gather (N-1)/N)
    kv_spec: KVSpec | None = None  # the rank's KVSpec (hybrid specs: the engine keeps only a window of the sliding group)
    kv_elt: int = 2

    def kv_bytes(self, context: int) -> int:
        """This rank's KV bytes for one sequence of ``context`` tokens, as the engine's pool holds it (block 16)."""
        if self.kv_spec is None or not self.kv_spec.is_hybrid:
            return self.kv_bytes_per_token * context
        dtype = {1: torch.float8_e4m3fn, 2: torch.bfloat16, 4: torch.float32}[self.kv_elt]
        return self.kv_spec.sequence_bytes(dtype, context, 16)

    def lines(self, context: int) -> list[str]:
        gib = 2**30
        kv = self.kv_bytes(context)
        return [
            f"{self.family} {self.size} at --tensor-parallel-size {self.tp} ({self.dtype}), per rank:",
            f"  weights        {self.weight_bytes / gib:8.2f} GiB  (unsharded {self.full_weight_bytes / gib:.2f} GiB)",
            f"  KV cache       {self.kv_bytes_per_token / 1024:8.1f} KiB/token; {kv / gib:.2f} GiB for {context} tokens"
            + (" (sliding window freed, entries packed)" if kv != self.kv_bytes_per_token * context else ""),
            f"  collectives    {self.all_reduces_per_step} all-reduce + {self.all_gathers_per_step} all-gather per step",
            (f"  decode step    batch {self.decode_batch}: all-reduce payload {self.all_reduce_bytes / 1024:.1f} KiB, "
             f"logits all-gather {self.all_gather_bytes / 1024:.1f} KiB, ring bytes sent {self.ring_bytes_sent / 1024:.1f} KiB"),
        ]


def _nbytes(module: torch.nn.Module) -> int:
    seen, total = set(), 0
    for p in list(module.parameters()) + list(module.buffers()):
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


def plan_parallel(family_name: str, size: str, tp: int, dtype: torch.dtype = torch.bfloat16, batch: int = 1) -> ParallelPlan:
    """Rank 0 of ``family``'s ``size`` sharded over ``tp`` ranks, on ``meta`` (no weights, no world)."""
    from torchinferno.models.registry import get_family

    family = get_family(family_name)
    config = family.size(size)
    full = family.build(config, device="meta", dtype=dtype)
    full_bytes = _nbytes(full)
    pcfg = ParallelConfig(tp_size=tp, rank=0, backend="fake")
    model = family.build(config, device="meta", dtype=dtype)
    if tp > 1:
        family.parallel_plan().shard_model(model, pcfg, LocalFakeComm(pcfg))
    reduces = 1 + sum(1 for m in model.modules() if getattr(m, "tp_all_reduce", False)) if tp > 1 else 0
    gathers = 1 if tp > 1 else 0
    elt = torch.empty((), dtype=dtype).element_size()
    kv_elt = 4 if dtype == torch.float32 else elt
    hidden = config.hidden_size
    per = pcfg.padded_split(config.vocab_size)[2]
    ar = reduces * batch * hidden * elt
    ag = gathers * batch * per * elt
    ring = int(ar * 2 * (tp - 1) / tp + ag * (tp - 1)) if tp > 1 else 0
    return ParallelPlan(family=family.name, size=size, tp=tp, dtype=str(dtype).replace("torch.", ""),
                        weight_bytes=_nbytes(model), full_weight_bytes=full_bytes,
                        kv_bytes_per_token=family.kv_spec(model.config).values_per_token() * kv_elt,
                        all_reduces_per_step=reduces, all_gathers_per_step=gathers, decode_batch=batch,
                        all_reduce_bytes=ar, all_gather_bytes=ag, ring_bytes_sent=ring,
                        kv_spec=family.kv_spec(model.config), kv_elt=kv_elt)
