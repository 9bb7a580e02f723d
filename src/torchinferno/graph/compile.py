"""``compile_forward``: an explicit, offline ``torch.compile`` experiment on a callable.

Nothing is compiled at import time and no global compiler flag is touched; the compiled callable
lives only in the returned ``CompileExperiment``. ``run`` compares it with eager on the same
inputs (max abs error) and times both (median of ``iters`` after warmup, compile time reported
separately), which is what a candidate/promotion loop needs to decide whether compiling helps.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import torch

from torchinferno.errors import ConfigError
from torchinferno.graph.subgraph import max_abs_diff

BACKENDS = ("inductor", "aot_eager", "eager")


@dataclass
class CompileReport:
    backend: str
    mode: str | None
    compile_s: float
    eager_median_us: float
    compiled_median_us: float
    max_abs_diff: float
    iters: int
    extra: dict = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.eager_median_us / self.compiled_median_us if self.compiled_median_us > 0 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "speedup": round(self.speedup, 4)}


def _sync(args: Sequence[Any]) -> None:
    if any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
        torch.cuda.synchronize()


def time_callable(fn: Callable, args: Sequence[Any], iters: int = 10, warmup: int = 2) -> float:
    """Median wall time of ``fn(*args)`` in microseconds (device-synchronized)."""
    with torch.no_grad():
        for _ in range(warmup):
            fn(*args)
        _sync(args)
        times = []
        for _ in range(max(1, iters)):
            t0 = time.perf_counter()
            fn(*args)
            _sync(args)
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


@dataclass
class CompileExperiment:
    """An eager callable and its ``torch.compile``d twin (compiled lazily on first ``run``)."""

    fn: Callable
    backend: str = "inductor"
    mode: str | None = None
    dynamic: bool | None = False
    fullgraph: bool = False
    compiled: Callable | None = None

    def compile(self) -> Callable:
        if self.compiled is None:
            self.compiled = torch.compile(self.fn, backend=self.backend, mode=self.mode, dynamic=self.dynamic,
                                          fullgraph=self.fullgraph)
        return self.compiled

    def run(self, args: Sequence[Any], iters: int = 10) -> CompileReport:
        compiled = self.compile()
        with torch.no_grad():
            ref = self.fn(*args)
            t0 = time.perf_counter()
            out = compiled(*args)  # first call compiles
            _sync(args)
            compile_s = time.perf_counter() - t0
        err = max_abs_diff([out], [ref])
        return CompileReport(self.backend, self.mode, compile_s, time_callable(self.fn, args, iters),
                             time_callable(compiled, args, iters), err, iters)


def compile_forward(fn: Callable, backend: str = "inductor", mode: str | None = None, dynamic: bool | None = False,
                    fullgraph: bool = False) -> CompileExperiment:
    """Wrap ``fn`` (a model forward, a GraphModule, any callable) in a compile experiment.

    ``backend``: ``inductor`` (generates kernels; needs a C++ compiler on CPU), ``aot_eager`` or
    ``eager`` (graph capture only, cheap; useful to check that a forward compiles at all).
    """
    if backend not in BACKENDS:
        raise ConfigError(f"unknown torch.compile backend '{backend}' (valid: {', '.join(BACKENDS)})")
    return CompileExperiment(fn, backend, mode, dynamic, fullgraph)
