"""Helpers to move a model built on ``meta`` to real memory."""

from __future__ import annotations

import torch
from torch import nn


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
