"""Lazy family registry: name -> family, without importing any family until asked."""

from __future__ import annotations

import importlib

from torchinferno.errors import ConfigError
from torchinferno.models.protocol import ModelFamily

# Adding a family = one folder + one line here ("module:attribute" of its ModelFamily).
_FAMILIES: dict[str, str] = {
    "llama3": "torchinferno.models.llama3.family:FAMILY",
    "deepseek-v3.2": "torchinferno.models.deepseek_v32.family:FAMILY",
    "dsv4": "torchinferno.models.dsv4.family:FAMILY",
    "deepseek-v4": "torchinferno.models.deepseek_v4.family:FAMILY",
}
_ALIASES: dict[str, str] = {
    "llama": "llama3",
    "dsv3.2": "deepseek-v3.2",
    "deepseek": "deepseek-v3.2",
    "deepseek_v4": "deepseek-v4",
}


def register_family(name: str, target: str, aliases: tuple[str, ...] = ()) -> None:
    _FAMILIES[name] = target
    for a in aliases:
        _ALIASES[a] = name


def family_names() -> list[str]:
    return sorted(_FAMILIES)


def get_family(name: str) -> ModelFamily:
    key = _ALIASES.get(name, name)
    if key not in _FAMILIES:
        valid = sorted(set(_FAMILIES) | set(_ALIASES))
        raise ConfigError(f"unknown model family '{name}' (valid: {', '.join(valid)})")
    module, attr = _FAMILIES[key].split(":")
    return getattr(importlib.import_module(module), attr)


def family_for_hf_config(config: dict) -> ModelFamily:
    """Pick the family whose ``hf_model_types`` contains ``config['model_type']``."""
    model_type = config.get("model_type")
    for name in family_names():
        fam = get_family(name)
        if model_type in fam.hf_model_types:
            return fam
    known = sorted(t for n in family_names() for t in get_family(n).hf_model_types)
    raise ConfigError(f"unsupported model_type '{model_type}' in config.json (supported: {', '.join(known)})")
