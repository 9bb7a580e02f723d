"""MLA prefill (the non-absorbed form) through a flash-attention-class kernel on CUDA.

The expanded form attends per head with ``qk`` head dim ``dn + r`` (192 at DeepSeek's shape) and value head dim
``dv`` (128). torch's flash backend needs one head dim for q, k and v, so the values are zero-padded to ``dn + r``:
the extra output columns are exactly 0 and are dropped. With no mask (a prompt with no cached context: plain
causal) SDPA then takes its flash / memory-efficient kernel with ``is_causal``: no ``[T, T]`` score or mask tensor
is ever materialized (the reference ``models.common.mla.mla_expanded_attention`` takes the math path there, which
does). Masked calls (chunked prefill over a cached context, DSA's top-k selection) and non-CUDA tensors are the
reference itself.

Contract: ``models.common.mla.mla_expanded_attention`` (tests/kernels/test_mla_prefill.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torchinferno.models.common.mla import mla_expanded_attention as reference


def expanded_attention(
    q_nope: torch.Tensor,  # [Q, H, dn]
    q_pe: torch.Tensor,  # [Q, H, r] (rope applied)
    latent: torch.Tensor,  # [S, R + r]
    w_kv_b: torch.Tensor,  # [H*(dn+dv), R]
    scale: float,
    mask: torch.Tensor | None,  # [Q, S] bool or None (plain causal, Q == S)
    pad_v: bool | None = None,  # None: on CUDA in fp16/bf16 (where the flash kernel applies)
) -> torch.Tensor:  # [Q, H, dv]
    """:func:`models.common.mla.mla_expanded_attention` with values padded to the qk head dim when ``mask`` is None
    (the flash-eligible case), else the reference."""
    if pad_v is None:
        pad_v = q_nope.is_cuda and q_nope.dtype in (torch.float16, torch.bfloat16)
    if mask is not None or not pad_v:
        return reference(q_nope, q_pe, latent, w_kv_b, scale, mask)
    _, H, dn = q_nope.shape
    r = q_pe.shape[-1]
    S = latent.shape[0]
    c_kv, k_pe = latent.split([latent.shape[-1] - r, r], dim=-1)
    kv = F.linear(c_kv, w_kv_b).view(S, H, -1)  # [S, H, dn + dv]
    dv = kv.shape[-1] - dn
    d = dn + r
    if dv > d:  # values wider than the qk dim: no padding helps; the reference
        return reference(q_nope, q_pe, latent, w_kv_b, scale, mask)
    k = torch.empty((S, H, d), dtype=kv.dtype, device=kv.device)
    k[..., :dn] = kv[..., :dn]
    k[..., dn:] = k_pe[:, None, :]
    v = F.pad(kv[..., dn:], (0, d - dv))  # [S, H, d], zeros past dv
    q = torch.cat([q_nope, q_pe.to(q_nope.dtype)], dim=-1)  # [Q, H, d]
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       is_causal=True, scale=scale)  # [1, H, Q, d]
    return o[0, :, :, :dv].transpose(0, 1)  # [Q, H, dv]
