"""A native read-bandwidth probe (``cpu_stream.c``): the CPU ceiling a decode GEMV streams against.

Why: torch's reductions and ``copy_`` under-measure a CPU's read bandwidth (a single accumulator chain per
thread; a copy also pays write-allocate traffic), so a decode step that streams its weights could read
"faster than the bound". The probe reads a buffer with loads only, many lines in flight per thread.

Built and cached like ``cpu_gemv`` (nothing at import time); :func:`load` returns ``None`` where the CPU lacks
AVX2 or gcc is missing, and callers fall back to torch.
"""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

from torchinferno.kernels.cpu_gemv import build, cpu_supported

SOURCE = Path(__file__).with_name("cpu_stream.c")
CFLAGS = ["-O3", "-mavx2", "-fopenmp", "-shared", "-fPIC"]
ABI_VERSION = 1

_state: dict[str, object] = {}


def load() -> ctypes._CFuncPtr | None:
    """``read(ptr, nbytes, nthreads) -> checksum``, built on first use; ``None`` when unavailable (never raises)."""
    if "fn" in _state:
        return _state["fn"]  # type: ignore[return-value]
    fn = None
    ok, _ = cpu_supported(("avx2",))
    compiler = shutil.which("gcc")
    if ok and compiler is not None:
        try:
            from torchinferno.env import read_env

            path, _ = build(read_env().cache_dir, compiler, SOURCE, CFLAGS)
            lib = ctypes.CDLL(str(path))  # after `import torch`: shares torch's libgomp
            if lib.ti_stream_abi_version() != ABI_VERSION:
                raise RuntimeError(f"{path.name}: ABI mismatch")
            fn = lib.ti_read_stream
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
            fn.restype = ctypes.c_uint64
        except Exception:  # any build/load failure: the caller measures with torch
            fn = None
    _state["fn"] = fn
    return fn
