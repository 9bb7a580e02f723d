"""Parallel building blocks a sharding plan puts into a model built on ``meta``.

Column-parallel linears need no module of their own: a rank's share of the output features is a plain
``nn.Linear`` with fewer rows (so runtime linear swaps still apply to it). A row-parallel block (attention
``o_proj``, MLP ``down_proj``, a whole MoE) computes a partial sum on each rank; :func:`add_all_reduce`
hooks the all-reduce onto the block's output, so the linears inside may be swapped freely.

Parameter names equal the unsharded module's, so a family's ``load_weights`` fills a sharded model from
sharded tensors unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torchinferno.models.common.layers import RoutedExperts
from torchinferno.parallel.comm import Comm


def add_all_reduce(module: nn.Module, comm: Comm) -> None:
    """After ``module`` runs, its output (a partial sum on each rank) becomes the sum over ranks."""
    if comm.world_size == 1:
        return
    module.register_forward_hook(lambda _m, _args, out: comm.all_reduce(out))
    module.tp_all_reduce = True  # marks the block for tools (plan-parallel, tests)


class VocabParallelEmbedding(nn.Embedding):
    """Rows ``[start, start + count)`` of the vocabulary (padded to ``per`` rows): ``ids [T] -> [T, D]``.

    Each rank looks up the ids it holds (zeros for the rest) and the all-reduce sums the ranks: exactly
    one rank contributes each row."""

    def __init__(self, vocab_size: int, dim: int, start: int, per: int, comm: Comm):
        super().__init__(per, dim)
        self.full_vocab_size, self.start, self.comm = vocab_size, start, comm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        inside = (local >= 0) & (local < self.num_embeddings)
        out = F.embedding(local.clamp(0, self.num_embeddings - 1), self.weight)  # [T, D]
        out = out * inside[:, None].to(out.dtype)
        return self.comm.all_reduce(out)


class ParallelLMHead(nn.Module):
    """``hidden [N, D] -> logits [N, V]``: each rank's ``[N, per]`` slice, all-gathered and cut to ``V``.

    ``weight`` is this rank's ``[per, D]`` rows: its own parameter, or with ``tied`` the embedding's (read at
    every call and not registered here: a module move must not split one shared tensor into two), so every
    rank ends with the same full logits and samples the same token."""

    def __init__(self, vocab_size: int, comm: Comm, weight: nn.Parameter | None = None,
                 tied: nn.Embedding | None = None):
        super().__init__()
        if (weight is None) == (tied is None):
            raise ValueError("give exactly one of weight or tied")
        if weight is not None:
            self.weight = weight
        self._tied = (tied,) if tied is not None else ()  # a tuple: not a registered submodule
        self.vocab_size, self.comm = vocab_size, comm

    def head_weight(self) -> torch.Tensor:
        return self._tied[0].weight if self._tied else self.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        local = F.linear(hidden, self.head_weight())  # [N, per]
        return self.comm.all_gather_last(local)[..., : self.vocab_size]


class ExpertParallelExperts(RoutedExperts):
    """This rank's experts ``[start, start + count)`` of the routed set (expert parallelism).

    The router runs unsharded on every rank, so the choice of experts is identical everywhere; this rank
    computes only the (token, expert) pairs routed to its experts, one pair per row, and the MoE block's
    all-reduce adds the ranks' partial sums. Under fake tensors (tracing) the pair count is unknown: every
    pair runs, those of other ranks' experts with weight 0. On CUDA the fused MoE takes all pairs with the other
    ranks' expert ids set to -1 (dropped on the device, no host sync)."""

    def __init__(self, start: int, count: int, hidden: int, inter: int, ops):
        super().__init__(count, hidden, inter, ops)
        self.start, self.count = start, count

    def forward(self, x, ids, weights):  # x [T, D], ids / weights [T, K] -> [T, D]
        local = ids - self.start
        mine = (local >= 0) & (local < self.count)
        from torchinferno.models.common.moe import _is_fake

        if _is_fake(x):
            return super().forward(x, local.clamp(0, self.count - 1), weights * mine.to(weights.dtype))
        from torchinferno.kernels import fused_moe

        if self.moe_backend == "auto" and self.row_tile is None and fused_moe.usable(x, self.gate_up_proj):
            # CUDA: the fused MoE drops the other ranks' pairs (id -1) on the device: no host sync
            return fused_moe.fused_experts(x, torch.where(mine, local, -1), weights, self.gate_up_proj, self.down_proj,
                                           may_drop=True)
        t, k = mine.nonzero(as_tuple=True)  # this rank's pairs
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        if t.numel():
            y = super().forward(x[t], local[t, k][:, None], weights[t, k][:, None])  # [P, D], one pair per row
            out.index_add_(0, t, y.float())
        return out.to(x.dtype)
