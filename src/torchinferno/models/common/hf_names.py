"""HF tensor names of the per-expert hub layout, shared by the DeepSeek-style families' weight maps."""

from __future__ import annotations

import torch


def missing_hf_names(name: str, pieces: set) -> list[str]:
    """HF names of the missing ``pieces`` of internal tensor ``name``.

    Pieces: ``(expert, 0|1)`` for fused ``experts.gate_up_proj`` (gate, up), ``expert`` for
    ``experts.down_proj``, ``0|1`` for a merged dense ``gate_up_proj.weight``.
    """
    if not pieces:
        return []
    if name.endswith("mlp.experts.gate_up_proj"):
        base = name[: -len("gate_up_proj")]
        return [f"{base}{e}.{'gate_proj' if j == 0 else 'up_proj'}.weight" for e, j in sorted(pieces)]
    if name.endswith("mlp.experts.down_proj"):
        base = name[: -len("down_proj")]
        return [f"{base}{e}.down_proj.weight" for e in sorted(pieces)]
    if name.endswith("gate_up_proj.weight"):
        base = name[: -len("gate_up_proj.weight")]
        return [f"{base}{'gate_proj' if j == 0 else 'up_proj'}.weight" for j in sorted(pieces)]
    return [name]


def required_pieces(name: str, t: torch.Tensor) -> set:
    """Every piece (as in :func:`missing_hf_names`) of internal tensor ``name`` a checkpoint must provide."""
    if name.endswith("mlp.experts.gate_up_proj"):
        return {(e, j) for e in range(t.shape[0]) for j in (0, 1)}
    if name.endswith("mlp.experts.down_proj"):
        return set(range(t.shape[0]))
    if name.endswith("gate_up_proj.weight"):
        return {0, 1}
    return {None}
