"""``audit``: the environment (torch, CUDA, Triton, optional providers) and the feature table."""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import re
from pathlib import Path

_TEST_FILE = re.compile(r"tests/[A-Za-z0-9_/]*\.py")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="environment and the feature readiness table (docs/ROADMAP.md)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--roadmap", default=None, help="path to ROADMAP.md (default: the one shipped with the package/repo)")
    p.set_defaults(func=cmd_audit)


def environment() -> dict:
    import torch

    def version(name: str) -> str | None:
        if importlib.util.find_spec(name) is None:
            return None
        try:
            from importlib.metadata import version as v

            return v(name)
        except Exception:
            return "installed"

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "triton": version("triton"),
        "helion": version("helion"),
        "transformers": version("transformers"),
        "vllm": version("vllm"),
        "cpu_threads": torch.get_num_threads(),
    }


def find_roadmap(explicit: str | None) -> Path | None:
    if explicit:
        return Path(explicit)
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent / "docs" / "ROADMAP.md"
        if cand.exists():
            return cand
    return None


def parse_roadmap(path: Path) -> list[dict]:
    """Rows of the first markdown table whose header has a 'status' column."""
    rows: list[dict] = []
    header: list[str] | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            if any(c.lower() == "status" for c in cells):
                header = [c.lower() for c in cells]
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        if len(cells) == len(header):
            rows.append(dict(zip(header, cells)))
    return rows


def missing_test_citations(rows: list[dict], repo_root: Path) -> list[tuple[str, str]]:
    """(capability, path) for every ``tests/...py`` a row cites that does not exist under ``repo_root``.

    Evidence must be checkable: a row that names a test file which is gone would otherwise keep its
    status on the strength of nothing. Only checked where ``repo_root/tests`` exists (a source checkout)."""
    if not (repo_root / "tests").is_dir():
        return []
    missing = []
    for r in rows:
        for cited in _TEST_FILE.findall(" ".join(r.values())):
            if not (repo_root / cited).is_file():
                missing.append((r.get("capability", "?"), cited))
    return missing


def cmd_audit(a) -> int:
    from torchinferno.errors import ConfigError

    env = environment()
    path = find_roadmap(a.roadmap)
    if path is None or not path.exists():
        raise ConfigError(f"ROADMAP.md not found ({a.roadmap or 'searched docs/ROADMAP.md above the package'})")
    rows = parse_roadmap(path)
    missing = missing_test_citations(rows, path.resolve().parent.parent)
    error = None
    if missing:
        error = ConfigError(f"{path} cites test files that do not exist: "
                            + "; ".join(f"row '{cap}' -> {cited}" for cap, cited in missing))
    if a.json:
        print(json.dumps({"environment": env, "features": rows,
                          "missing_test_files": [{"capability": c, "path": p} for c, p in missing]}, indent=2))
        if error:
            raise error
        return 0
    print("environment:")
    for k, v in env.items():
        print(f"  {k:16s} {v}")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.get("status", "?")] = counts.get(r.get("status", "?"), 0) + 1
    print(f"\nfeatures ({path}): " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    w = max((len(r.get("capability", "")) for r in rows), default=10)
    for r in rows:
        print(f"  {r.get('area', ''):4s} {r.get('capability', ''):{w}s}  {r.get('status', ''):8s}  {r.get('evidence', '')}")
    if error:
        raise error  # after the table, so the report is still readable; exit 1
    return 0
