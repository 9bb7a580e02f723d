"""A tiny sampling profiler over every Python thread (``sys._current_frames``), by category.

cProfile sees one thread; a server request crosses three (client loop, HTTP server loop, engine
thread). Sampling each thread's stack every ``interval_s`` and bucketing the innermost
recognisable frame ("scheduler", "model forward", "http framework", "json", "idle" ...) gives
where wall time goes per thread, at a cost of ~1-3% of one core.
"""

from __future__ import annotations

import linecache
import re
import sys
import threading
import time
from collections import Counter

__all__ = ["ThreadSampler", "categorize"]

# (substring of the frame's filename, category); first match walking from the innermost frame.
_RULES = (
    ("torchinferno/bench/synthetic_engine", "synthetic step"),
    ("torchinferno/engine/scheduler", "scheduler"),
    ("torchinferno/cache/", "kv block pool"),
    ("torchinferno/engine/model_runner", "model forward"),
    ("torchinferno/models/", "model forward"),
    ("torchinferno/kernels/", "model forward"),
    ("torchinferno/text/", "detokenize/sampling"),
    ("torchinferno/engine/output_processor", "detokenize/sampling"),
    ("torchinferno/engine/async_engine", "engine dispatch"),
    ("torchinferno/engine/", "engine loop"),
    ("torchinferno/server/", "server handlers"),
    ("torchinferno/bench/", "benchmark client"),
    ("/torch/", "model forward"),
    ("pydantic", "validation"),
    ("/json/", "json"),
    ("prometheus_client", "metrics"),
    ("starlette", "http framework"),
    ("fastapi", "http framework"),
    ("uvicorn", "http framework"),
    ("h11", "http framework"),
    ("httptools", "http framework"),
    ("httpx", "http client"),
    ("httpcore", "http client"),
    ("anyio", "event loop"),
    ("asyncio", "event loop"),
)
_IDLE = ("selectors.py", "queue.py", "threading.py")
# A blocking call into C (SimpleQueue.get, Event.wait, select, ...) leaves the caller's frame on
# top: its current source line tells that the thread is waiting, not computing.
_BLOCKING_LINE = re.compile(r"\.(get|wait|acquire|join|select|poll)\(")


def categorize(frame) -> str:
    inner = frame.f_code.co_filename.replace("\\", "/")
    if inner.endswith(_IDLE) and frame.f_code.co_name in ("select", "get", "wait", "_wait_for_tstate_lock", "acquire", "poll"):
        return "idle (waiting)"
    if "synthetic_engine" not in inner and _BLOCKING_LINE.search(linecache.getline(frame.f_code.co_filename, frame.f_lineno)):
        return "idle (waiting)"
    f = frame
    while f is not None:
        name = f.f_code.co_filename.replace("\\", "/")
        for key, cat in _RULES:
            if key in name:
                return cat
        f = f.f_back
    return "other"


class ThreadSampler:
    """``with ThreadSampler() as s: ...``; then ``s.report()`` -> {thread: {category: percent}}."""

    def __init__(self, interval_s: float = 0.002):
        self.interval_s = interval_s
        self.counts: dict[str, Counter] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="thread-sampler", daemon=True)

    def _loop(self) -> None:
        me = threading.get_ident()
        while not self._stop.is_set():
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = names.get(ident, f"thread-{ident}")
                self.counts.setdefault(name, Counter())[categorize(frame)] += 1
            time.sleep(self.interval_s)

    def __enter__(self) -> "ThreadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(2)

    def report(self, top: int = 6) -> dict[str, dict[str, float]]:
        out = {}
        for name, c in sorted(self.counts.items()):
            total = sum(c.values())
            if total == 0:
                continue
            out[name] = {cat: round(100.0 * n / total, 1) for cat, n in c.most_common(top)}
        return out
