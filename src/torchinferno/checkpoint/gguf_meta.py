"""Open a GGUF file and read its metadata as plain Python values.

Invariants: a file that is missing, not GGUF, or cut short raises CheckpointError naming the
file; metadata values come back as ``int``/``float``/``bool``/``str`` or lists of those (nested
arrays are skipped); floats stored as float32 are rounded to their shortest decimal form, so
``1e-5`` reads as ``1e-05`` rather than ``9.999999747378752e-06``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torchinferno.errors import CheckpointError


def open_gguf(path: str | os.PathLike) -> Any:
    """A ``gguf.GGUFReader`` over ``path`` (memory-mapped, nothing dequantized yet)."""
    import gguf

    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"GGUF file not found: {p}")
    try:
        return gguf.GGUFReader(str(p))
    except Exception as e:  # the reader raises ValueError/IndexError/struct errors on bad files
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"cannot read GGUF file {p} (truncated or not GGUF?): {reason}") from None


def gguf_metadata(reader: Any) -> dict[str, Any]:
    """All key/value metadata of an open reader (``GGUF.*`` header counters excluded)."""
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field_value(field)
        if value is not None:
            out[key] = value
    return out


def field_value(field: Any) -> Any:
    """Decode one ``ReaderField`` to a Python value (None for empty or nested arrays)."""
    import gguf
    import numpy as np

    vt = gguf.GGUFValueType
    if not field.types:
        return None
    main = field.types[0]
    if main == vt.ARRAY:
        sub = field.types[-1] if len(field.types) > 1 else None
        if sub == vt.ARRAY or len(field.types) > 2:
            return None
        if sub == vt.STRING:
            return [_text(field.parts[i]) for i in field.data]
        if not field.data:
            return []
        flat = np.concatenate([np.asarray(field.parts[i]).reshape(-1) for i in field.data])
        if sub == vt.BOOL:
            return [bool(v) for v in flat.tolist()]
        if sub in (vt.FLOAT32, vt.FLOAT64):
            return _floats(flat)
        return [int(v) for v in flat.tolist()]
    part = field.parts[field.data[0]]
    if main == vt.STRING:
        return _text(part)
    return _scalar(part[0], main)


def _text(part: Any) -> str:
    raw = bytes(part)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="replace")


def _scalar(v: Any, vtype: Any) -> Any:
    import gguf
    import numpy as np

    vt = gguf.GGUFValueType
    if vtype == vt.BOOL:
        return bool(v)
    if vtype == vt.FLOAT32:
        return float(str(np.float32(v)))
    if vtype == vt.FLOAT64:
        return float(v)
    return int(v)


def _floats(arr: Any) -> list[float]:
    import numpy as np

    if arr.dtype == np.float32:
        return [float(str(np.float32(v))) for v in arr.tolist()]
    return [float(v) for v in arr.tolist()]
