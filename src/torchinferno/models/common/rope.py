"""Rotary position embeddings: inverse frequencies (default, llama3, YaRN) and application.

Two element layouts exist in the wild: "neox" (rotate halves: HF Llama) and "interleaved"
(rotate adjacent pairs: DeepSeek MLA's rope part in the original release).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RopeScaling:
    """``rope_type`` in {"default", "llama3", "yarn"}; the other fields follow HF config names."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0

    @staticmethod
    def from_hf(d: dict | None) -> "RopeScaling":
        if not d:
            return RopeScaling()
        rope_type = d.get("rope_type", d.get("type", "default")) or "default"
        kw = {k: d[k] for k in RopeScaling.__dataclass_fields__ if k in d and k != "rope_type" and d[k] is not None}
        return RopeScaling(rope_type=rope_type, **kw)

    def to_hf(self) -> dict | None:
        if self.rope_type == "default":
            return None
        if self.rope_type == "llama3":
            keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        else:
            keys = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
        return {"rope_type": self.rope_type, **{k: getattr(self, k) for k in keys}}


def default_inv_freq(dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def llama3_inv_freq(dim: int, theta: float, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths divided by ``factor``, short kept, smooth in between."""
    inv_freq = default_inv_freq(dim, theta)
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(dim: int, theta: float, s: RopeScaling) -> tuple[torch.Tensor, float]:
    """YaRN: blend interpolated and extrapolated frequencies; returns (inv_freq, cos/sin scale)."""
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    extra = 1.0 / pos_freqs
    inter = 1.0 / (s.factor * pos_freqs)

    def correction_dim(num_rot: float) -> float:
        return (dim * math.log(s.original_max_position_embeddings / (num_rot * 2 * math.pi))) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(s.beta_fast)), 0)
    high = min(math.ceil(correction_dim(s.beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extra_factor = 1 - ramp
    inv_freq = inter * (1 - extra_factor) + extra * extra_factor
    return inv_freq, yarn_attention_factor(s)


def yarn_attention_factor(s: RopeScaling) -> float:
    """cos/sin multiplier of YaRN, transformers' rule: the mscale ratio only when *both*
    ``mscale`` and ``mscale_all_dim`` are set, ``mscale(factor)`` otherwise."""
    if s.mscale and s.mscale_all_dim:
        return float(yarn_get_mscale(s.factor, s.mscale) / yarn_get_mscale(s.factor, s.mscale_all_dim))
    return float(yarn_get_mscale(s.factor))


def rope_cos_sin(dim: int, theta: float, max_pos: int, scaling: RopeScaling, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [max_pos, dim // 2] in fp32."""
    att = 1.0
    if scaling.rope_type == "llama3":
        inv = llama3_inv_freq(dim, theta, scaling)
    elif scaling.rope_type == "yarn":
        inv, att = yarn_inv_freq(dim, theta, scaling)
    elif scaling.rope_type in ("default", "linear") and scaling.factor == 1.0:
        inv = default_inv_freq(dim, theta)
    elif scaling.rope_type == "linear":
        inv = default_inv_freq(dim, theta) / scaling.factor
    else:
        from torchinferno.errors import ConfigError

        raise ConfigError(f"unsupported rope_type '{scaling.rope_type}' (valid: default, linear, llama3, yarn)")
    t = torch.arange(max_pos, dtype=torch.float32)
    freqs = torch.outer(t, inv.float())
    return (freqs.cos() * att).to(device), (freqs.sin() * att).to(device)


def apply_rope_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] with halves rotated; cos/sin [T, D/2] (fp32). Computes in fp32, returns x.dtype."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] with adjacent pairs (x0, x1) rotated; cos/sin [T, D/2]."""
    xf = x.float().unflatten(-1, (-1, 2))
    x1, x2 = xf[..., 0], xf[..., 1]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2).to(x.dtype)
