"""Prefill-sized MoE experts through torch's grouped GEMM (``torch._grouped_mm``: CUTLASS on sm90, bf16).

The fused Triton path (``kernels.fused_moe``) gathers each row tile's tokens inside its GEMM. At prefill sizes
(thousands of pairs, hundreds per expert) a grouped GEMM over rows already sorted by expert can instead use the
library kernel, which loads its tiles with TMA. The steps (no host sync; CUDA-graph capturable):

    order  = pairs sorted by expert (stable)               # [P] pair ids, P = T * k
    ends   = each expert's end in that order               # [E] int32, the grouped GEMM's ``offs``
    h      = grouped_mm(x[order // k], gate_up^T, ends)     # [P, 2I], rows in expert order
    act    = silu(h[:, :I]) * h[:, I:]                     # [P, I]
    y      = grouped_mm(act, down^T, ends)                 # [P, D]
    out[t] = sum_j weights[t, j] * y[rank of pair t*k + j] (+ the shared MLP's row), fp32, rounded once

``y`` is rounded to x's dtype per pair before the weighted sum (the Triton path keeps fp32 per-pair rows), and
``h`` before the activation, as the unfused module path does. Only where :func:`applies`: bf16 on a GPU whose
grouped GEMM is the library kernel, every expert id in range (no expert parallelism), no V4 clamp, no shared
experts among the ids. Which token
counts take it is :class:`kernels.fused_moe.MoEPolicy`'s ``grouped_mm_min_tokens`` (measured, stored as data).

Contract: ``models.common.moe.grouped_expert_mlp`` (tests/kernels/test_grouped_mm_moe.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def available() -> bool:
    """torch has the grouped GEMM op (2.8+)."""
    return hasattr(torch, "_grouped_mm")


def applies(x: torch.Tensor, gate_up: torch.Tensor, limit: float | None, may_drop: bool, shared) -> bool:
    """The grouped-GEMM path can run these experts: bf16 x and weights on a CUDA device of compute capability 9.x
    or 10.x (CUTLASS grouped GEMM; elsewhere torch falls back to a loop), no clamp, no ids out of range, no shared
    experts among the ids (at prefill sizes they run as their own dense MLP anyway)."""
    return (available() and x.is_cuda and x.dtype == gate_up.dtype == torch.bfloat16 and limit is None
            and not may_drop and shared is None and torch.cuda.get_device_capability(x.device)[0] in (9, 10))


def sort_pairs(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, k] (every id in [0, E)) -> (order [P] int64: pair ids grouped by expert, ascending pair order within
    an expert; ends [E] int32: ``ends[e]`` = pairs of experts <= e, the grouped GEMM's ``offs``). No host sync."""
    flat = ids.reshape(-1)
    keys, order = torch.sort(flat, stable=True)
    bounds = torch.arange(1, num_experts + 1, device=ids.device, dtype=keys.dtype)
    return order, torch.searchsorted(keys, bounds).to(torch.int32)


def _swiglu(h: torch.Tensor) -> torch.Tensor:  # [R, 2I] -> [R, I]
    from torchinferno.kernels import triton as tri

    if tri.usable(h):
        from torchinferno.kernels.triton.activation import swiglu_activation

        return swiglu_activation(h)
    g, u = h.chunk(2, dim=-1)
    return F.silu(g) * u


def combine(y: torch.Tensor, order: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype,
            extra: torch.Tensor | None = None) -> torch.Tensor:
    """y [P, D] (row r = pair ``order[r]``), weights [T, k] -> out [T, D] in ``dtype``: ``sum_j weights[t, j] *
    y[row of pair t*k + j]`` in j order, plus ``extra [T, D]`` (if given), in fp32, rounded once."""
    T, k = weights.shape
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)  # pair -> its row of y
    from torchinferno.kernels import triton as tri

    if tri.usable(y):
        from torchinferno.kernels.triton.moe_combine import weighted_gather_sum

        out = torch.empty((T, y.shape[1]), dtype=dtype, device=y.device)
        return weighted_gather_sum(y, rank.view(T, k), weights.float().contiguous(), out, extra)
    acc = (y[rank].view(T, k, -1).float() * weights.float()[..., None]).sum(1)
    if extra is not None:
        acc = acc + extra.float()
    return acc.to(dtype)


def grouped_mm_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                       down: torch.Tensor) -> torch.Tensor:
    """x [T, D], ids / weights [T, k] (every id in [0, E)), gate_up [E, 2I, D], down [E, D, I] -> [T, D] in
    x.dtype: the SwiGLU experts as ``kernels.fused_moe.fused_experts`` computes them (see the module docstring for
    the roundings)."""
    T, k = ids.shape
    E = gate_up.shape[0]
    order, ends = sort_pairs(ids, E)
    a = x.index_select(0, torch.div(order, k, rounding_mode="floor"))  # [P, D], rows in expert order
    h = torch._grouped_mm(a, gate_up.transpose(1, 2), offs=ends)  # [P, 2I]
    y = torch._grouped_mm(_swiglu(h), down.transpose(1, 2), offs=ends)  # [P, D]
    return combine(y, order, weights, x.dtype)
