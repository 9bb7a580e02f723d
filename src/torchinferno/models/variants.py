"""Provenance variants shared by every family's ``registry.py``."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from torchinferno.errors import ConfigError


@dataclass(frozen=True)
class Variant:
    """One concrete model variant. ``parent`` is the variant it must match (None for v0)."""

    name: str
    parent: str | None
    class_path: str  # "module:Class"
    ops_module: str
    status: str  # reference | validated | experimental | promoted
    notes: str = ""
    tensor_parallel: int = 0  # > 0: the parent sharded over this many ranks (parallel/plan.py); 0: one device
    pipeline_parallel: int = 0  # > 0: the parent in this many stages of layers (parallel/pipeline.py)

    @property
    def parallel(self) -> tuple[int, str]:
        """``(ranks, mode)`` the variant runs on; ``(0, "")`` on one device."""
        if self.pipeline_parallel:
            return self.pipeline_parallel, "pipeline"
        return (self.tensor_parallel, "tensor") if self.tensor_parallel else (0, "")

    def load_class(self):
        module, cls = self.class_path.split(":")
        return getattr(importlib.import_module(module), cls)


def pick_variant(variants: dict[str, Variant], name: str, family: str) -> Variant:
    if name not in variants:
        raise ConfigError(f"unknown variant '{name}' for family {family} (valid: {', '.join(sorted(variants))})")
    return variants[name]


def lineage(variants: dict[str, Variant], name: str) -> list[Variant]:
    """[v, parent(v), ..., v0]."""
    out, cur = [], name
    while cur is not None:
        v = variants[cur]
        out.append(v)
        cur = v.parent
    return out
