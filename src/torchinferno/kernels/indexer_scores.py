"""DeepSeek lightning-indexer scores (V4 CSA, V3.2 DSA) without materializing the [Q, Hi, S] logits.

``indexer_scores(q [..., Q, Hi, D], k [..., S, D], w [..., Q, Hi], scale, limits [..., Q] | None) -> [..., Q, S]``
fp32 (at most one leading batch dim):

    score[q, s] = sum_{h = 0..Hi-1} w[q, h] * (ReLU(q[q, h, :] . k[s, :]) * scale),   -inf where s >= limits[q]

:func:`reference` is the torch definition in ``Indexer.select``'s order of operations (V4: ``relu(q.k) * Di^-0.5``,
times ``w`` (already ``* Hi^-0.5``), sum over heads; V3.2 passes its scales folded into ``w`` and ``scale=1``, where
``relu * 1`` is exact and the product commutes). It materializes ``[Q, Hi, S]`` fp32 logits: 1 GB for a 4k-token
prefill over 1k compressed entries at 64 heads.

The Triton kernel (``kernels.triton.indexer_scores``, CUDA + Triton, fp32/fp16/bf16 with ``D <= 256``) writes only
``[Q, S]``: a program per (query tile, key tile) loops over the heads in order 0..Hi-1, one ``tl.dot`` each (fp32:
IEEE fp32, not TF32; fp16/bf16: exact products, fp32 accumulate: the reference's ``.float()`` before its einsum
gives the same products), ReLU, scale, weight, accumulate; with ``limits`` (causal visibility: key ``s`` visible to
query ``q`` iff ``s < limits[q]``) it writes -inf past them and skips key tiles past every limit of a query tile.

What differs from the reference (fp32 rounding only, ~1e-7 relative): the order of the dot's sum over ``D`` (the
MMA's, vs the reference's GEMM), and ``acc + r * w`` may be one fused multiply-add where the reference rounds the
product first; the reference sums heads with ``sum(dim=-2)`` (torch's reduction order, not guaranteed sequential).
Mixed q/k dtypes are promoted to fp32 (exact) first.

:func:`indexer_scores_paged`: the same over a paged key cache ``[N, page, D]`` through block tables (V3.2's decode
over its ``index_k`` cache): the kernel reads the rows in place; the reference gathers them first.

Invariant (both paths): a query's scores depend only on its own row, never on its tile or on Q or S, so chunked
prefill, prefix hits and the full pass select alike (bitwise on one device and path). Selection (top-k with the
earliest among ties, -inf never preferred) stays with the callers.
"""

from __future__ import annotations

import torch

from torchinferno.kernels import triton as _tri

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256  # the key tile [D, BLOCK_S] lives in registers


def reference(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, scale: float = 1.0,
              limits: torch.Tensor | None = None) -> torch.Tensor:
    """Torch oracle: q [..., Q, Hi, D], k [..., S, D], w [..., Q, Hi], limits [..., Q] -> [..., Q, S] fp32
    (materializes [..., Q, Hi, S])."""
    logits = torch.relu(torch.einsum("...qhd,...sd->...qhs", q.float(), k.float())) * scale
    scores = (logits * w.float()[..., None]).sum(dim=-2)
    if limits is not None:
        scores = scores.masked_fill(causal_invisible(limits, k.shape[-2]), float("-inf"))
    return scores


def causal_invisible(limits: torch.Tensor, n: int) -> torch.Tensor:
    """limits [..., Q] -> [..., Q, n] bool: True where key ``s >= limits[q]`` (not visible)."""
    return torch.arange(n, device=limits.device) >= limits[..., None]


def usable(q: torch.Tensor, k: torch.Tensor) -> bool:
    """The Triton kernel applies: Triton on q's device (not while tracing), float inputs, head dim <= 256."""
    return (_tri.usable(q) and q.dtype in _DTYPES and k.dtype in _DTYPES and q.shape[-1] == k.shape[-1]
            and q.shape[-1] <= MAX_HEAD_DIM and q.dim() in (3, 4) and q.dim() == k.dim() + 1)


def indexer_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, scale: float = 1.0,
                   limits: torch.Tensor | None = None, use_triton: bool = True,
                   config: dict | None = None) -> torch.Tensor:
    """See the module docstring. ``use_triton=False`` (or :func:`usable` says no) -> :func:`reference`.
    ``config``: the kernel's tiles (BLOCK_Q, BLOCK_S, num_warps, num_stages), its defaults when None; fixed per
    call site, never chosen from Q or S (the invariant)."""
    if not (use_triton and usable(q, k)):
        return reference(q, k, w, scale, limits)
    from torchinferno.kernels.triton import indexer_scores as kern

    if q.dtype != k.dtype:
        q, k = q.float(), k.float()
    batched = q.dim() == 4
    if not batched:
        q, k, w = q[None], k[None], w[None]
        limits = None if limits is None else limits[None]
    out = kern.indexer_scores(q, k, w, scale, limits, config)
    return out if batched else out[0]


def paged_usable(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """The Triton kernel reads ``k_cache`` [N, page, D] in place: :func:`usable`, one dtype, a row-flat cache."""
    return (q.dim() == 4 and k_cache.dim() == 3 and usable(q[0], k_cache[0]) and q.dtype == k_cache.dtype
            and k_cache.stride(-1) == 1 and k_cache.stride(0) == k_cache.shape[1] * k_cache.stride(1))


def indexer_scores_paged(q: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor, num_keys: int,
                         w: torch.Tensor, scale: float = 1.0, limits: torch.Tensor | None = None,
                         use_triton: bool = True, config: dict | None = None) -> torch.Tensor:
    """q [B, Q, Hi, D], k_cache [N, page, D], block_tables [B, nb] int, w [B, Q, Hi], limits [B, Q] | None ->
    [B, Q, num_keys] fp32: :func:`indexer_scores` over the first ``num_keys`` keys of each row's blocks (the same
    values, so the same scores as over ``gather_kv(k_cache, block_tables, num_keys)``). Triton reads the cache in
    place (no gathered copy; CUDA-graph capturable); otherwise the keys are gathered and :func:`reference` runs."""
    if use_triton and paged_usable(q, k_cache):
        from torchinferno.kernels.triton import indexer_scores as kern

        return kern.indexer_scores(q, k_cache, w, scale, limits, config, block_tables=block_tables, num_keys=num_keys)
    from torchinferno.models.common.attention import gather_kv

    return indexer_scores(q, gather_kv(k_cache, block_tables, num_keys), w, scale, limits, use_triton, config)
