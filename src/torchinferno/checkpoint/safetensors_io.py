"""Read and write Hugging Face style checkpoint directories (config.json + safetensors).

Layouts understood by the readers, checked in this order:

1. ``model.safetensors.index.json`` + the shards its ``weight_map`` names (sharded);
2. ``model.safetensors`` (single file);
3. any other ``*.safetensors`` files in the directory (read together, names must not repeat).

Invariants:

* Headers are parsed and validated before any tensor data is touched: every tensor's
  ``data_offsets`` must lie inside its file and match ``shape`` x dtype size, so a truncated or
  corrupt file raises :class:`CheckpointError` naming the file (and tensor) up front.
* Nothing here unpickles: only safetensors and JSON are read.
* ``iter_tensors`` holds at most one tensor at a time (plus the OS page cache of the shard).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from torchinferno.errors import CheckpointError, ConfigError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
_MAX_HEADER_BYTES = 100 * 1024 * 1024

# safetensors dtype code -> (torch dtype name, bytes per element)
_DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1),
    "U64": ("uint64", 8), "U32": ("uint32", 4), "U16": ("uint16", 2), "U8": ("uint8", 1),
    "BOOL": ("bool", 1), "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
    "C64": ("complex64", 8),
}


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives and what it is, read from a safetensors header only.

    ``file`` is the absolute path of the ``.safetensors`` file holding it; ``shape`` is the
    torch shape; ``dtype`` is the safetensors dtype code as written in the header
    (``"F32"``, ``"BF16"``, ...); ``torch_dtype`` gives the matching ``torch.dtype``.
    """

    file: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, _DTYPES[self.dtype][0])

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * _DTYPES[self.dtype][1]


# ----------------------------------------------------------------------------------- reading


def read_config(ckpt_dir: str | os.PathLike) -> dict:
    """``config.json`` of ``ckpt_dir`` as a dict; missing or invalid -> CheckpointError naming it."""
    path = Path(ckpt_dir) / "config.json"
    return read_json_object(path, what="config.json")


def read_json_object(path: Path, what: str) -> dict:
    """A JSON file holding one object; missing, undecodable or not an object -> one-line CheckpointError."""
    if not path.is_file():
        raise CheckpointError(f"missing {what}: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"invalid JSON in {path}: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"invalid {what} {path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_header(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """Validated header of one safetensors file: name -> TensorInfo, in data-offset order.

    Raises CheckpointError naming the file (and the tensor) if the header is garbage, a dtype
    is unknown, offsets disagree with shape x dtype, or the file is shorter than the header says.
    """
    path = Path(path).resolve()
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or n > _MAX_HEADER_BYTES or 8 + n > size:
                raise CheckpointError(
                    f"corrupt safetensors file {path}: header length field {n} does not fit a {size}-byte file"
                )
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"cannot read safetensors file {path}: {e.strerror or e}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"corrupt safetensors file {path}: header is not valid JSON") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"corrupt safetensors file {path}: header is not a JSON object")
    data_len = size - 8 - n
    entries = []
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        entries.append((_check_entry(path, name, spec, data_len), name, spec))
    entries.sort(key=lambda e: e[0])
    return {name: TensorInfo(str(path), tuple(spec["shape"]), spec["dtype"]) for _, name, spec in entries}


def _check_entry(path: Path, name: str, spec: object, data_len: int) -> int:
    """Validate one header entry; returns its start offset."""
    bad = f"corrupt safetensors file {path}: tensor '{name}'"
    if not isinstance(spec, dict):
        raise CheckpointError(f"{bad} has no header entry object")
    dtype, shape, offs = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if dtype not in _DTYPES:
        raise CheckpointError(f"{bad} has unsupported dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise CheckpointError(f"{bad} has invalid shape {shape!r}")
    if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)) or not (
        0 <= offs[0] <= offs[1]
    ):
        raise CheckpointError(f"{bad} has invalid data_offsets {offs!r}")
    numel = 1
    for d in shape:
        numel *= d
    need = numel * _DTYPES[dtype][1]
    if offs[1] - offs[0] != need:
        raise CheckpointError(f"{bad} spans {offs[1] - offs[0]} bytes but shape {shape} {dtype} needs {need}")
    if offs[1] > data_len:
        raise CheckpointError(
            f"truncated safetensors file {path}: tensor '{name}' ends at data byte {offs[1]} "
            f"but the file holds only {max(data_len, 0)} data bytes"
        )
    return offs[0]


def tensor_index(ckpt_dir: str | os.PathLike) -> dict[str, TensorInfo]:
    """Every tensor of the checkpoint in ``ckpt_dir``: name -> TensorInfo (headers only).

    Order: shard by shard (index order), then by position in the file. Validates that every
    shard named by the index exists and holds the tensors the index maps to it.
    """
    d = Path(ckpt_dir)
    if not d.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {d}")
    index_path = d / INDEX_FILE
    if index_path.is_file():
        return _sharded_index(d, index_path)
    if (d / SINGLE_FILE).is_file():
        return read_header(d / SINGLE_FILE)
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no {SINGLE_FILE}, {INDEX_FILE} or other .safetensors file in {d}")
    out: dict[str, TensorInfo] = {}
    for f in files:
        for name, info in read_header(f).items():
            if name in out:
                raise CheckpointError(f"tensor '{name}' appears in both {out[name].file} and {info.file}")
            out[name] = info
    return out


def _sharded_index(d: Path, index_path: Path) -> dict[str, TensorInfo]:
    index = read_json_object(index_path, what="safetensors index")
    wmap = index.get("weight_map")
    if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
        raise CheckpointError(f"invalid safetensors index {index_path}: missing or malformed 'weight_map'")
    by_file: dict[str, list[str]] = {}
    for name, fname in wmap.items():
        by_file.setdefault(fname, []).append(name)
    out: dict[str, TensorInfo] = {}
    for fname, names in by_file.items():
        shard = d / fname
        if not shard.is_file():
            raise CheckpointError(f"{index_path} maps tensor '{names[0]}' to missing shard file {shard}")
        header = read_header(shard)
        for name in names:
            if name not in header:
                raise CheckpointError(f"{index_path} maps tensor '{name}' to {shard}, whose header lacks it")
        wanted = set(names)
        out.update((n, info) for n, info in header.items() if n in wanted)
    return out


def iter_tensors(
    ckpt_dir: str | os.PathLike,
    names: Iterable[str] | None = None,
    device: str | torch.device = "cpu",
) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream ``(name, tensor)`` pairs, one tensor in memory at a time, in storage order.

    ``names=None`` yields every tensor; otherwise only those (each unknown name raises
    CheckpointError before anything is read). Tensors keep their stored dtype and land on
    ``device``. Order is shard by shard, by file position -- not the order of ``names``.
    """
    index = tensor_index(ckpt_dir)
    if names is None:
        wanted = list(index)
    else:
        wanted = list(dict.fromkeys(names))
        for n in wanted:
            if n not in index:
                raise CheckpointError(f"tensor '{n}' not found in checkpoint {ckpt_dir}")
        keep = set(wanted)
        wanted = [n for n in index if n in keep]  # storage order
    plan: dict[str, list[str]] = {}
    for n in wanted:
        plan.setdefault(index[n].file, []).append(n)
    return _stream(plan, str(device))


def _stream(plan: dict[str, list[str]], device: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for file, names in plan.items():
        try:
            handle = safe_open(file, framework="pt", device=device)
        except Exception as e:  # safetensors raises its own SafetensorError / OSError
            raise CheckpointError(f"cannot open safetensors file {file}: {_one_line(e)}") from None
        with handle as f:
            for name in names:
                try:
                    t = f.get_tensor(name)
                except Exception as e:
                    raise CheckpointError(f"cannot read tensor '{name}' from {file}: {_one_line(e)}") from None
                yield name, t


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


# ----------------------------------------------------------------------------------- writing


def save_hf_dir(
    out_dir: str | os.PathLike,
    config: dict,
    tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    max_shard_bytes: int = 2 * 1024**3,
    metadata: dict | None = None,
) -> Path:
    """Write ``config.json`` + weights in the layout transformers reads; returns ``out_dir``.

    Tensors are taken in the given order and packed greedily into shards of at most
    ``max_shard_bytes`` (a single larger tensor gets a shard of its own). One shard is written
    as ``model.safetensors``; several as ``model-0000i-of-0000N.safetensors`` plus
    ``model.safetensors.index.json`` (``metadata.total_size`` = sum of tensor bytes, sorted
    ``weight_map``). Tensors are moved to CPU, made contiguous and cloned when they share or
    only partly cover a storage (tied weights, slices). Only one shard is held in memory at a
    time, so a generator of tensors streams. Weight files of an earlier save in ``out_dir``
    (``model*.safetensors``, the index) are removed first; other files are left alone.
    ``metadata`` goes into each safetensors header next to ``{"format": "pt"}``.
    """
    if max_shard_bytes <= 0:
        raise ConfigError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _remove_old_weights(out)
    st_meta = {"format": "pt", **{str(k): str(v) for k, v in (metadata or {}).items()}}
    items = tensors.items() if isinstance(tensors, Mapping) else tensors

    written: list[tuple[Path, list[str]]] = []
    shard: dict[str, torch.Tensor] = {}
    shard_bytes = total = 0
    seen: set[str] = set()
    ptrs: set[int] = set()  # storages already used by the current shard

    def flush() -> None:
        from safetensors.torch import save_file

        tmp = out / f".tmp-shard-{len(written) + 1:05d}.safetensors"
        save_file(shard, str(tmp), metadata=st_meta)
        written.append((tmp, list(shard)))
        shard.clear()
        ptrs.clear()

    for name, t in items:
        if name in seen:
            raise ValueError(f"save_hf_dir: duplicate tensor name '{name}'")
        seen.add(name)
        t = _prepare(t)
        nbytes = t.numel() * t.element_size()
        if shard and shard_bytes + nbytes > max_shard_bytes:
            flush()
            shard_bytes = 0
        if nbytes:
            if t.untyped_storage().data_ptr() in ptrs:
                t = t.clone()
            ptrs.add(t.untyped_storage().data_ptr())
        shard[name] = t
        shard_bytes += nbytes
        total += nbytes
    if shard or not written:
        flush()

    write_json(out / "config.json", config)
    n = len(written)
    weight_map: dict[str, str] = {}
    for i, (tmp, names) in enumerate(written, start=1):
        final = SINGLE_FILE if n == 1 else f"model-{i:05d}-of-{n:05d}.safetensors"
        shutil.copymode(out / "config.json", tmp)  # safetensors creates 0600 files; follow the umask
        os.replace(tmp, out / final)
        weight_map.update((name, final) for name in names)
    if n > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return out


def write_json(path: Path, data: dict) -> None:
    """Pretty JSON with a trailing newline; ``torch.dtype`` values are written as ``"float32"`` etc."""

    def default(o: object) -> object:
        if isinstance(o, torch.dtype):
            return str(o).removeprefix("torch.")
        if isinstance(o, Path):
            return str(o)
        raise TypeError(f"{type(o).__name__} is not JSON serializable")

    Path(path).write_text(json.dumps(data, indent=2, sort_keys=True, default=default) + "\n", encoding="utf-8")


def _prepare(t: torch.Tensor) -> torch.Tensor:
    """Detached, CPU, contiguous, owning its whole storage (a slice or view is cloned)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"save_hf_dir: expected torch.Tensor, got {type(t).__name__}")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    t = t.contiguous()
    nbytes = t.numel() * t.element_size()
    if nbytes and t.untyped_storage().nbytes() != nbytes:
        t = t.clone()
    return t


def _remove_old_weights(out: Path) -> None:
    for p in out.iterdir():
        if p.name in (SINGLE_FILE, INDEX_FILE) or _SHARD_RE.match(p.name) or p.name.startswith(".tmp-shard-"):
            p.unlink()
