"""Fetch an HF-layout checkpoint from the Hugging Face Hub.

Invariants: only JSON, safetensors, tokenizer files and ``*.jinja`` templates are downloaded
(never pickled weights); credentials come from ``read_env().hf_token``; with
``HF_HUB_OFFLINE=1`` (``read_env().hf_offline``) only the local HF cache is consulted. Every
failure to obtain the files -- offline, unreachable, unknown or gated repo -- is one
CheckpointError line ``could not fetch 'org/name' from the Hugging Face Hub: <reason>``.
Files land in huggingface_hub's own cache (``HF_HOME``), shared with other tools.
"""

from __future__ import annotations

import re
from pathlib import Path

from torchinferno.env import read_env
from torchinferno.errors import CheckpointError

ALLOW_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.jinja"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def looks_like_hub_id(spec: str) -> bool:
    """``org/name`` with Hub-legal characters (the caller checks it is not a local path)."""
    return bool(_HUB_ID.match(spec)) and ".." not in spec


def fetch_from_hub(repo_id: str) -> Path:
    """Download (or find cached) ``repo_id`` and return its snapshot directory."""
    env = read_env()
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(
            repo_id, token=env.hf_token, allow_patterns=ALLOW_PATTERNS, local_files_only=env.hf_offline
        )
    except _hub_errors() as e:
        reason = _reason(e, env.hf_offline)
        raise CheckpointError(f"could not fetch '{repo_id}' from the Hugging Face Hub: {reason}") from e
    snap = Path(path)
    if not (snap / "config.json").is_file():
        raise CheckpointError(f"could not fetch '{repo_id}' from the Hugging Face Hub: the repo has no config.json")
    if not any(snap.glob("*.safetensors")):
        raise CheckpointError(
            f"could not fetch '{repo_id}' from the Hugging Face Hub: the repo has no .safetensors weights"
        )
    return snap


def _hub_errors() -> tuple[type[BaseException], ...]:
    from huggingface_hub import errors

    names = ("HfHubHTTPError", "LocalEntryNotFoundError", "OfflineModeIsEnabled", "RepositoryNotFoundError",
             "GatedRepoError", "RevisionNotFoundError", "HFValidationError", "EntryNotFoundError")
    found: list[type[BaseException]] = [getattr(errors, n) for n in names if hasattr(errors, n)]
    try:
        import httpx

        found.append(httpx.HTTPError)
    except ImportError:  # older huggingface_hub uses requests
        pass
    try:
        import requests

        found.append(requests.RequestException)
    except ImportError:
        pass
    return (*found, OSError, ConnectionError, TimeoutError)


def _reason(e: BaseException, offline: bool) -> str:
    name = type(e).__name__
    if offline and name in ("LocalEntryNotFoundError", "OfflineModeIsEnabled", "EntryNotFoundError"):
        return "offline mode (HF_HUB_OFFLINE=1) and not in the local Hugging Face cache"
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{name}: {lines[0]}" if lines else name
