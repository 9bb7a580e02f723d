"""The decision store: one JSON line per provider decision (``--remember FILE.jsonl``).

A decision is the verdict of ``promotion.gate`` on one candidate (a provider's replacement of
one window / partition at one shape on one device), with the evidence::

    {"version": 1, "key": "3f2a...", "time_unix": 1.7e9, "command": "helion-search-fx",
     "provider": "helion", "pattern": "swiglu", "source": "candidate swiglu", "node_ids": [1, 2, 3, 4, 5],
     "targets": [...], "inputs": [{"shape": [32000, 7168], "dtype": "torch.float32"}], "device": "cuda",
     "device_name": "NVIDIA H200", "correctness": {"max_abs_error": ..., "tolerance": ..., "passed": true},
     "benchmark": {"candidate_us": ..., "baselines_us": {...}, "best_baseline": "...",
                   "speedup_vs_best_baseline": ...}, "threshold": 0.05, "accepted": true, "reason": "...",
     "provider_details": {...}, "versions": {"torch": "...", "helion": "..."}}

Invariants: lines are appended, never rewritten (the file is a log); ``key`` hashes what makes
two decisions about the same question (provider + its settings, pattern, the window's ops,
input shapes/dtypes, device name, torch/provider versions), so a later search can reuse a
remembered verdict instead of re-tuning. A malformed line is a ``ConfigError`` naming its number.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from torchinferno.errors import ConfigError

VERSION = 1
KEY_FIELDS = ("provider", "pattern", "targets", "inputs", "device_name", "versions", "settings")


def decision_key(record: dict) -> str:
    """sha256 (16 hex) over the fields that identify the question a decision answers."""
    ident = json.dumps({k: record.get(k) for k in KEY_FIELDS}, sort_keys=True, default=str)
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def make_record(**fields) -> dict:
    """A decision record with ``version``, ``time_unix`` and ``key`` filled in."""
    rec = {"version": VERSION, "time_unix": round(time.time(), 3), **fields}
    rec["key"] = decision_key(rec)
    return rec


def read_decisions(path: str | Path) -> list[dict]:
    """Every decision in ``path`` (missing file: none), in file order."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}:{i} is not a JSON decision line ({e.msg})") from e
        if not isinstance(rec, dict) or "key" not in rec:
            raise ConfigError(f"{p}:{i} is not a decision record (no 'key')")
        out.append(rec)
    return out


def remembered(path: str | Path | None) -> dict[str, dict]:
    """``{key: latest decision}`` of ``path`` (empty without a path)."""
    return {} if path is None else {r["key"]: r for r in read_decisions(path)}


def remember(path: str | Path, record: dict) -> None:
    """Append ``record`` as one line (creating the file and its directory)."""
    p = Path(path)
    if p.exists() and p.is_dir():
        raise ConfigError(f"--remember {p} is a directory (give a .jsonl file path)")
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("a") as f:
        f.write(json.dumps(record, sort_keys=True, default=str) + "\n")
