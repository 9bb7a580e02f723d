"""One directory per experiment, indexed by ``manifest.json``.

Invariant: every file an experiment writes goes through ``ArtifactDir`` and is listed in the
manifest with its kind and a one-line description; ``finish`` writes ``manifest.json`` last, so a
directory with a manifest is complete. JSON artifacts are plain data (loadable with ``json``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from torchinferno.errors import ConfigError

MANIFEST = "manifest.json"


def _default(o: Any):
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, float) and o != o:
        return None
    return str(o)


class ArtifactDir:
    """Writes artifacts into ``root`` and records them for ``manifest.json``."""

    def __init__(self, root: str | Path, command: str):
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise ConfigError(f"output path {self.root} exists and is not a directory")
        self.root.mkdir(parents=True, exist_ok=True)
        self.command = command
        self.entries: dict[str, dict] = {}
        self.summary: dict[str, Any] = {}
        self.t0 = time.time()

    def path(self, name: str) -> Path:
        return self.root / name

    def _record(self, name: str, kind: str, description: str) -> Path:
        p = self.path(name)
        self.entries[name] = {"file": name, "kind": kind, "description": description, "bytes": p.stat().st_size}
        return p

    def json(self, name: str, obj: Any, description: str) -> Path:
        self.path(name).write_text(json.dumps(obj, indent=1, default=_default) + "\n")
        return self._record(name, "json", description)

    def text(self, name: str, text: str, description: str, kind: str = "text") -> Path:
        self.path(name).write_text(text)
        return self._record(name, kind, description)

    def python(self, name: str, source: str, description: str) -> Path:
        return self.text(name, source, description, kind="python")

    def existing(self, name: str, kind: str, description: str) -> Path:
        """Register a file some other writer (profiler, torch.save) already put in the directory."""
        return self._record(name, kind, description)

    def finish(self, **summary: Any) -> dict:
        self.summary.update(summary)
        manifest = {
            "command": self.command,
            "created_unix": round(self.t0, 3),
            "elapsed_s": round(time.time() - self.t0, 3),
            "summary": self.summary,
            "artifacts": sorted(self.entries.values(), key=lambda e: e["file"]),
        }
        self.path(MANIFEST).write_text(json.dumps(manifest, indent=1, default=_default) + "\n")
        return manifest


def read_json(path: str | Path, what: str = "file") -> Any:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{what} not found: {p}")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p} is not valid JSON ({e.msg} at line {e.lineno})") from e


def load_run_dir(run_dir: str | Path) -> dict:
    """The parts of a ``profile-run`` directory later commands need (config, inputs, graph index)."""
    d = Path(run_dir)
    if not (d / "run_config.json").exists():
        raise ConfigError(f"{d} is not a profile-run directory (no run_config.json); run `torchinferno profile-run {d} ...` first")
    return {
        "dir": d,
        "run_config": read_json(d / "run_config.json"),
        "input_ids": read_json(d / "input_ids.json")["input_ids"],
        "graph": read_json(d / "graph.json") if (d / "graph.json").exists() else None,
    }
