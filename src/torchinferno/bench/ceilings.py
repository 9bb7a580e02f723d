"""Same-run hardware ceilings: memory copy and read bandwidth, matmul rate."""

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
    """Bytes/s of reading a buffer far larger than caches, loads only (best of ``iters``).

    A decode GEMV streams its weights read-only, and reads alone can run faster than a copy's mixed reads and
    writes. On CPU the native probe (kernels/cpu_stream.c: many lines in flight per thread, all
    ``torch.get_num_threads()`` threads) measures it; torch's ``sum`` (the fallback, and the GPU path) keeps one
    accumulator chain per thread and under-reads a CPU's memory system. CPU decode bounds use this figure.
    """
    device = torch.device(device)
    if device.type == "cpu":
        from torchinferno.kernels.cpu_stream import load

        fn = load()
        if fn is not None:
            buf = torch.ones(nbytes, dtype=torch.uint8)
            fn(buf.data_ptr(), nbytes, torch.get_num_threads())
            best = float("inf")
            for _ in range(iters):
                t0 = time.perf_counter()
                fn(buf.data_ptr(), nbytes, torch.get_num_threads())
                best = min(best, time.perf_counter() - t0)
            return nbytes / best
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
    """FLOP/s of an ``n x n x n`` matmul (best of ``iters``, each timed alone after a sync: a burst).

    A GPU runs such a single product at its boost clock; under a longer stream of products it may
    be held to its power limit at a lower clock: see :func:`sustained_matmul_rate`.
    """
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


def sustained_matmul_rate(device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16, n: int = 2048,
                          seconds: float = 0.05, iters: int = 10) -> float:
    """FLOP/s of ``n x n x n`` matmuls issued back to back for about ``seconds`` per timed run (median of ``iters``
    runs, repeated without pauses).

    The ceiling for work that keeps the matrix units busy that long (a 2048-token prefill of an 8B model is
    ~50 ms): on a power-capped GPU the clock under such a stream settles below the one a single product sees.
    On CUDA the products are one graph (no launch gaps); elsewhere a plain loop.
    """
    import statistics

    device = torch.device(device)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    one = 2 * n**3 / matmul_rate(device, dtype, n, iters=2)
    calls = max(1, round(seconds / one))

    def stream():
        for _ in range(calls):
            torch.mm(a, b, out=out)

    run = stream
    if device.type == "cuda":
        g = torch.cuda.CUDAGraph()
        stream()
        torch.cuda.synchronize(device)
        with torch.cuda.graph(g):
            stream()
        run = g.replay
    run()
    _sync(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        run()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 * calls / statistics.median(times)
