"""Which model's KV layout a simulated replica holds: a family's named size or a checkpoint's config.json.

The simulator never builds the model; it needs only the family's ``KVSpec`` (``ModelFamily.kv_spec(config)``)
so that ``sim.kv_capacity.simulated_kv_plan`` sizes the replica's pools as the engine would (a hybrid spec such
as deepseek-v4's: a sliding pool freed behind the window + a whole pool of compressed entries). Bad names raise a
one-line ``ConfigError`` that lists the valid ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from torchinferno.errors import ConfigError
from torchinferno.models.protocol import KVSpec

__all__ = ["ModelKV", "model_kv"]


@dataclass(frozen=True)
class ModelKV:
    spec: KVSpec
    name: str  # "deepseek-v4/deepseek-v4-flash" or the config path: shown in reports

    def describe(self) -> str:
        s = self.spec
        kind = f"hybrid, sliding window {s.sliding_window}" if s.is_hybrid else "one whole-context group"
        return f"{self.name} ({s.num_layers} layers, {kind})"


def model_kv(model_kind: str | None = None, size: str = "debug", config_path: str | None = None) -> ModelKV | None:
    """The KV spec of ``model_kind`` at ``size`` (a family name, alias or ``tiny-<name>``; sizes as in
    ``--model-kind ... --size``), or of ``config_path`` (an HF ``config.json`` or the directory holding it);
    ``None`` when neither is given."""
    if model_kind and config_path:
        raise ConfigError("give either --model-kind or --kv-spec-from, not both")
    if model_kind:
        from torchinferno.engine.assembly import tiny_kind_family
        from torchinferno.models.registry import get_family

        fam = get_family(tiny_kind_family(model_kind))
        return ModelKV(fam.kv_spec(fam.size(size)), f"{fam.name}/{size}")
    if config_path:
        from torchinferno.models.registry import family_for_hf_config

        path = Path(config_path)
        path = path / "config.json" if path.is_dir() else path
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"--kv-spec-from {config_path}: cannot read a config.json ({e})") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"--kv-spec-from {config_path}: not a JSON object")
        fam = family_for_hf_config(doc)
        try:
            cfg = fam.config_from_hf(doc)
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"--kv-spec-from {config_path}: not a {fam.name} config ({e!r})") from None
        return ModelKV(fam.kv_spec(cfg), str(config_path))
    return None
