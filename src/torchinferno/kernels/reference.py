"""Torch reference implementations: the numerics oracle for every kernel."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ref_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (weight.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


def ref_add_rms_norm(x, residual, weight, eps):
    h = x + residual
    return ref_rms_norm(h, weight, eps), h


def ref_swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(gate_up.dtype)


def ref_rotary_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[:, None, :].float(), sin[:, None, :].float()
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


# --------------------------------------------------------------- one-row decode GEMVs with fused small ops
def ref_decode_gemv(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None,
                    norm_weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """``x [K] -> [N]``: ``rms_norm(x) @ weight.T`` (norm optional), rounded, ``+ residual [N]`` (optional), rounded."""
    h = x if norm_weight is None else ref_rms_norm(x[None], norm_weight, eps)[0]
    y = F.linear(h.float(), weight.float()).to(x.dtype)
    return y if residual is None else (y.float() + residual.float()).to(x.dtype)


def ref_decode_gemv_swiglu(x: torch.Tensor, gate_up_weight: torch.Tensor, norm_weight: torch.Tensor | None = None,
                           eps: float = 1e-6) -> torch.Tensor:
    """``x [K] -> silu(g) * u [I]`` with ``g, u`` the halves of ``rms_norm(x) @ gate_up_weight.T`` (rounded)."""
    return ref_swiglu(ref_decode_gemv(x, gate_up_weight, norm_weight=norm_weight, eps=eps))


def ref_decode_gemv_rope_kv(x: torch.Tensor, qkv_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                            k_cache: torch.Tensor, v_cache: torch.Tensor, slot: torch.Tensor, num_heads: int,
                            num_kv_heads: int, head_dim: int, norm_weight: torch.Tensor | None = None,
                            eps: float = 1e-6) -> torch.Tensor:
    """``x [K]`` -> rotated queries ``[num_heads * head_dim]``; rotated keys and values stored at flat ``slot``
    (a 1-element tensor; < 0 stores nothing) of the paged caches ``[blocks, page, Hkv, hd]``, FP8 caches by
    ``kernels.kv_dtype``'s rule. ``cos``/``sin`` ``[head_dim / 2]``: this token's table rows."""
    from torchinferno.kernels.kv_dtype import store_rows

    qkv = ref_decode_gemv(x, qkv_weight, norm_weight=norm_weight, eps=eps).view(num_heads + 2 * num_kv_heads, head_dim)
    qk = ref_rotary_neox(qkv[None, : num_heads + num_kv_heads], cos[None], sin[None])[0]
    s = int(slot.reshape(-1)[0])
    if s >= 0:
        where = torch.tensor([s], device=x.device)
        store_rows(k_cache, where, qk[None, num_heads:])
        store_rows(v_cache, where, qkv[None, num_heads + num_kv_heads:])
    return qk[:num_heads].reshape(-1)
