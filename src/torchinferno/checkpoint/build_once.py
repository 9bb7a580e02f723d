"""Build a cache directory once, atomically.

``build_once(final, build)`` runs ``build(out, scratch)`` in a private temporary directory next to
``final``, writes a completion marker into ``out`` and renames ``out`` to ``final``.

Invariants: ``final`` either does not exist, is left over from an interrupted older build (no
marker: it is replaced), or is complete (marker present: reused as is, unless ``force``). A
crash or exception mid-build leaves no partial ``final`` behind; the scratch space is always
removed. Two processes racing on the same ``final`` both end with one complete directory.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

MARKER = ".torchinferno-complete"


def is_complete(final: Path) -> bool:
    return (Path(final) / MARKER).is_file()


def build_once(
    final: Path,
    build: Callable[[Path, Path], None],
    info: dict | None = None,
    force: bool = False,
) -> Path:
    """Return ``final``, building it with ``build(out_dir, scratch_dir)`` if it is not complete."""
    final = Path(final)
    if is_complete(final) and not force:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    try:
        out, scratch = tmp / "out", tmp / "scratch"
        out.mkdir()
        scratch.mkdir()
        build(out, scratch)
        (out / MARKER).write_text(json.dumps({"built_at": time.time(), **(info or {})}, indent=2) + "\n")
        if final.exists():
            if is_complete(final) and not force:
                return final  # another process finished first
            os.replace(final, tmp / "old")  # stale, incomplete, or forced: move aside, then drop
        try:
            os.replace(out, final)
        except OSError:
            if is_complete(final):
                return final  # lost a race to another process
            raise
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
