"""In-place replacement of a model's ``nn.Linear`` modules (the walk shared by the quantized linears)."""

from __future__ import annotations

from typing import Callable

from torch import nn


def replace_linears(model: nn.Module, make: Callable[[str, nn.Linear], nn.Module | None]) -> list[str]:
    """For every module of exact type ``nn.Linear`` (subclasses and already-swapped modules are left
    alone), ``make(qualified_name, linear)`` returns its replacement or ``None`` to keep it. Plain
    module swapping, no graph pass: hooks/FX/export see ordinary modules. Returns the names replaced. Swap before a runner wraps the
    model with its lean decode step (``models/common/step_model``): the step reads the tensors it was built on."""
    replaced: list[str] = []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is not nn.Linear:
                continue
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            new = make(name, child)
            if new is not None:
                setattr(parent, child_name, new)
                replaced.append(name)
    return replaced
