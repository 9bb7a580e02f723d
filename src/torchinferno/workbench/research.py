"""A small research harness: register named experiments, run them, compare their metrics.

An experiment is ``fn() -> dict[str, float | int | str]``. ``run`` executes the selected ones in
registration order, timing each and catching its failure (recorded as ``error``, the other
experiments still run); ``table`` renders the union of metric names as columns.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Callable

from torchinferno.errors import ConfigError

Experiment = Callable[[], dict]


@dataclass
class ExperimentResult:
    name: str
    metrics: dict = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class ResearchHarness:
    """Named experiments in registration order; names are unique."""

    def __init__(self) -> None:
        self._experiments: dict[str, tuple[Experiment, str]] = {}

    def register(self, name: str, fn: Experiment | None = None, description: str = ""):
        """``h.register("x", fn)`` or as a decorator ``@h.register("x")``."""
        if name in self._experiments:
            raise ConfigError(f"experiment '{name}' is already registered")
        if fn is None:
            def deco(f: Experiment) -> Experiment:
                self._experiments[name] = (f, description)
                return f
            return deco
        self._experiments[name] = (fn, description)
        return fn

    def names(self) -> list[str]:
        return list(self._experiments)

    def run(self, names: list[str] | None = None) -> list[ExperimentResult]:
        chosen = self.names() if names is None else names
        for n in chosen:
            if n not in self._experiments:
                raise ConfigError(f"unknown experiment '{n}' (valid: {', '.join(self.names())})")
        results = []
        for n in chosen:
            t0 = time.perf_counter()
            try:
                metrics = dict(self._experiments[n][0]() or {})
                err = None
            except Exception as e:  # an experiment failing is a result, not a crash of the harness
                metrics, err = {}, f"{type(e).__name__}: {e}".splitlines()[0]
                if not str(e):
                    err = traceback.format_exc().strip().splitlines()[-1]
            results.append(ExperimentResult(n, metrics, round(time.perf_counter() - t0, 4), err))
        return results

    @staticmethod
    def table(results: list[ExperimentResult]) -> str:
        cols: list[str] = []
        for r in results:
            cols += [k for k in r.metrics if k not in cols]
        head = ["experiment", *cols, "seconds", "error"]
        rows = [[r.name, *[_fmt(r.metrics.get(c, "")) for c in cols], _fmt(r.seconds), r.error or ""] for r in results]
        widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
        line = lambda vals: "  ".join(str(v).ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
        return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows)])


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def smoke_harness(model_kind: str = "llama3", tokens: int = 16, iters: int = 5, with_compile: bool = False) -> ResearchHarness:
    """The experiments ``research-smoke`` runs: eager vs captured graph vs pattern-rewritten graph."""
    import copy

    import torch

    from torchinferno.graph.compile import compile_forward, time_callable
    from torchinferno.graph.model_forward import prefill_forward, trace_prefill
    from torchinferno.graph.patterns import apply_pattern
    from torchinferno.graph.subgraph import max_abs_diff
    from torchinferno.testing import tiny_model

    model = tiny_model(model_kind)
    prompts = [list(range(1, tokens + 1))]
    gm, inputs = trace_prefill(model, prompts)
    eager = prefill_forward(model, inputs)
    with torch.no_grad():
        ref = eager(*inputs.args)
    h = ResearchHarness()

    @h.register("eager-forward")
    def _eager():
        return {"median_us": time_callable(eager, inputs.args, iters), "max_abs_err": 0.0}

    @h.register("aten-graph")
    def _graph():
        with torch.no_grad():
            err = max_abs_diff([gm(*inputs.args)], [ref])
        return {"median_us": time_callable(gm, inputs.args, iters), "max_abs_err": err, "nodes": len(gm.graph.nodes)}

    @h.register("pattern-fused-rmsnorm-swiglu")
    def _pattern():
        new = copy.deepcopy(gm)
        res = apply_pattern(new, "fused-rmsnorm-swiglu")
        with torch.no_grad():
            err = max_abs_diff([new(*inputs.args)], [ref])
        return {"median_us": time_callable(new, inputs.args, iters), "max_abs_err": err, "nodes": len(new.graph.nodes),
                "replaced": res["replaced"]}

    if with_compile:
        @h.register("torch-compile-eager-backend")
        def _compile():
            rep = compile_forward(gm, backend="eager").run(inputs.args, iters)
            return {"median_us": rep.compiled_median_us, "max_abs_err": rep.max_abs_diff, "compile_s": rep.compile_s}

    return h
