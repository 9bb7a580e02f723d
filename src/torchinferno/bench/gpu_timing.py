"""CUDA timing helpers for the GPU benchmarks: events, graph replays, wall clock, kernel profiles."""

from __future__ import annotations

import statistics
import time

import torch


# ------------------------------------------------------------------------------------- timing
def cuda_time_ms(fn, iters: int = 20, warmup: int = 3, hold_us: float = 0.0) -> float:
    """Median milliseconds of ``fn()`` measured with CUDA events around each call (``hold_us``: see
    :func:`device_time_ms`)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if hold_us > 0:
            torch.cuda._sleep(int(hold_us * 2000))  # >= hold_us at SM clocks up to 2 GHz
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def device_time_ms(fn, iters: int = 20, warmup: int = 3, hold_us: float = 2000.0) -> float:
    """Median device milliseconds of ``fn()`` with the host's issue time taken out: each timed call is queued
    behind a spin kernel (``torch.cuda._sleep``, about ``hold_us``) so that all of its work is queued before
    the device reaches the start event (the blocking-kernel method of NVBench). The interval is then the
    device executing ``fn``'s work back to back, as in a pipelined loop where the host runs ahead."""
    return cuda_time_ms(fn, iters, warmup, hold_us=hold_us)


def graph_time_ms(fn, calls: int = 20, iters: int = 10, fallback: bool = True) -> float:
    """Device milliseconds per ``fn()`` with launch overhead removed: ``calls`` calls captured in one
    CUDA graph, replays timed with events. Falls back to ``cuda_time_ms`` when capture fails (``fallback=False``:
    the capture's exception propagates, for a caller that reports it)."""
    try:
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(calls):
                fn()
    except Exception:
        torch.cuda.synchronize()
        if not fallback:
            raise
        return cuda_time_ms(fn, iters=iters)
    return cuda_time_ms(g.replay, iters=iters, warmup=2) / calls


def wall_time_ms(fn, iters: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


_KERNEL_GROUPS = (
    ("attention", ("_decode_stage", "_prefill_kernel", "flash", "fmha", "attention", "sdpa", "cudnn")),
    ("gemm", ("gemm", "gemv", "cutlass", "nvjet", "xmma", "sm90", "splitk", "cublas", "dot_kernel")),
    ("rms_norm", ("_rms_norm",)), ("rotary", ("_rotary",)), ("swiglu", ("_swiglu",)), ("kv_append", ("_kv_append",)),
)


def profile_kernels(fn, warmup: int = 2) -> dict:
    """Device time of one ``fn()`` per kernel group (from torch.profiler's CUDA kernel events)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    groups: dict[str, float] = {}
    counts: dict[str, int] = {}
    top: dict[str, float] = {}
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        name = ev.name
        us = ev.device_time_total  # for a device event: the kernel's own duration
        low = name.lower()
        grp = next((g for g, keys in _KERNEL_GROUPS if any(k in low for k in keys)), "other")
        groups[grp] = groups.get(grp, 0.0) + us / 1e3
        counts[grp] = counts.get(grp, 0) + 1
        top[name[:80]] = top.get(name[:80], 0.0) + us / 1e3
    total = sum(groups.values())
    return {"kernel_ms": total, "groups_ms": groups, "kernel_counts": counts,
            "top": dict(sorted(top.items(), key=lambda kv: -kv[1])[:8])}


def _fmt_profile(p: dict) -> str:
    parts = [f"{g} {ms:.2f} ms/{p['kernel_counts'][g]}" for g, ms in sorted(p["groups_ms"].items(), key=lambda kv: -kv[1])]
    return f"kernels {p['kernel_ms']:.2f} ms: " + ", ".join(parts)
