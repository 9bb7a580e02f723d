"""A native read-bandwidth probe (``cpu_stream.c``): the CPU ceiling a decode GEMV streams against.

Why: torch's reductions and ``copy_`` under-measure a CPU's read bandwidth (a single accumulator chain per
thread; a copy also pays write-allocate traffic), so a decode step that streams its weights could read
"faster than the bound". The probe reads a buffer with loads only, many lines in flight per thread.

Built and cached by ``native_lib`` like ``cpu_gemv`` (nothing at import time); :func:`load` returns ``None`` where the CPU lacks
AVX2 or gcc is missing, and callers fall back to torch.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from torchinferno.kernels import native_lib

SOURCE = Path(__file__).with_name("cpu_stream.c")
CFLAGS = ["-O3", "-mavx2", "-fopenmp", "-shared", "-fPIC"]
ABI_VERSION = 1

_LIB = native_lib.NativeLibrary(native_lib.NativeSpec(
    what="native read-bandwidth probe", source=SOURCE, cflags=CFLAGS, cpu_flags=("avx2",),
    abi_symbol="ti_stream_abi_version", abi_version=ABI_VERSION, entry="ti_read_stream",
    argtypes=[ctypes.c_void_p, ctypes.c_int64, ctypes.c_int], restype=ctypes.c_uint64))


def load() -> ctypes._CFuncPtr | None:
    """``read(ptr, nbytes, nthreads) -> checksum``, built on first use; ``None`` when unavailable (never raises)."""
    return _LIB.load()
