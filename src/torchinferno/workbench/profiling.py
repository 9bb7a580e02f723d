"""Measurement helpers shared by every profile command: environment, torch.profiler, memory.

``profile_calls`` runs a callable under ``torch.profiler`` and returns (result, key-average rows)
and writes a Chrome trace (``chrome_trace.json``: opens in Perfetto / chrome://tracing).
Memory: CUDA allocator statistics on a GPU, peak/current RSS of the process on CPU.
"""

from __future__ import annotations

import importlib.util
import platform
import resource
import sys
from pathlib import Path
from typing import Any, Callable

import torch


def _version(name: str) -> str | None:
    if importlib.util.find_spec(name) is None:
        return None
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "installed"


def environment() -> dict:
    import torchinferno

    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "torchinferno": getattr(torchinferno, "__version__", _version("torchinferno")),
        "cuda_available": cuda,
        "cuda_version": torch.version.cuda,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "cpu_threads": torch.get_num_threads(),
        "triton": _version("triton"),
        "helion": _version("helion"),
        "argv": sys.argv,
    }


def _activities(device: str) -> list:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def profile_calls(fn: Callable[[], Any], device: str, trace_path: str | Path | None, iters: int = 1,
                  label: str = "workload", record_shapes: bool = True) -> tuple[Any, list[dict]]:
    """Run ``fn`` ``iters`` times under torch.profiler; return (last result, operator rows).

    Rows are torch.profiler key averages sorted by self time (self CPU + self device), with
    microsecond totals, call counts and (when recorded) input shapes.
    """
    result = None
    with torch.profiler.profile(activities=_activities(device), record_shapes=record_shapes) as prof:
        for _ in range(iters):
            with torch.profiler.record_function(label):
                result = fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))
    return result, operator_rows(prof)


def operator_rows(prof) -> list[dict]:
    rows = []
    for e in prof.key_averages():
        dev_self = getattr(e, "self_device_time_total", 0.0) or 0.0
        rows.append({
            "name": e.key,
            "count": int(e.count),
            "self_cpu_us": round(float(e.self_cpu_time_total), 3),
            "cpu_total_us": round(float(e.cpu_time_total), 3),
            "self_device_us": round(float(dev_self), 3),
            "device_total_us": round(float(getattr(e, "device_time_total", 0.0) or 0.0), 3),
            "cpu_memory_bytes": int(getattr(e, "cpu_memory_usage", 0) or 0),
        })
    rows.sort(key=lambda r: r["self_cpu_us"] + r["self_device_us"], reverse=True)
    return rows


def reset_memory(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def memory_profile(device: str, extra: dict | None = None) -> dict:
    """Allocator stats on CUDA; peak (ru_maxrss) and current RSS on CPU. ``extra``: model/KV bytes.

    ``measured`` says which: on a CPU run there is no allocator to ask, so only process RSS is
    recorded (``cuda`` is absent) and the numbers include torch itself, not only the workload.
    """
    cuda = device.startswith("cuda")
    out: dict[str, Any] = {
        "device": device,
        "measured": ("CUDA caching-allocator statistics (peak since reset) + process RSS" if cuda else
                     "process RSS only: CUDA allocator statistics are unavailable on a CPU run"),
        **(extra or {}),
    }
    if cuda:
        torch.cuda.synchronize()
        stats = torch.cuda.memory_stats()
        out["cuda"] = {
            "max_memory_allocated": torch.cuda.max_memory_allocated(),
            "max_memory_reserved": torch.cuda.max_memory_reserved(),
            "memory_allocated": torch.cuda.memory_allocated(),
            "num_alloc_retries": stats.get("num_alloc_retries", 0),
            "num_ooms": stats.get("num_ooms", 0),
        }
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    out["cpu"] = {
        "peak_rss_bytes": peak_kib if sys.platform == "darwin" else peak_kib * 1024,
        "current_rss_bytes": _current_rss(),
        "note": "peak RSS of the whole process (includes torch itself), not only this workload",
    }
    return out


def _current_rss() -> int | None:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * resource.getpagesize()
    except Exception:
        return None


def model_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
