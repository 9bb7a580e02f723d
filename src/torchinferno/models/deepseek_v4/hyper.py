"""Manifold-constrained hyper-connections (mHC): the DeepSeek-V4 residual path.

The residual is ``hc_mult`` parallel streams ``x [T, n, D]`` (the embedding copied into each). Around every
attention / FFN block a :class:`HyperConnection` computes, from the RMS-normalized flattened streams (fp32):
``pre [T, n]`` (sigmoid + eps), ``post [T, n]`` (2 * sigmoid) and ``comb [T, n, n]`` (softmax + eps, then
Sinkhorn row/column normalization for ``hc_sinkhorn_iters``). Block input = ``sum_j pre_j * x_j``; new streams
``x'_k = post_k * block_out + sum_j comb[j, k] * x_j``. :class:`HyperHead` collapses the streams (sigmoid mix)
before the final norm. Parameters are fp32 (kept so in a bf16 model), named as transformers names them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torchinferno.models.common.module_utils import KeepFP32


def unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., K] -> x * rsqrt(mean(x^2) + eps) (no weight; the rsqrt in fp32, cast to x.dtype)."""
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """comb [..., n, n] positive -> approximately doubly stochastic (columns first, then rows/columns alternately)."""
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


class HyperConnection(KeepFP32, nn.Module):
    """``forward(x [T, n, D]) -> (post [T, n], comb [T, n, n], collapsed [T, D])``; :meth:`expand` mixes back."""

    def __init__(self, n: int, hidden: int, iters: int, hc_eps: float, norm_eps: float):
        super().__init__()
        self.n, self.iters, self.hc_eps, self.norm_eps = n, iters, hc_eps, norm_eps
        width = (2 + n) * n
        self.fn = nn.Parameter(torch.empty(width, n * hidden, dtype=torch.float32))
        self.base = nn.Parameter(torch.zeros(width, dtype=torch.float32))
        self.scale = nn.Parameter(torch.ones(3, dtype=torch.float32))
        nn.init.normal_(self.fn, std=0.02)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = self.n
        flat = unweighted_rms_norm(x.reshape(x.shape[0], -1).float(), self.norm_eps)  # [T, n*D] fp32
        mixes = F.linear(flat, self.fn.float())  # [T, (2+n)*n]
        pre_w, post_w, comb_w = mixes.split([n, n, n * n], dim=-1)
        pre_b, post_b, comb_b = self.base.split([n, n, n * n])
        s_pre, s_post, s_comb = self.scale.unbind(0)
        pre = torch.sigmoid(pre_w * s_pre + pre_b) + self.hc_eps
        post = 2 * torch.sigmoid(post_w * s_post + post_b)
        comb = torch.softmax(comb_w.view(-1, n, n) * s_comb + comb_b.view(n, n), dim=-1) + self.hc_eps
        comb = sinkhorn(comb, self.iters, self.hc_eps)
        collapsed = (pre.unsqueeze(-1) * x).sum(dim=1).to(x.dtype)
        return post, comb, collapsed

    @staticmethod
    def expand(x: torch.Tensor, out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
        """x [T, n, D], block out [T, D] -> new streams [T, n, D] = post * out + comb^T @ x."""
        dt = x.dtype
        return post.to(dt).unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.to(dt).transpose(-1, -2), x)


class HyperHead(KeepFP32, nn.Module):
    """x [T, n, D] -> [T, D]: sigmoid-weighted sum of the streams (``hc_fn``, ``hc_base``, ``hc_scale``)."""

    def __init__(self, n: int, hidden: int, hc_eps: float, norm_eps: float):
        super().__init__()
        self.hc_eps, self.norm_eps = hc_eps, norm_eps
        self.hc_fn = nn.Parameter(torch.empty(n, n * hidden, dtype=torch.float32))
        self.hc_base = nn.Parameter(torch.zeros(n, dtype=torch.float32))
        self.hc_scale = nn.Parameter(torch.ones(1, dtype=torch.float32))
        nn.init.normal_(self.hc_fn, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = unweighted_rms_norm(x.reshape(x.shape[0], -1).float(), self.norm_eps)
        pre = torch.sigmoid(F.linear(flat, self.hc_fn.float()) * self.hc_scale.float() + self.hc_base.float()) + self.hc_eps
        return (pre.unsqueeze(-1) * x).sum(dim=1).to(x.dtype)
