"""Building and loading this directory's native CPU kernels (``cpu_*.c``), one way for all of them.

A kernel module declares a :class:`NativeSpec` (its source, compiler flags, the CPU flags its instructions need, its
ABI-version symbol and entry point) and keeps one :class:`NativeLibrary`. Invariants:

* nothing happens at import time; the first :meth:`NativeLibrary.load` builds (or reuses) the shared object;
* a build is cached under ``<cache_dir>/kernels/<stem>-<hash>.so``, the hash covering the source, the flags and the
  compiler's version, and appears atomically (readers see no file or a whole one);
* :meth:`NativeLibrary.load` never raises: ``None`` means "use the torch path", and
  :meth:`NativeLibrary.unavailable_reason` says why (CPU flags, no gcc, a build/ABI/self-test failure);
* the library is opened after ``import torch`` so its ``libgomp.so.1`` binds to torch's copy (one OpenMP runtime).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


def cpu_supported(needed: tuple[str, ...]) -> tuple[bool, str]:
    """(True, "") when /proc/cpuinfo lists every flag the kernel's instructions need (``needed``)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError as e:
        return False, f"cannot read /proc/cpuinfo ({e.strerror})"
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    missing = [f for f in needed if f not in flags]
    return (not missing, f"CPU lacks {', '.join(missing)}" if missing else "")


def library_path(cache_dir: Path, compiler: str, source: Path, cflags: Sequence[str]) -> Path:
    """Where the build for this source, these flags and this compiler version lives."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    h = hashlib.sha256(source.read_bytes())
    h.update(" ".join(cflags).encode())
    h.update(version.encode())
    return cache_dir / "kernels" / f"{source.stem}-{h.hexdigest()[:16]}.so"


def build(cache_dir: Path, compiler: str, source: Path, cflags: Sequence[str]) -> tuple[Path, bool]:
    """(path of the built .so, whether this call compiled it); reuses an existing build."""
    path = library_path(cache_dir, compiler, source, cflags)
    if path.exists():
        return path, False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp.so", dir=path.parent)
    os.close(fd)
    try:
        res = subprocess.run([compiler, *cflags, "-o", tmp, str(source)], check=False, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {res.stderr.strip()[-500:]}")
        os.replace(tmp, path)  # atomic: readers see no file or a whole one
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path, True


@dataclass(frozen=True)
class NativeSpec:
    """One native kernel: how to build it, check it and bind its entry point.

    ``cflags`` may be a callable (flags that depend on other files' contents, e.g. a hash of included sources).
    ``self_test(fn)`` raises when a freshly bound entry point computes wrong numbers (a miscompile, a wrong binding).
    """

    what: str  # for the debug line: "avx512bf16 GEMV"
    source: Path
    cflags: Sequence[str] | Callable[[], list[str]]
    cpu_flags: tuple[str, ...]
    abi_symbol: str
    abi_version: int
    entry: str
    argtypes: Sequence[type]
    restype: type | None
    self_test: Callable[[ctypes._CFuncPtr], None] | None = None

    def flags(self) -> list[str]:
        return list(self.cflags() if callable(self.cflags) else self.cflags)


class NativeLibrary:
    """The built, bound entry point of one :class:`NativeSpec`, loaded once per process."""

    def __init__(self, spec: NativeSpec):
        self.spec = spec
        self._loaded = False
        self._fn: ctypes._CFuncPtr | None = None
        self._lib: ctypes.CDLL | None = None
        self._reason = ""

    @classmethod
    def unavailable(cls, spec: NativeSpec, reason: str) -> "NativeLibrary":
        """A library that loads as ``None`` with ``reason`` (what a machine without the CPU flags sees; for tests)."""
        lib = cls(spec)
        lib._loaded, lib._reason = True, reason
        return lib

    def load(self) -> ctypes._CFuncPtr | None:
        """The entry point, built on first use; ``None`` when unavailable (never raises)."""
        if self._loaded:
            return self._fn
        s = self.spec
        fn = None
        ok, reason = cpu_supported(s.cpu_flags)
        compiler = shutil.which("gcc")
        if ok and compiler is None:
            ok, reason = False, "no gcc on PATH"
        if ok:
            try:
                from torchinferno.env import read_env

                path, _ = build(read_env().cache_dir, compiler, s.source, s.flags())
                fn = self._bind(path)
                if s.self_test is not None:
                    s.self_test(fn)
            except Exception as e:  # noqa: BLE001  # any build/load failure: the caller keeps its torch path
                fn, reason = None, f"{type(e).__name__}: {e}"
        if fn is None:
            log.debug("%s unavailable: %s", s.what, reason)
        self._fn, self._reason, self._loaded = fn, reason, True
        return fn

    def unavailable_reason(self) -> str:
        """Why :meth:`load` returned ``None`` ("" if it did not, or was not called)."""
        return self._reason

    def symbol(self, name: str, argtypes: Sequence[type], restype: type | None) -> ctypes._CFuncPtr | None:
        """Another function of the loaded library (None when it did not load, or was not loaded yet)."""
        if self._lib is None:
            return None
        fn = getattr(self._lib, name)
        fn.argtypes, fn.restype = list(argtypes), restype
        return fn

    def _bind(self, path: Path) -> ctypes._CFuncPtr:
        s = self.spec
        lib = self._lib = ctypes.CDLL(str(path))  # after `import torch`: binds libgomp.so.1 to torch's copy
        abi = getattr(lib, s.abi_symbol)()
        if abi != s.abi_version:
            raise RuntimeError(f"{path.name}: ABI {abi} != {s.abi_version}")
        fn = getattr(lib, s.entry)
        fn.argtypes = list(s.argtypes)
        fn.restype = s.restype
        return fn
