"""The collectives a sharded model runs, over one ``torch.distributed`` process group.

:class:`Comm` holds the group (``None``: the default group) and the world facts; it keeps no other state
than a tally of the collectives it issued (count and bytes per kind, for ``plan-parallel`` and tests).
A world of one runs nothing: every call returns its input. The same code runs on gloo (CPU), NCCL
(CUDA; the all-reduce is a graph-capturable kernel launch) and the fake backend (``runtime.fake_dist``).
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist

from torchinferno.parallel.config import ParallelConfig


class Comm:
    """Collectives of one tensor-parallel group. ``pcfg`` says the world size and this rank."""

    def __init__(self, pcfg: ParallelConfig, group: dist.ProcessGroup | None = None):
        self.pcfg = pcfg
        self.group = group
        self.calls: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()

    @property
    def world_size(self) -> int:
        return self.pcfg.tp_size

    @property
    def rank(self) -> int:
        return self.pcfg.rank

    def _tally(self, kind: str, t: torch.Tensor) -> None:
        self.calls[kind] += 1
        self.bytes[kind] += t.numel() * t.element_size()

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of ``x`` over the ranks (every rank gets the same tensor); in place when ``x`` is contiguous."""
        if self.world_size == 1:
            return x
        x = x.contiguous()
        self._tally("all_reduce", x)
        if x.device.type != "meta":
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., n]`` of every rank concatenated in rank order along the last dim -> ``[..., world * n]``."""
        if self.world_size == 1:
            return x
        x = x.contiguous()
        self._tally("all_gather", x)
        if x.device.type == "meta":
            return torch.cat([x] * self.world_size, dim=-1)
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=-1)

    def broadcast_object(self, obj, src: int = 0):
        """Rank ``src``'s picklable ``obj`` on every rank."""
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self.group)

    def reset_tally(self) -> None:
        self.calls.clear()
        self.bytes.clear()
