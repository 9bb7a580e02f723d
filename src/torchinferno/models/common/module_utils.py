"""Helpers to move a model built on ``meta`` to real memory, and the fp32-keeping module mixin."""

from __future__ import annotations

import torch
from torch import nn


class KeepFP32(nn.Module):
    """Mixin: this module's fp32 parameters and buffers (and its children's) stay fp32 when the model
    is cast to a narrower float dtype.

    Invariant: every dtype cast of a model goes through ``nn.Module._apply`` (``.to(dtype)``,
    ``.bfloat16()``, ``.half()``, ``materialize``, ``family.build(dtype=...)``), so overriding it here
    covers them all; device moves and ``to_empty`` still apply. Used where transformers and DeepSeek
    keep fp32 in a bf16 model: the MoE router (``gate.weight``, ``e_score_correction_bias``) and the
    DSA indexer's ``weights_proj``. The kept tensor is the fp32 original moved to the new device,
    never a value rounded through the narrower dtype. Casting to fp64 is not narrowing and applies.
    """

    def _apply(self, fn, recurse=True):
        def keep_fp32(t: torch.Tensor) -> torch.Tensor:
            out = fn(t)
            if t.dtype == torch.float32 and out.is_floating_point() and out.element_size() < 4:
                return t.to(device=out.device)
            return out

        return super()._apply(keep_fp32, recurse)


class KeepFP32Tensors(nn.Module):
    """Mixin: the module's own tensors named in ``fp32_tensors`` (not its children's, not its other tensors) stay
    fp32 when the model is cast to a narrower float dtype (transformers' ``_keep_in_fp32_modules_strict`` for single
    tensors such as attention sinks or a router's correction bias). Same invariant as :class:`KeepFP32`."""

    fp32_tensors: tuple[str, ...] = ()

    def _apply(self, fn, recurse=True):
        keep = {id(t) for n in self.fp32_tensors if (t := self.__dict__.get("_parameters", {}).get(n)) is not None}
        keep |= {id(t) for n in self.fp32_tensors if (t := self.__dict__.get("_buffers", {}).get(n)) is not None}

        def keep_fp32(t: torch.Tensor) -> torch.Tensor:
            out = fn(t)
            if id(t) in keep and t.dtype == torch.float32 and out.is_floating_point() and out.element_size() < 4:
                return t.to(device=out.device)
            return out

        return super()._apply(keep_fp32, recurse)


def materialize(model: nn.Module, device: str | torch.device, dtype: torch.dtype | None = None) -> nn.Module:
    """Allocate (uninitialized) storage for a meta model on ``device`` and rebuild computed buffers."""
    if dtype is not None:
        model.to(dtype=dtype)
    model.to_empty(device=device)
    for m in model.modules():
        init = getattr(m, "init_buffers", None)
        if callable(init):
            init()
    return model
