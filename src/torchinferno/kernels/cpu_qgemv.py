"""Our block-quantized CPU GEMV (``cpu_qgemv.c``, AVX512-VNNI) on GGUF Q8_0 / Q4_0 / Q4_1 weights.

The weights stay in their GGUF blocks of 32 (the file's own bytes when a model comes from a GGUF,
or ``gguf.quants.quantize``'s for a float model), repacked losslessly once into the kernel's
layout (the .c file's header); a call quantizes the activation to int8 per block (llama.cpp's
scheme) and multiplies on the quantized bytes: nothing is dequantized per call.

Built and loaded like ``cpu_gemv`` (same cache, same libgomp binding, nothing at import time);
:func:`load` returns ``None`` where the CPU lacks avx512f/bw/vl/vnni or gcc cannot build it.

Formats (``GGUF_TYPES``), one row of K values = K / 32 blocks, byte layouts as in ggml:
  q8_0: 34 bytes = d fp16, 32 int8 q;            w = d q
  q4_0: 18 bytes = d fp16, 16 bytes of nibbles;   w = d (q - 8)
  q4_1: 20 bytes = d, m fp16, 16 bytes of nibbles; w = d q + m
(nibbles: byte j's low half is value j, its high half value j + 16).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from torchinferno.kernels import native_lib

SOURCE = Path(__file__).with_name("cpu_qgemv.c")
CFLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mavx512bf16", "-fopenmp", "-shared", "-fPIC"]
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16")
ABI_VERSION = 1
QK = 32  # values per block
GROUP = 16  # output rows per packed group


@dataclass(frozen=True)
class BlockFormat:
    """One GGUF block type: its name, bytes per block of 32, the kernel's weight bits and offset."""

    name: str
    block_bytes: int
    bits: int
    ggml_type: int  # gguf.GGMLQuantizationType value


GGUF_TYPES: dict[str, BlockFormat] = {
    "q4_0": BlockFormat("q4_0", 18, 4, 2),
    "q4_1": BlockFormat("q4_1", 20, 4, 3),
    "q8_0": BlockFormat("q8_0", 34, 8, 8),
}
BY_GGML_TYPE = {f.ggml_type: f for f in GGUF_TYPES.values()}

QGemv = Callable[[torch.Tensor], torch.Tensor]  # x [M, K] bf16/fp32 -> y [M, N]


def load() -> ctypes._CFuncPtr | None:
    """The kernel's entry point, built on first use; ``None`` when unavailable (never raises)."""
    return _LIB.load()


def unavailable_reason() -> str:
    """Why :func:`load` returned ``None`` ("" if it did not, or was not called)."""
    return _LIB.unavailable_reason()


def quantize_weight(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """W [N, K] float -> GGUF blocks [N, K / 32 * block_bytes] uint8 (``gguf.quants.quantize``, ggml's reference)."""
    from gguf.quants import quantize

    f = GGUF_TYPES[fmt]
    raw = quantize(w.detach().float().contiguous().numpy(), f.ggml_type)
    return torch.from_numpy(raw.copy()).view(torch.uint8).reshape(w.shape[0], -1)


def dequantize_blocks(raw: torch.Tensor, fmt: str) -> torch.Tensor:
    """GGUF blocks [N, KB * block_bytes] uint8 -> W [N, K] float32 (``gguf.quants.dequantize``: the reference)."""
    from gguf.quants import dequantize

    arr = dequantize(raw.contiguous().numpy(), GGUF_TYPES[fmt].ggml_type)
    return torch.from_numpy(arr.copy()).float().reshape(raw.shape[0], -1)


def _unpack_blocks(raw: torch.Tensor, f: BlockFormat) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GGUF blocks [N, KB * bytes] -> (u [N, KB, 32] uint8, d [N, KB] fp16, c [N, KB] fp16), w = d u + c exactly."""
    N = raw.shape[0]
    blk = raw.reshape(N, -1, f.block_bytes)  # [N, KB, bytes]
    d = blk[..., 0:2].contiguous().view(torch.float16)[..., 0]  # [N, KB]
    if f.name == "q8_0":
        u = (blk[..., 2:].contiguous().view(torch.int8).to(torch.int16) + 128).to(torch.uint8)
        c = d * -128  # power-of-two multiple: exact in fp16
    else:
        qs = blk[..., (4 if f.name == "q4_1" else 2):]  # [N, KB, 16]
        u = torch.cat((qs & 0x0F, qs >> 4), dim=-1)  # value j = low nibble of byte j, j + 16 = high nibble
        c = blk[..., 2:4].contiguous().view(torch.float16)[..., 0] if f.name == "q4_1" else d * -8
    return u, d, c


def pack_blocks(raw: torch.Tensor, fmt: str) -> torch.Tensor:
    """GGUF blocks [N, K / 32 * block_bytes] uint8 -> the kernel's layout [NG, KB, WB + 64] uint8 (lossless)."""
    f = GGUF_TYPES[fmt]
    N = raw.shape[0]
    u, d, c = _unpack_blocks(raw, f)
    KB = u.shape[1]
    NG = (N + GROUP - 1) // GROUP
    if NG * GROUP != N:  # zero rows: d = c = 0, so they contribute exactly 0
        pad = NG * GROUP - N
        u = torch.cat((u, u.new_zeros(pad, KB, QK)))
        d, c = torch.cat((d, d.new_zeros(pad, KB))), torch.cat((c, c.new_zeros(pad, KB)))
    if f.bits == 8:  # [NG, r, KB, chunk j, t] -> [NG, KB, j, r, t]
        w = u.view(NG, GROUP, KB, 8, 4).permute(0, 2, 3, 1, 4).reshape(NG, KB, 512)
    else:  # k = 8 j + 4 h + t -> byte (j, r, t) = lo(h = 0) | hi(h = 1) << 4
        v = u.view(NG, GROUP, KB, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)  # [NG, KB, j, r, t, h]
        w = (v[..., 0] | (v[..., 1] << 4)).reshape(NG, KB, 256)
    dd = d.view(NG, GROUP, KB).permute(0, 2, 1).contiguous().view(torch.uint8)  # [NG, KB, 32]
    cc = c.view(NG, GROUP, KB).permute(0, 2, 1).contiguous().view(torch.uint8)
    return torch.cat((w, dd, cc), dim=-1).contiguous()


def make_qgemv(fn: ctypes._CFuncPtr, packed: torch.Tensor, fmt: str, n: int, k: int,
               bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> QGemv:
    """A plain call ``x [M, k] (bf16 or fp32, CPU) -> y [M, n] out_dtype`` on a weight packed by :func:`pack_blocks`.

    The closure holds ``packed`` and the fp32 bias, so their pointers stay valid for its lifetime.
    """
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"out_dtype must be bfloat16 or float32, not {out_dtype}")
    if k % QK:
        raise ValueError(f"quantized GEMV needs in_features % {QK} == 0, got {k}")
    bits, wptr = GGUF_TYPES[fmt].bits, packed.data_ptr()
    b32 = None if bias is None else bias.detach().float().contiguous()
    bptr = None if b32 is None else b32.data_ptr()
    empty, nthreads, out32 = torch.empty, torch.get_num_threads, int(out_dtype == torch.float32)
    bf16, f32 = torch.bfloat16, torch.float32

    def qgemv(x: torch.Tensor) -> torch.Tensor:
        if (x.dtype is not bf16 and x.dtype is not f32) or not x.is_cpu:
            raise TypeError(f"quantized GEMV needs a bf16/fp32 CPU input, got {x.dtype} on {x.device}")
        if x.stride(-1) != 1:
            x = x.contiguous()
        m = x.shape[0]
        y = empty((m, n), dtype=out_dtype)
        if fn(x.data_ptr(), x.stride(0), int(x.dtype is f32), wptr, bits, bptr, y.data_ptr(), n, m, n, k, out32,
              nthreads()):
            raise MemoryError("quantized GEMV: cannot allocate its activation scratch")
        return y

    qgemv.packed, qgemv.bias32, qgemv.out_dtype = packed, b32, out_dtype  # type: ignore[attr-defined]  # keep alive
    return qgemv


def reference_qgemv(x: torch.Tensor, raw: torch.Tensor, fmt: str, bias: torch.Tensor | None = None) -> torch.Tensor:
    """What the kernel computes, in float64 torch: x quantized per block as the .c file says, W dequantized by gguf."""
    x32 = x.float()
    M, K = x32.shape
    xb = x32.view(M, K // QK, QK)
    amax = xb.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0).div(amax), torch.zeros_like(amax))  # not 127 / t: torch
    # computes a scalar over a tensor as 127 * (1 / t), one more rounding than the kernel's 127.0f / amax
    q = torch.round(xb * inv)  # ties to even, as the kernel's cvtps
    xq = (q * amax.div(127.0)).view(M, K)  # dx * q, dx in fp32 as the kernel
    y = xq.double() @ dequantize_blocks(raw, fmt).double().T
    return y if bias is None else y + bias.double()


def _self_test(fn: ctypes._CFuncPtr) -> None:
    """Guard against a miscompiled or mis-bound kernel: odd N, M = 5, every format, vs the reference."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(37, 64, generator=g)
    x = torch.randn(5, 64, generator=g).to(torch.bfloat16)
    for fmt in GGUF_TYPES:
        raw = quantize_weight(w, fmt)
        y = make_qgemv(fn, pack_blocks(raw, fmt), fmt, 37, 64, out_dtype=torch.float32)(x).double()
        ref = reference_qgemv(x, raw, fmt)
        if not torch.allclose(y, ref, atol=1e-3, rtol=1e-4):
            raise RuntimeError(f"self-test mismatch for {fmt} (max err {(y - ref).abs().max().item():.3g})")


_I64, _PTR, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
_LIB = native_lib.NativeLibrary(native_lib.NativeSpec(
    what="quantized CPU GEMV", source=SOURCE, cflags=CFLAGS, cpu_flags=CPU_FLAGS,
    abi_symbol="ti_qgemv_abi_version", abi_version=ABI_VERSION, entry="ti_qgemv",
    # x, ldx, x_fp32, wp, bits, bias, y, ldy, M, N, K, out_fp32, nthreads
    argtypes=[_PTR, _I64, _INT, _PTR, _INT, _PTR, _PTR, _I64, _I64, _I64, _I64, _INT, _INT], restype=_INT,
    self_test=_self_test))
