"""Batch-invariant execution: a request's numbers do not depend on what else is in its batch.

Plain batched kernels pick their algorithm (blocking, reduction order, masked or unmasked attention) from
the batch they see, so one request's greedy tokens and logprobs in bf16 change with the other requests of
the step (measured: SmolLM2 bf16 on CPU, one prompt alone vs with 8 others: logprobs differ by up to 1.75).
``make_batch_invariant(model)`` is a runtime transformation that removes every such dependence it knows:

* linears: row tiles of a fixed shape (``ROW_TILE`` rows, zero-padded), so every call of the underlying GEMM
  has the same shape whatever the batch, and a row's result depends only on that row. Kernels that already
  compute each row on its own (our AVX512-BF16 GEMV) are left alone;
* routed experts: the same row tiles inside the grouped expert loop;
* attention: decode attends one sequence at a time (no padding mask, the path a lone request takes), and
  prefill always takes the masked path over the cached context, so a prompt split into chunks by a busy
  step gets the numbers it gets whole;
* the lean CPU decode step (a batch-dependent fast path) is dropped.

Invariant: after the transformation, a request's hidden states, logits and sampled tokens are bitwise the
same alone or in any batch (tested for every family on CPU). It costs speed (RESULTS.md); it is opt-in
(``--batch-invariant``). CUDA is refused for now: cuBLAS and the split-K decode attention need their own
batch-invariant kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ROW_TILE", "BatchInvariantLinear", "tiled_linear", "make_batch_invariant"]

ROW_TILE = 16


def _tiles(x2: torch.Tensor, fn, tile: int) -> torch.Tensor:
    """``fn`` over fixed [tile, K] row blocks of x2 [M, K] (zero-padded), concatenated back to [M, N]."""
    m = x2.shape[0]
    pad = (-m) % tile
    if pad:
        x2 = torch.cat((x2, x2.new_zeros(pad, x2.shape[1])))
    return torch.cat([fn(x2[i:i + tile]) for i in range(0, x2.shape[0], tile)])[:m]


def tiled_linear(x: torch.Tensor, weight: torch.Tensor, tile: int | None, bias: torch.Tensor | None = None):
    """``F.linear`` (x [M, K], weight [N, K]) computed on fixed row tiles when ``tile`` is set."""
    if tile is None:
        return F.linear(x, weight, bias)
    return _tiles(x, lambda t: F.linear(t, weight, bias), tile)


class BatchInvariantLinear(nn.Module):
    """Wraps any linear-like module (x [..., K] -> [..., N]); runs it on fixed row tiles (module docstring)."""

    def __init__(self, inner: nn.Module, tile: int = ROW_TILE):
        super().__init__()
        self.inner, self.tile = inner, tile

    @property
    def weight(self):  # owners that read .weight keep working
        return self.inner.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = _tiles(x.reshape(-1, shape[-1]), self.inner, self.tile)
        return y.view(*shape[:-1], y.shape[-1])


class _TiedHead(nn.Module):
    """The logits projection of a model whose head is its embedding matrix: hidden [N, D] -> [N, V]."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.embed = model.model.embed_tokens

    def forward(self, x):
        return F.linear(x, self.embed.weight)


def _row_invariant(module: nn.Module) -> bool:
    """Kernels that compute every row on its own, with one reduction order whatever M is."""
    return getattr(module, "kernel", None) == "avx512bf16"


def make_batch_invariant(model: nn.Module, tile: int = ROW_TILE) -> dict:
    """Apply the transformation in place (module docstring); returns what changed, by kind.

    Raises ``ConfigError`` on CUDA. Idempotent."""
    from torchinferno.errors import ConfigError
    from torchinferno.kernels.cpu_linear import PackedLinear

    p = next(model.parameters(), None)
    if p is not None and p.device.type != "cpu":
        raise ConfigError("--batch-invariant runs on CPU only for now (valid device: cpu); on CUDA cuBLAS and the "
                          "split-K decode attention need batch-invariant kernels first")
    changed = {"linears": 0, "experts": 0, "attention": 0}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, BatchInvariantLinear):
                continue
            if (type(child) is nn.Linear or isinstance(child, PackedLinear)) and not _row_invariant(child):
                setattr(parent, name, BatchInvariantLinear(child, tile))
                changed["linears"] += 1
    for m in model.modules():
        if hasattr(m, "row_tile"):
            m.row_tile = tile
            changed["experts"] += 1
        if hasattr(m, "batch_invariant"):
            m.batch_invariant = True
            changed["attention"] += 1
    head = getattr(model, "packed_head", None)
    if head is None and getattr(model, "lm_head", 1) is None and hasattr(model, "head_weight"):
        head = _TiedHead(model)  # a head tied to the embedding is no module: give it one in the runtime slot
    if head is not None and not _row_invariant(head) and not isinstance(head, BatchInvariantLinear):
        model.packed_head = BatchInvariantLinear(head, tile)
        changed["linears"] += 1
    model.batch_invariant = True  # runners then keep the module path (no lean decode step: models/common/step_model)
    return changed
