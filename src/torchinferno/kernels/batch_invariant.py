"""Batch-invariant execution: a request's numbers do not depend on what else is in its batch.

Plain batched kernels pick their algorithm (blocking, reduction order, masked or unmasked attention) from
the batch they see, so one request's greedy tokens and logprobs in bf16 change with the other requests of
the step (measured: SmolLM2 bf16 on CPU, one prompt alone vs with 8 others: logprobs differ by up to 1.75).
``make_batch_invariant(model)`` is a runtime transformation that removes every such dependence it knows:

* linears: row tiles of a fixed shape (``ROW_TILE`` rows, zero-padded), so every call of the underlying GEMM
  has the same shape whatever the batch, and a row's result depends only on that row. Kernels that already
  compute each row on its own (our AVX512-BF16 GEMV) are left alone;
* routed experts: the same row tiles inside the grouped expert loop;
* routers: the fp32 router GEMM on the same row tiles (``row_tile`` on the router module);
* RMSNorm: on the same row tiles (the torch reference norm is a row reduction whose CUDA thread split
  follows the number of rows; the Triton norm is one program per row and is tiled all the same);
* attention: decode attends one sequence at a time (no padding mask, the path a lone request takes), also
  for the one-token rows of a batch that mixes decodes with prompts; prefill is per sequence (whole prompt);
  on CUDA the Triton backend (split-K decode whose tiling follows the batch, varlen prefill) is bypassed for
  the torch per-sequence path (SDPA on a fixed-shape [1, H, q, D] call per sequence);
* the lean decode steps (CPU GEMV step, fused batch-1 CUDA step) are dropped, and CUDA graphs are off
  (``EngineConfig`` sets ``enforce_eager``): a graph bucket pads the batch, which would change M.

On CUDA each row tile is one cuBLAS call of the same shape on a freshly allocated (aligned) buffer, so the
algorithm cuBLAS picks, and its reduction order, are the same for a row whatever the batch. Norms and
activations use the Triton kernels there (one program per row); sampling and log-softmax are per row.

Invariant: after the transformation, a request's hidden states, logits and sampled tokens are bitwise the
same alone or in any batch (tested for every family on CPU). It costs speed (RESULTS.md); it is opt-in
(``--batch-invariant``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ROW_TILE", "BatchInvariantLinear", "tiled_linear", "tiled_rows", "make_batch_invariant"]

ROW_TILE = 16


def _tiles(x2: torch.Tensor, fn, tile: int) -> torch.Tensor:
    """``fn`` over fixed [tile, K] row blocks of x2 [M, K] (zero-padded), concatenated back to [M, N]."""
    m = x2.shape[0]
    pad = (-m) % tile
    if x2.device.type == "cuda":
        # A fresh buffer: every tile then starts at the same alignment (cuBLAS heuristics read pointer alignment).
        buf = x2.new_zeros(m + pad, x2.shape[1])
        buf[:m] = x2
        x2 = buf
    elif pad:
        x2 = torch.cat((x2, x2.new_zeros(pad, x2.shape[1])))
    return torch.cat([fn(x2[i:i + tile]) for i in range(0, x2.shape[0], tile)])[:m]


def tiled_rows(fn, tile: int, *xs: torch.Tensor):
    """``fn(*xs)`` for a row-wise ``fn`` (xs [..., D_i] sharing leading dims; returns a tensor or a tuple of
    [..., N_j]) computed on fixed [tile, D_i] row blocks, so a row's result does not depend on how many rows
    there are (a torch row reduction picks its thread split from the number of rows)."""
    lead = xs[0].shape[:-1]
    flat = [x.reshape(-1, x.shape[-1]) for x in xs]
    m = flat[0].shape[0]
    pad = (-m) % tile
    padded = []
    for x in flat:
        buf = x.new_zeros(m + pad, x.shape[1])  # fresh, so every tile has the same alignment
        buf[:m] = x
        padded.append(buf)
    outs = [fn(*(p[i:i + tile] for p in padded)) for i in range(0, m + pad, tile)]
    if isinstance(outs[0], torch.Tensor):
        y = torch.cat(outs)[:m]
        return y.view(*lead, y.shape[-1])
    cols = [torch.cat(col)[:m] for col in zip(*outs)]
    return tuple(y.view(*lead, y.shape[-1]) for y in cols)


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

    Idempotent. CPU and CUDA alike (the engine also turns CUDA graphs off: ``EngineConfig.enforce_eager``)."""
    from torchinferno.kernels.cpu_linear import PackedLinear

    changed = {"linears": 0, "row_tiled": 0, "attention": 0}
    for parent in list(model.modules()):
        if isinstance(parent, BatchInvariantLinear):
            continue  # its inner linear is wrapped already
        for name, child in list(parent.named_children()):
            if isinstance(child, BatchInvariantLinear):
                continue
            if (type(child) is nn.Linear or isinstance(child, PackedLinear)) and not _row_invariant(child):
                setattr(parent, name, BatchInvariantLinear(child, tile))
                changed["linears"] += 1
    for m in model.modules():
        if hasattr(m, "row_tile"):
            m.row_tile = tile  # experts, routers, norms
            changed["row_tiled"] += 1
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
