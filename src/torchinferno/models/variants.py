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


def parallel_variants(v0: Variant, plan_path: str) -> dict[str, Variant]:
    """The ``tp-v0`` and ``pipeline-v0`` rows of a family: its ``v0`` sharded over ranks (the family's plan at
    ``plan_path``) or placed in stages of layers; ``validate-model-variants --include-tensor-parallel`` checks both
    at 2 ranks on gloo."""
    same = dict(parent=v0.name, class_path=v0.class_path, ops_module=v0.ops_module, status="validated")
    return {
        "tp-v0": Variant(name="tp-v0", tensor_parallel=2, **same,
                         notes=f"v0 sharded over --tensor-parallel-size ranks ({plan_path}); checked at TP=2 on gloo by "
                               "validate-model-variants --include-tensor-parallel"),
        "pipeline-v0": Variant(name="pipeline-v0", pipeline_parallel=2, **same,
                               notes="v0 in --pipeline-parallel-size stages of layers (parallel/pipeline.py; micro-batches of whole "
                                     "sequences in flight); checked at 2 stages on gloo by validate-model-variants "
                                     "--include-tensor-parallel"),
    }


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
