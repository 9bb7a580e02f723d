"""Helion entry points (``helion-candidate``, ``helion-search-fx``, ``helion-search-region``).

Helion is optional. Without it every entry point raises one ``ConfigError`` line saying so (the
CLI prints it and exits 1); no Helion import happens anywhere else.
"""

from __future__ import annotations

import importlib.util

from torchinferno.errors import ConfigError


def helion_available() -> bool:
    return importlib.util.find_spec("helion") is not None


def require_helion(command: str) -> None:
    if not helion_available():
        raise ConfigError(f"{command}: Helion is not installed (pip install helion; it needs a CUDA GPU)")


def helion_entry(command: str, target: str) -> dict:
    """Shared body of the three commands: checks Helion, then says what is (not yet) searchable."""
    require_helion(command)
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"{command}: Helion kernels need a CUDA device (none available)")
    raise ConfigError(f"{command}: no Helion kernel template is registered for '{target}' yet "
                      "(use `candidate --provider custom-op|torch-rewrite|torch-compile`)")
