"""``profile-pattern``: a reference ATen graph vs the same graph with a library pattern replaced.

The reference is either a model's prefill graph (``--source-run`` or model flags) or, with
``--hidden-size H --tokens T``, the standalone ``PatternBlock`` at ``[T, H]`` (no model). The
kernel replacement registry (``graph.patterns.apply_pattern``) rewrites a copy; both callables
are checked against each other, timed and profiled.

Artifacts: ``reference_graph.json|txt`` and ``optimized_graph.json|txt`` (node tables; replaced
nodes keep their original ids, new nodes have id null), ``pass_report.json`` (pattern instances
tried, sites replaced with their original node ids, op-count delta), ``reference_profile.json`` /
``optimized_profile.json`` (torch.profiler key averages), ``chrome_trace_reference.json`` /
``chrome_trace_optimized.json``, ``memory_profile.json``, ``comparison.json`` (sites replaced, max
abs error, median times, speedup, ok) and ``pattern_repro.py`` (re-checks replacement count and
numerics from scratch through ``check_pattern`` / ``check_synthetic_pattern``).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from torchinferno.errors import ConfigError
from torchinferno.workbench.artifacts import ArtifactDir

DEFAULT_PATTERN = "fused-rmsnorm-swiglu"


def _rewrite(gm, pattern: str):
    from torchinferno.graph.patterns import apply_pattern

    new = copy.deepcopy(gm)
    return new, apply_pattern(new, pattern)


def _verdict(gm, args, pattern: str, tolerance: float, expected_replaced: int) -> dict:
    from torchinferno.graph.subgraph import max_abs_diff

    new, res = _rewrite(gm, pattern)
    with torch.no_grad():
        err = max_abs_diff([new(*args)], [gm(*args)])
    ok = res["replaced"] == expected_replaced and err <= tolerance
    return {"ok": ok, "replaced": res["replaced"], "expected_replaced": expected_replaced, "max_abs_error": err,
            "tolerance": tolerance}


def check_pattern(run_config: dict, input_ids: list[list[int]], pattern: str, tolerance: float, expected_replaced: int) -> dict:
    """Rebuild, re-trace, rewrite and compare a model's graph (what a model-mode ``pattern_repro.py`` runs)."""
    from torchinferno.graph.model_forward import trace_prefill
    from torchinferno.workbench.run_config import RunConfig, build_model

    model = build_model(RunConfig.from_dict(run_config).validate())
    gm, inputs = trace_prefill(model, input_ids)
    return _verdict(gm, inputs.args, pattern, tolerance, expected_replaced)


def check_synthetic_pattern(shape: dict, pattern: str, tolerance: float, expected_replaced: int) -> dict:
    """Rebuild, re-trace, rewrite and compare the ``PatternBlock`` (a ``--hidden-size`` ``pattern_repro.py``)."""
    from torchinferno.workbench.pattern_block import PatternShape, trace_block

    gm, args = trace_block(PatternShape(**shape).validate())
    return _verdict(gm, args, pattern, tolerance, expected_replaced)


def _op_delta(ref, new) -> dict[str, int]:
    from torchinferno.graph.capture import op_histogram

    before, after = op_histogram(ref), op_histogram(new)
    return {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(before) | set(after)) if after.get(k, 0) != before.get(k, 0)}


def profile_pattern(out_dir: str | Path, pattern: str = DEFAULT_PATTERN, source_run: str | Path | None = None, cfg=None,
                    iters: int = 20, device: str | None = None, shape=None) -> dict:
    """Profile ``pattern`` on a run's graph, a fresh ``cfg``'s graph or (``shape``) the standalone block."""
    from torchinferno.graph.compile import time_callable
    from torchinferno.graph.node_table import graph_json, graph_table
    from torchinferno.graph.patterns import get_pattern
    from torchinferno.graph.subgraph import max_abs_diff
    from torchinferno.workbench.profiling import memory_profile, profile_calls, reset_memory
    from torchinferno.workbench.repro_templates import call_repro
    from torchinferno.workbench.subgraph_run import tolerance_for

    spec = get_pattern(pattern)
    if iters < 1:
        raise ConfigError(f"--iters must be >= 1, got {iters}")
    if shape is not None:
        if source_run is not None or cfg is not None:
            raise ConfigError("--hidden-size profiles the pattern standalone; do not combine it with --source-run/--model-kind/--model")
        from torchinferno.workbench.pattern_block import trace_block

        shape.validate()
        ref, args = trace_block(shape)
        dtype = args[0].dtype
        dev, workload = shape.device, f"standalone PatternBlock at T={shape.tokens}, H={shape.hidden_size}, I={shape.inter}"
        repro_func, repro_base = "check_synthetic_pattern", {"shape": shape.to_dict()}
    else:
        from torchinferno.workbench.graph_artifacts import retrace_run, trace_config

        run = retrace_run(source_run, device) if source_run is not None else trace_config(cfg)
        ref, args, dev = run.gm, run.inputs.args, run.config.device
        dtype = next(run.model.parameters()).dtype
        workload = f"prefill graph of {run.config.model or run.config.model_kind}" + (f" (run {source_run})" if source_run else "")
        repro_func, repro_base = "check_pattern", {"run_config": run.config.to_dict(), "input_ids": run.inputs.prompts}
    new, res = _rewrite(ref, pattern)
    with torch.no_grad():
        err = max_abs_diff([new(*args)], [ref(*args)])
    tol = tolerance_for(dtype)
    out = ArtifactDir(out_dir, "profile-pattern")
    reset_memory(dev)
    ref_us, new_us = time_callable(ref, args, iters), time_callable(new, args, iters)
    for tag, gm in (("reference", ref), ("optimized", new)):
        _, ops = profile_calls(lambda: gm(*args), dev, out.path(f"chrome_trace_{tag}.json"), iters=max(1, iters // 4),
                               label=f"{tag}-graph")
        out.existing(f"chrome_trace_{tag}.json", "chrome-trace", f"torch.profiler trace of the {tag} graph")
        out.json(f"{tag}_profile.json", {"workload": f"{tag} graph: {workload}", "operators": ops},
                 f"torch.profiler key averages of the {tag} graph")
        g = graph_json(gm, {"pattern": pattern, "role": tag})
        out.json(f"{tag}_graph.json", g, f"the {tag} graph" + (" (original ids kept; new nodes have id null)" if tag == "optimized" else ""))
        out.text(f"{tag}_graph.txt", graph_table(g["nodes"]), f"the {tag} graph as a readable table")
    out.json("memory_profile.json", memory_profile(dev), "allocator statistics (CUDA) or process RSS (CPU) around the timings")
    delta = _op_delta(ref, new)
    out.json("pass_report.json", {"pattern": pattern, "description": spec.description, "replacement_op": spec.replacement_op,
                                  "instances_tried": [i.label for i in spec.instantiate(ref)], "replaced": res["replaced"],
                                  "matches": res["matches"], "op_delta": delta},
             "what the kernel replacement pass did: instances tried, sites replaced (original node ids), op delta")
    cmp = {
        "pattern": pattern, "description": spec.description, "replacement_op": spec.replacement_op, "workload": workload,
        "device": dev, "replaced": res["replaced"], "matches": res["matches"], "op_delta": delta,
        "reference_nodes": len(ref.graph.nodes), "optimized_nodes": len(new.graph.nodes),
        "reference_median_us": round(ref_us, 3), "optimized_median_us": round(new_us, 3),
        "speedup": round(ref_us / new_us, 4) if new_us > 0 else None,
        "max_abs_error": err, "tolerance": tol, "ok": res["replaced"] > 0 and err <= tol, "iters": iters,
        "source_run": str(source_run) if source_run else None,
    }
    out.json("comparison.json", cmp, "reference vs optimized graph: sites replaced, op delta, speedup, max error")
    repro_args = {**repro_base, "pattern": pattern, "tolerance": tol, "expected_replaced": res["replaced"]}
    out.python("pattern_repro.py", call_repro(f"Pattern {pattern}", "pattern_repro.py", "torchinferno.workbench.pattern_run",
                                              repro_func, repro_args), "re-checks replacement count and numerics from scratch")
    return out.finish(**{k: cmp[k] for k in ("pattern", "replaced", "speedup", "max_abs_error", "ok")}, workload=workload)
