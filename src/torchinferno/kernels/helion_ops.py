"""Experimental Helion kernels (offline candidates; runtime never imports this module).

Import only after ``workbench.helion.helion_available()``: this module imports ``helion`` at the
top. Nothing is compiled at import: ``helion_kernel(name, effort)`` wraps a kernel body below in
``helion.kernel`` on first use (cached per name and autotune effort), and Helion generates and
tunes the Triton code at the first call on a CUDA tensor (one specialization per shape/dtype).

Kernels (bodies are Helion DSL: host code outside ``hl.tile`` loops, device code inside):

* ``swiglu``   ``(gate [N, I], up [N, I]) -> silu(gate) * up [N, I]``, fp32 math, rounded once;
* ``rms_norm`` ``(x [M, D], weight [D], eps) -> weight * x / rms(x) [M, D]``, fp32 math like
  ``kernels.reference.ref_rms_norm``; a whole row is one tile (the reduction stays in registers
  or a looped reduction, as Helion's config chooses).

The ``*_activation`` / ``*_op`` wrappers take the shapes the graph patterns produce (any leading
dims, gate/up as one ``[.., 2I]`` tensor) and are what a candidate graph calls.
"""

from __future__ import annotations

import functools

import helion
import helion.language as hl
import torch

EFFORTS = ("none", "quick", "full")  # helion's autotune_effort presets


def _swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    n, i = gate.size()
    out = torch.empty([n, i], dtype=gate.dtype, device=gate.device)
    for tile_n, tile_i in hl.tile([n, i]):
        g = gate[tile_n, tile_i].to(torch.float32)
        u = up[tile_n, tile_i].to(torch.float32)
        out[tile_n, tile_i] = (g * torch.sigmoid(g) * u).to(out.dtype)
    return out


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    m, d = x.size()
    out = torch.empty([m, d], dtype=x.dtype, device=x.device)
    for tile_m in hl.tile(m):
        row = x[tile_m, :].to(torch.float32)
        inv_rms = torch.rsqrt(torch.mean(row * row, dim=-1, keepdim=True) + eps)
        out[tile_m, :] = (weight[:].to(torch.float32) * (row * inv_rms)).to(out.dtype)
    return out


_BODIES = {"swiglu": _swiglu, "rms_norm": _rms_norm}


@functools.cache
def helion_kernel(name: str, effort: str = "quick", ref_mode: bool = False):
    """The ``helion.Kernel`` for body ``name`` (``swiglu`` | ``rms_norm``) at an autotune effort.

    ``ref_mode=True`` runs the body eagerly in PyTorch (Helion's reference mode: no Triton, no
    GPU), which checks the kernel's semantics on CPU.
    """
    if name not in _BODIES:
        raise KeyError(f"no Helion kernel '{name}' (valid: {', '.join(_BODIES)})")
    settings: dict = {"static_shapes": True, "autotune_effort": effort}
    if ref_mode:
        settings["ref_mode"] = helion.RefMode.EAGER
    return helion.kernel(_BODIES[name], **settings)


def _swiglu_args(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    half = gate_up.shape[-1] // 2
    flat = gate_up.reshape(-1, 2 * half)  # [N, 2I]; gate / up are strided views of it
    return flat[:, :half], flat[:, half:]


def _rms_norm_args(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, float]:
    return x.reshape(-1, x.shape[-1]).contiguous(), weight, float(eps)


def swiglu_activation(gate_up: torch.Tensor, effort: str = "quick", ref_mode: bool = False) -> torch.Tensor:
    """``[.., 2I] -> [.., I]``: ``silu(gate) * up`` with gate first (``torchinferno.swiglu_activation``)."""
    out = helion_kernel("swiglu", effort, ref_mode)(*_swiglu_args(gate_up))
    return out.reshape(*gate_up.shape[:-1], gate_up.shape[-1] // 2)


def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float, effort: str = "quick",
                ref_mode: bool = False) -> torch.Tensor:
    """``[.., D] -> [.., D]`` RMSNorm (``torchinferno.rms_norm``)."""
    return helion_kernel("rms_norm", effort, ref_mode)(*_rms_norm_args(x, weight, eps)).reshape(x.shape)


# wrapper-level op name -> (kernel body name, argument preparation)
OP_KERNELS = {"swiglu_activation": ("swiglu", _swiglu_args), "rms_norm": ("rms_norm", _rms_norm_args)}


def kernel_report(op: str, effort: str, *op_args) -> dict:
    """The config Helion chose and the Triton source it generated for ``op`` called on ``op_args``.

    Binding is cheap once the kernel ran on these shapes (the specialization is cached); before
    that, the default config's code is returned (no autotuning is started here).
    """
    name, prepare = OP_KERNELS[op]
    bound = helion_kernel(name, effort).bind(prepare(*op_args))
    config = getattr(bound, "_config", None) or bound.config_spec.default_config()
    return {"kernel": name, "config": str(config), "triton_code": bound.to_triton_code(config)}
