"""Our bf16 CPU GEMV (``cpu_gemv.c``, AVX512-BF16): build once, load with ctypes, wrap per weight.

Why: oneDNN's bf16 GEMV on pre-packed weights reads them at 15-24 GB/s on a 2-core AVX512-BF16
EPYC that streams 44-49 GB/s, and spends ~15 us of primitive setup per call; batch-1 decode is
those GEMVs. The C kernel streams a weight packed for ``vdpbf16ps`` (layout in the .c file's
header) with fp32 accumulation, and costs one ctypes call.

Availability: the CPU must report avx512f/bw/vl and avx512_bf16 in /proc/cpuinfo and ``gcc``
must build the source; otherwise :func:`load` returns ``None`` (the reason is logged once at
debug level and kept in :func:`unavailable_reason`) and callers keep oneDNN. Nothing is built at
import time: the first :func:`load` compiles into ``<cache>/kernels/cpu_gemv-<hash>.so`` (hash of
source, flags and compiler version; written to a temp file then renamed, so concurrent builders
never see a partial file) and later loads reuse it.

OpenMP: torch's CPU wheel ships ``torch/lib/libgomp.so.1`` and has it loaded by ``import torch``.
Our .so is linked against the soname ``libgomp.so.1`` and loaded (after torch) with ctypes, so the
dynamic loader binds it to that already-loaded runtime: one OpenMP thread pool shared with torch's
intra-op parallelism, not two pools fighting over the cores (checked by
``test_one_openmp_runtime``: /proc/self/maps lists a single libgomp).

Numerics (the .c file's invariant): each output is summed in fp32 over k in order (one lane, or with AMX tiles
32-wide chunks in order), bias added in fp32, rounded to bf16 once, independent of M, of the other rows and of
the thread count. AMX (Intel, opt-in with :func:`set_amx`) halves the GEMV's 8-row time (2.15 vs 4.08 ms for a
49152 x 576 head; 1 row equal) in the GEMV alone; in the whole decode step it was slower at batch 1, hence off by default.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from pathlib import Path
from typing import Callable, Iterator

import torch

from torchinferno.kernels import native_lib

SOURCE = Path(__file__).with_name("cpu_gemv.c")
# -mamx-*: the AMX path is compiled in (gcc >= 11) and taken only where CPUID and the kernel allow it at run time
CFLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mamx-tile", "-mamx-bf16", "-fopenmp",
          "-shared", "-fPIC"]
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")
ABI_VERSION = 2

Gemv = Callable[[torch.Tensor], torch.Tensor]  # x [M, K] bf16 -> y [M, N] bf16


def cpu_supported(needed: tuple[str, ...] = CPU_FLAGS) -> tuple[bool, str]:
    """(True, "") when /proc/cpuinfo lists every flag ``needed`` (default: this kernel's)."""
    return native_lib.cpu_supported(needed)


def build(cache_dir: Path, compiler: str = "gcc", source: Path = SOURCE, cflags: list[str] = CFLAGS) -> tuple[Path, bool]:
    """(path of the built .so, whether this call compiled it); reuses an existing build (``native_lib.build``)."""
    return native_lib.build(cache_dir, compiler, source, cflags)


def load() -> ctypes._CFuncPtr | None:
    """The kernel's entry point, built on first use; ``None`` when unavailable (never raises)."""
    return _LIB.load()


_amx_requested = [False]  # what set_amx was last asked (the C side's mode): amx_allowed restores it


@functools.cache
def amx_available() -> bool:
    """Whether AMX bf16 tiles can be used here (CPU flags, the kernel's permission, a build with them): fixed for
    the process, so probed once (``resolve_kernel("amx")`` asks for every packed linear); the current request is
    left as it was."""
    old = _amx_requested[0]
    try:
        return set_amx(True)
    finally:
        set_amx(old)


@contextlib.contextmanager
def amx_allowed(enabled: bool = True) -> Iterator[bool]:
    """Within this block AMX tiles are allowed (``enabled``) or forbidden; yields whether AMX is in use, and
    restores the previous request on exit. ``--cpu-gemv amx`` of bench-generate."""
    old = _amx_requested[0]
    try:
        yield set_amx(enabled)
    finally:
        set_amx(old)


def set_amx(enabled: bool) -> bool:
    """Allow or forbid (the default) the AMX tiles of this GEMV and of the native decode step (which includes it);
    returns whether AMX is in use now (False where the CPU or the kernel lacks it, or a library did not load).
    For A/B runs and tests: either path keeps the numerics invariants, but their roundings differ."""
    from torchinferno.kernels import cpu_decode_step

    _amx_requested[0] = bool(enabled)
    on = False
    for lib in (_LIB, cpu_decode_step._LIB):
        lib.load()
        fn = lib.symbol("ti_gemv_amx", [ctypes.c_int], ctypes.c_int)
        if fn is not None:
            on = bool(fn(int(enabled))) or on
    return on


def unavailable_reason() -> str:
    """Why :func:`load` returned ``None`` ("" if it did not, or was not called)."""
    return _LIB.unavailable_reason()


GROUP = 64  # output rows per packed group (the .c file's NBLK * 16)


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """W [N, K] bf16 -> Wp [NG, K2, 64, 2] (NG = ceil(N/64), K2 = ceil(K/2)), zero padded, contiguous."""
    N, K = w.shape
    NG, K2 = (N + GROUP - 1) // GROUP, (K + 1) // 2
    wpad = torch.zeros(NG * GROUP, K2 * 2, dtype=torch.bfloat16)
    wpad[:N, :K] = w.detach().to(torch.bfloat16)
    return wpad.view(NG, GROUP, K2, 2).permute(0, 2, 1, 3).contiguous()


def make_gemv(fn: ctypes._CFuncPtr, packed: torch.Tensor, n: int, k: int, bias: torch.Tensor | None = None,
              out_dtype: torch.dtype = torch.bfloat16) -> Gemv:
    """A plain call ``x [M, k] bf16 -> y [M, n] out_dtype`` on a weight packed by :func:`pack_weight`.

    ``out_dtype`` bf16 (rounded once, RNE) or float32 (the accumulator as is).

    The closure holds ``packed`` (and the fp32 bias), so their pointers stay valid for its lifetime.
    x must be bf16 on CPU; a row stride is allowed, the last dim must be contiguous.
    """
    wptr = packed.data_ptr()
    b32 = None if bias is None else bias.detach().float().contiguous()
    bptr = None if b32 is None else b32.data_ptr()
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"out_dtype must be bfloat16 or float32, not {out_dtype}")
    empty, bf16, nthreads, out32 = torch.empty, torch.bfloat16, torch.get_num_threads, int(out_dtype == torch.float32)

    def gemv(x: torch.Tensor) -> torch.Tensor:
        if x.dtype is not bf16 or not x.is_cpu:  # the kernel reads raw bf16 host memory
            raise TypeError(f"avx512bf16 GEMV needs a bf16 CPU input, got {x.dtype} on {x.device}")
        if x.stride(-1) != 1:
            x = x.contiguous()
        m = x.shape[0]
        y = empty((m, n), dtype=out_dtype)
        fn(x.data_ptr(), x.stride(0), wptr, bptr, y.data_ptr(), n, m, n, k, out32, nthreads())
        return y

    gemv.packed, gemv.bias32, gemv.out_dtype = packed, b32, out_dtype  # type: ignore[attr-defined]  # keep alive
    return gemv


def _self_test(fn: ctypes._CFuncPtr) -> None:
    """Guard against a miscompiled or mis-bound kernel: one small odd-shaped GEMV vs fp32 torch."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(37, 19, generator=g).to(torch.bfloat16)
    x = torch.randn(3, 19, generator=g).to(torch.bfloat16)
    y = make_gemv(fn, pack_weight(w), 37, 19)(x).float()
    ref = x.float() @ w.float().T
    if not torch.allclose(y, ref, atol=5e-2, rtol=2e-2):
        raise RuntimeError(f"self-test mismatch (max err {(y - ref).abs().max().item():.3g})")


_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_LIB = native_lib.NativeLibrary(native_lib.NativeSpec(
    what="avx512bf16 GEMV (oneDNN is used instead)", source=SOURCE, cflags=CFLAGS, cpu_flags=CPU_FLAGS,
    abi_symbol="ti_gemv_abi_version", abi_version=ABI_VERSION, entry="ti_gemv_bf16",
    # x, ldx, wp, bias, y, ldy, M, N, K, out_fp32, nthreads
    argtypes=[_PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, ctypes.c_int, ctypes.c_int], restype=None,
    self_test=_self_test))
