"""Shared by the probe scripts in this folder: ``--json=PATH`` on the command line writes the report there."""

from __future__ import annotations

import json
import sys


def save_json_arg(report: dict, argv: list[str] | None = None) -> None:
    argv = sys.argv if argv is None else argv
    path = next((a.split("=", 1)[1] for a in argv if a.startswith("--json=")), None)
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2)
