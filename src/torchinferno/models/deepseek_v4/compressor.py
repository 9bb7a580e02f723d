"""Compressed KV of DeepSeek-V4's CSA / HCA layers, and CSA's lightning indexer (per-sequence, stateless).

Every ``rate`` source tokens close one window; window ``w`` (tokens ``w*rate .. w*rate+rate-1``) yields one
compressed entry, rope'd (``compress`` table, interleaved, trailing dims) at position ``w * rate``. Entry ``w``
is visible to the query at position ``t`` iff ``w < (t + 1) // rate``; a partial window yields nothing yet.

* HCA (``overlap=False``): entry = ``kv_norm(sum_i softmax_i(gate_i + bias_i) * kv_i)`` over its window
  (softmax per channel, over the window's slots).
* CSA (``overlap=True``): projections are ``2 * d`` wide: ``Ca = [..., :d]``, ``Cb = [..., d:]``; entry ``w``
  pools window ``w-1``'s Ca slots and window ``w``'s Cb slots (``2 * rate`` slots; window 0 only its Cb).

The cache keeps every token's raw projections and, at the slot of the token that closes window ``w``, its entry;
a forward pools only the windows that close in it (from cached raw rows), so chunked prefill, prefix hits and
preemption give exactly the entries of the full pass.
"""

from __future__ import annotations

import torch
from torch import nn

from torchinferno.kernels.indexer_scores import indexer_scores
from torchinferno.models.common.module_utils import KeepFP32, KeepFP32Tensors
from torchinferno.models.common.rope import apply_rope_interleaved


class V4RMSNorm(KeepFP32, nn.Module):
    """RMSNorm with an fp32 weight, multiplied in fp32 and cast once (as transformers' DeepseekV4RMSNorm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.float32))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * xf).to(x.dtype)


def rope_tail(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, D]: interleaved rope on the trailing ``2 * cos.shape[-1]`` dims (cos/sin [N, r/2]); rest untouched."""
    r = 2 * cos.shape[-1]
    # transformers hands cos/sin over in the activation dtype (rounded in bf16), then rotates in fp32
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x[..., :-r], apply_rope_interleaved(x[..., -r:], cos, sin)], dim=-1)


def pool_windows(kv: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, rate: int, overlap: bool) -> torch.Tensor:
    """kv, gate [S, c*d] (S a multiple of ``rate``; c = 2 with overlap), bias [rate, c*d] -> pooled [S // rate, d]."""
    n = kv.shape[0] // rate
    kv = kv.reshape(n, rate, -1)
    gate = gate.reshape(n, rate, -1) + bias  # fp32 (bias is fp32)
    if overlap:
        d = kv.shape[-1] // 2
        new_kv = kv.new_zeros((n, 2 * rate, d))
        new_gate = gate.new_full((n, 2 * rate, d), float("-inf"))
        new_kv[:, rate:], new_gate[:, rate:] = kv[..., d:], gate[..., d:]
        if n > 1:
            new_kv[1:, :rate], new_gate[1:, :rate] = kv[:-1, :, :d], gate[:-1, :, :d]
        kv, gate = new_kv, new_gate
    w = gate.softmax(dim=1, dtype=torch.float32).to(kv.dtype)
    return (kv * w).sum(dim=1)


class _Pooler(KeepFP32Tensors, nn.Module):
    """Shared parts of the compressor and the indexer's compressor: kv/gate projections, position bias (kept fp32),
    norm."""

    fp32_tensors = ("position_bias",)

    def __init__(self, hidden: int, dim: int, rate: int, overlap: bool, eps: float):
        super().__init__()
        c = 2 if overlap else 1
        self.rate, self.overlap, self.dim = rate, overlap, dim
        self.kv_proj = nn.Linear(hidden, c * dim, bias=False)
        self.gate_proj = nn.Linear(hidden, c * dim, bias=False)
        self.position_bias = nn.Parameter(torch.zeros(rate, c * dim, dtype=torch.float32))
        self.kv_norm = V4RMSNorm(dim, eps)

    def project(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [T, D] -> (kv [T, c*d], gate [T, c*d]): what the cache keeps per token."""
        return self.kv_proj(h), self.gate_proj(h)

    def entries(self, kv: torch.Tensor, gate: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                first: int = 0) -> torch.Tensor:
        """Per-token kv/gate [S, c*d] of one sequence starting at window ``first`` (position ``first * rate``);
        cos/sin the full ``compress`` tables [max_pos, r/2] -> entries [S // rate, d] of every closed window,
        window ``first + i`` rope'd at ``(first + i) * rate``. With overlap, entry ``first`` pools only its own
        Cb slots: callers that need it exact start one window earlier and drop that entry."""
        n = kv.shape[0] // self.rate
        if n == 0:
            return kv.new_zeros((0, self.dim))
        pooled = self.kv_norm(pool_windows(kv[: n * self.rate], gate[: n * self.rate].float(), self.position_bias,
                                           self.rate, self.overlap))
        pos = (first + torch.arange(n, device=kv.device)) * self.rate
        return rope_tail(pooled[:, None], cos[pos], sin[pos])[:, 0]


def visible_entries(positions: torch.Tensor, n: int, rate: int) -> torch.Tensor:
    """[Q, n] bool: entry w is visible to the query at ``positions[q]`` iff ``w < (pos + 1) // rate``."""
    return torch.arange(n, device=positions.device)[None, :] < ((positions + 1) // rate)[:, None]


class IndexerScorer(nn.Module):
    def __init__(self, hidden: int, n_heads: int):
        super().__init__()
        self.weights_proj = nn.Linear(hidden, n_heads, bias=False)


class Indexer(_Pooler):
    """Lightning indexer of CSA: its own overlapping compressor at ``index_head_dim`` and top-k selection.

    ``score[q, w] = sum_h (weights_proj(h_q)_h * Hi^-0.5) * ReLU(q_h . K_w) * Di^-0.5``; each query keeps the
    ``index_topk`` highest-scoring *visible* entries (all of them when fewer are visible; the earliest among ties).
    ``score_kernel`` (set by the attention layer from its ops module): the scores through
    ``kernels.indexer_scores`` (Triton on CUDA: no [Q, Hi, n] logits; its torch reference elsewhere).
    """

    def __init__(self, hidden: int, q_lora_rank: int, n_heads: int, head_dim: int, topk: int, rate: int, eps: float):
        super().__init__(hidden, head_dim, rate, True, eps)
        self.n_heads, self.topk = n_heads, topk
        self.q_b_proj = nn.Linear(q_lora_rank, n_heads * head_dim, bias=False)
        self.scorer = IndexerScorer(hidden, n_heads)
        self.score_kernel = False

    def scores(self, q: torch.Tensor, keys: torch.Tensor, w: torch.Tensor, visible: torch.Tensor,
               limits: torch.Tensor | None = None) -> torch.Tensor:
        """q [..., Q, Hi, Di] (rope'd), keys [..., n, Di], w [..., Q, Hi] (fp32, * Hi^-0.5), visible [..., Q, n]
        -> [..., Q, n] fp32, -inf where not visible. ``limits`` [..., Q] (optional, only with ``score_kernel``):
        the caller's promise that ``visible == arange(n) < limits[..., None]``, so the kernel masks by position."""
        if self.score_kernel:
            s = indexer_scores(q, keys, w, self.dim**-0.5, limits)
            return s if limits is not None else s.masked_fill(~visible, float("-inf"))
        scores = torch.relu(torch.einsum("...qhd,...nd->...qhn", q.float(), keys.float())) * self.dim**-0.5
        return (scores * w[..., None]).sum(dim=-2).masked_fill(~visible, float("-inf"))

    def select(self, h: torch.Tensor, q_res: torch.Tensor, cos_q: torch.Tensor, sin_q: torch.Tensor,
               keys: torch.Tensor, visible: torch.Tensor, limits: torch.Tensor | None = None) -> torch.Tensor:
        """h [Q, D], q_res [Q, q_lora], cos/sin_q [Q, r/2], keys [n, Di], visible [Q, n] -> keep-mask [Q, n].
        ``limits`` [Q]: optional, see :meth:`scores`."""
        Q, n = visible.shape
        if n == 0:
            return visible
        if self.topk >= n:
            return visible
        q = rope_tail(self.q_b_proj(q_res).view(Q, self.n_heads, self.dim), cos_q, sin_q)
        w = self.scorer.weights_proj(h).float() * self.n_heads**-0.5  # [Q, Hi]
        scores = self.scores(q, keys, w, visible, limits)  # [Q, n]
        # A stable sort keeps the earliest entry among equal scores (ReLU makes exact ties at 0 real), so a
        # chunked pass, a prefix hit and the full pass select alike; transformers' topk agrees when untied.
        idx = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, : self.topk]
        keep = torch.zeros_like(visible).scatter_(1, idx, True)
        return keep & visible


class Compressor(_Pooler):
    """CSA (``overlap=True``, with an :class:`Indexer`) or HCA compressor of one attention layer."""

    def __init__(self, cfg, layer_type: str):
        from torchinferno.models.deepseek_v4.config import CSA

        csa = layer_type == CSA
        rate = cfg.compress_rate(layer_type)
        super().__init__(cfg.hidden_size, cfg.head_dim, rate, csa, cfg.rms_norm_eps)
        self.indexer = Indexer(cfg.hidden_size, cfg.q_lora_rank, cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk,
                               rate, cfg.rms_norm_eps) if csa else None
