"""MLA prefill (the non-absorbed form) through a flash-attention-class kernel on CUDA.

The expanded form attends per head with ``qk`` head dim ``dn + r`` (192 at DeepSeek's shape) and value head dim
``dv`` (128). torch's flash backend needs one head dim for q, k and v, so the values are zero-padded to ``dn + r``:
the extra output columns are exactly 0 and are dropped. With no mask (a prompt with no cached context: plain
causal) SDPA then takes its flash / memory-efficient kernel with ``is_causal``: no ``[T, T]`` score or mask tensor
is ever materialized (the reference ``models.common.mla.mla_expanded_attention`` takes the math path there, which
does). A chunk of a prompt over a cached context (``context_len > 0``, no mask tensor: query ``j`` sees keys
``0 .. context_len + j``) takes the same kernel with a lower-right causal bias (``causal_lower_right``: flash's own
causal rule when ``Q < S``), again with no ``[Q, S]`` mask. Masked calls (DSA's top-k selection) and non-CUDA
tensors are the reference itself (a context chunk builds its boolean mask there).

``PREFILL_KERNEL``: "auto" (the default) runs the unmasked case on CUDA through
``kernels.triton.mla_prefill_attention``, the same attention read in place (no q / k / v assembly copies, no padded
values), and the padded SDPA call elsewhere; "triton" takes the kernel on any device (Triton's CPU interpreter in
tests); "sdpa" always keeps the padded SDPA call. H100 (session 25, 2048 tokens, V2-Lite heads): 106 us a layer
in place against 132 us through padded flash.

Contract: ``models.common.mla.mla_expanded_attention`` (tests/kernels/test_mla_prefill.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torchinferno.models.common.mla import mla_expanded_attention as reference

PREFILL_KERNEL = "auto"  # or "triton" / "sdpa" (module docstring); benchmarks A/B it


def expanded_attention(
    q_nope: torch.Tensor,  # [Q, H, dn]
    q_pe: torch.Tensor,  # [Q, H, r] (rope applied)
    latent: torch.Tensor,  # [S, R + r]
    w_kv_b: torch.Tensor,  # [H*(dn+dv), R]
    scale: float,
    mask: torch.Tensor | None,  # [Q, S] bool or None (causal: Q == S, or the last Q of S with context_len)
    pad_v: bool | None = None,  # None: on CUDA in fp16/bf16 (where the flash kernel applies)
    context_len: int = 0,  # with mask None: S = context_len + Q, query j at position context_len + j
) -> torch.Tensor:  # [Q, H, dv]
    """:func:`models.common.mla.mla_expanded_attention` with values padded to the qk head dim when ``mask`` is None
    (the flash-eligible case; lower-right causal over ``context_len`` cached keys), else the reference."""
    Q, H, dn = q_nope.shape
    S = latent.shape[0]
    if mask is None and context_len:
        assert context_len + Q == S, f"context {context_len} + {Q} queries != {S} keys"
    if pad_v is None:
        pad_v = q_nope.is_cuda and q_nope.dtype in (torch.float16, torch.bfloat16)
    if mask is not None or not pad_v:
        return reference(q_nope, q_pe, latent, w_kv_b, scale, mask if mask is not None else _causal(Q, S, context_len,
                                                                                                     q_nope.device))
    r = q_pe.shape[-1]
    c_kv, k_pe = latent.split([latent.shape[-1] - r, r], dim=-1)
    kv = F.linear(c_kv, w_kv_b).view(S, H, -1)  # [S, H, dn + dv]
    if PREFILL_KERNEL == "triton" or (PREFILL_KERNEL == "auto" and q_nope.is_cuda):
        from torchinferno.kernels.triton.mla_prefill_attention import mla_prefill_attention

        return mla_prefill_attention(q_nope, q_pe, kv, k_pe, scale, context_len)
    dv = kv.shape[-1] - dn
    d = dn + r
    if dv > d:  # values wider than the qk dim: no padding helps; the reference
        return reference(q_nope, q_pe, latent, w_kv_b, scale, _causal(Q, S, context_len, q_nope.device))
    k = torch.empty((S, H, d), dtype=kv.dtype, device=kv.device)
    k[..., :dn] = kv[..., :dn]
    k[..., dn:] = k_pe[:, None, :]
    v = F.pad(kv[..., dn:], (0, d - dv))  # [S, H, d], zeros past dv
    q = torch.cat([q_nope, q_pe.to(q_nope.dtype)], dim=-1)  # [Q, H, d]
    bias = None
    if context_len:
        from torch.nn.attention.bias import causal_lower_right

        bias = causal_lower_right(Q, S)  # flash / memory-efficient kernels' own rule; nothing materialized
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       attn_mask=bias, is_causal=bias is None, scale=scale)  # [1, H, Q, d]
    return o[0, :, :, :dv].transpose(0, 1)  # [Q, H, dv]


def _causal(Q: int, S: int, context_len: int, device) -> torch.Tensor | None:
    """The boolean [Q, S] mask of a chunk after ``context_len`` cached keys (the reference's input); None: Q == S."""
    if not context_len:
        return None
    return torch.arange(S, device=device)[None, :] <= (context_len + torch.arange(Q, device=device))[:, None]
