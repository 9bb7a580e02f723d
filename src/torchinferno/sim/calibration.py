"""Calibration file: a fitted ``CostModel`` plus what it was measured on (JSON <-> dataclass).

A calibration is valid for one model / dtype / device / thread count; ``kv_bytes_per_token`` (all layers,
K and V) prices P/D KV transfers and ``hidden_size`` / ``num_layers`` price TP collectives.

``cost`` is the linear per-step model (always present); ``timeline`` optionally holds a ``TimelineModel``'s dict
(``{"kind": "timeline", ...}``, ``sim.timeline``), fitted from step logs or synchronous probes.
``model_for(choice)`` picks one: ``auto`` (the timeline when present), ``timeline`` or ``linear``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from torchinferno.errors import ConfigError
from torchinferno.sim.cost_model import CostModel
from torchinferno.sim.timeline import TimelineModel

__all__ = ["CALIBRATION_VERSION", "COST_MODELS", "Calibration"]

COST_MODELS = ("auto", "timeline", "linear")

CALIBRATION_VERSION = 1


@dataclass
class Calibration:
    cost: CostModel
    model: str = "explicit"
    device: str = "cpu"
    dtype: str = "float32"
    kv_dtype: str = "float32"
    kv_bytes_per_elem: int = 4
    threads: int = 0  # torch threads during the probes (0: not recorded)
    num_layers: int = 0
    hidden_size: int = 0
    kv_bytes_per_token: int = 0
    num_samples: int = 0
    fit_error: float = 0.0  # mean |relative error| of the fit on its own samples
    source: str = "explicit"
    extra: dict = field(default_factory=dict)
    timeline: dict | None = None  # TimelineModel.as_dict() (kind "timeline"), or None

    def model_for(self, choice: str = "auto") -> CostModel | TimelineModel:
        """The cost model to simulate with: ``auto`` = the timeline when the file has one, else the linear one."""
        if choice not in COST_MODELS:
            raise ConfigError(f"unknown cost model {choice!r} (valid: {', '.join(COST_MODELS)})")
        if choice == "linear" or (choice == "auto" and not self.timeline):
            return self.cost
        if not self.timeline:
            raise ConfigError("the calibration has no timeline model: re-fit it with sim-calibrate --cost-model timeline")
        return TimelineModel.from_dict(self.timeline)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cost"] = self.cost.as_dict()
        d["version"] = CALIBRATION_VERSION
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Calibration:
        if not isinstance(d, dict) or "cost" not in d:
            raise ConfigError("not a calibration file (no 'cost' entry); make one with sim-calibrate")
        if d.get("version", CALIBRATION_VERSION) != CALIBRATION_VERSION:
            raise ConfigError(f"calibration version {d.get('version')} is not supported (expected {CALIBRATION_VERSION})")
        kw = {k: v for k, v in d.items() if k in cls.__dataclass_fields__ and k != "cost"}
        return cls(cost=CostModel.from_dict(d["cost"]), **kw)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return p

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"calibration file not found: {p} (make one with sim-calibrate)")
        try:
            return cls.from_dict(json.loads(p.read_text()))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"calibration file {p} is malformed: {e}") from None
