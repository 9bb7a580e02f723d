"""Same-run hardware ceilings: memory copy bandwidth (read + write) and matmul rate."""

from __future__ import annotations

import time

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: str | torch.device = "cpu", nbytes: int = 512 * 1024**2, iters: int = 5) -> float:
    """Bytes/s of ``dst.copy_(src)`` on a buffer far larger than caches, counting read + write."""
    device = torch.device(device)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(device)
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best


def read_bandwidth(device: str | torch.device = "cpu", nbytes: int = 2 * 1024**3, iters: int = 5) -> float:
    """Bytes/s of a full reduction (``sum``) over a buffer far larger than caches: reads only.

    Informational next to ``copy_bandwidth``: a GEMV streams its weights read-only, and HBM reads
    alone can run faster than a copy's mixed reads and writes. Bounds use the copy figure.
    """
    device = torch.device(device)
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).fill_(1.0)
    src.sum()
    _sync(device)
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        src.sum()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return src.numel() * 2 / best


def matmul_rate(device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16, n: int = 2048, iters: int = 5) -> float:
    """FLOP/s of an ``n x n x n`` matmul (best of ``iters``)."""
    device = torch.device(device)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    _sync(device)
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best
