"""``profile-pattern``: the reference ATen graph vs the same graph with a library pattern replaced.

``comparison.json``: how many sites were replaced (and their original node ids), the op-count
delta, max abs error of the replaced graph vs the reference, median times and the speedup.
``pattern_repro.py`` re-checks replacement count and numerics through ``check_pattern``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from torchinferno.workbench.artifacts import ArtifactDir


def _rewrite(gm, pattern: str):
    from torchinferno.graph.patterns import apply_pattern

    new = copy.deepcopy(gm)
    return new, apply_pattern(new, pattern)


def check_pattern(run_config: dict, input_ids: list[list[int]], pattern: str, tolerance: float, expected_replaced: int) -> dict:
    """Rebuild, re-trace, rewrite and compare (what ``pattern_repro.py`` runs)."""
    from torchinferno.graph.model_forward import trace_prefill
    from torchinferno.graph.subgraph import max_abs_diff
    from torchinferno.workbench.run_config import RunConfig, build_model

    model = build_model(RunConfig.from_dict(run_config))
    gm, inputs = trace_prefill(model, input_ids)
    new, res = _rewrite(gm, pattern)
    with torch.no_grad():
        err = max_abs_diff([new(*inputs.args)], [gm(*inputs.args)])
    ok = res["replaced"] == expected_replaced and err <= tolerance
    return {"ok": ok, "replaced": res["replaced"], "expected_replaced": expected_replaced, "max_abs_error": err,
            "tolerance": tolerance}


def profile_pattern(out_dir: str | Path, pattern: str, source_run: str | Path | None = None, cfg=None,
                    iters: int = 20, device: str | None = None) -> dict:
    from torchinferno.graph.capture import op_histogram
    from torchinferno.graph.compile import time_callable
    from torchinferno.graph.node_table import graph_json, graph_table
    from torchinferno.graph.patterns import get_pattern
    from torchinferno.graph.subgraph import max_abs_diff
    from torchinferno.workbench.graph_artifacts import retrace_run, trace_config
    from torchinferno.workbench.profiling import profile_calls
    from torchinferno.workbench.repro_templates import call_repro
    from torchinferno.workbench.subgraph_run import tolerance_for

    spec = get_pattern(pattern)
    run = retrace_run(source_run, device) if source_run is not None else trace_config(cfg)
    ref = run.gm
    new, res = _rewrite(ref, pattern)
    args = run.inputs.args
    with torch.no_grad():
        err = max_abs_diff([new(*args)], [ref(*args)])
    tol = tolerance_for(next(run.model.parameters()).dtype)
    out = ArtifactDir(out_dir, "profile-pattern")
    ref_us, new_us = time_callable(ref, args, iters), time_callable(new, args, iters)
    for tag, gm in (("reference", ref), ("replaced", new)):
        _, ops = profile_calls(lambda: gm(*args), run.config.device, out.path(f"chrome_trace_{tag}.json"),
                               iters=max(1, iters // 4), label=f"{tag}-graph")
        out.existing(f"chrome_trace_{tag}.json", "chrome-trace", f"torch.profiler trace of the {tag} graph")
        out.json(f"operator_profile_{tag}.json", {"workload": f"{tag} graph", "operators": ops}, f"key averages, {tag} graph")
    before, after = op_histogram(ref), op_histogram(new)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(before) | set(after)) if after.get(k, 0) != before.get(k, 0)}
    cmp = {
        "pattern": pattern, "description": spec.description, "replacement_op": spec.replacement_op,
        "replaced": res["replaced"], "matches": res["matches"], "op_delta": delta,
        "reference_nodes": len(ref.graph.nodes), "replaced_nodes": len(new.graph.nodes),
        "reference_median_us": round(ref_us, 3), "replaced_median_us": round(new_us, 3),
        "speedup": round(ref_us / new_us, 4) if new_us > 0 else None,
        "max_abs_error": err, "tolerance": tol, "ok": res["replaced"] > 0 and err <= tol, "iters": iters,
        "source_run": str(source_run) if source_run else None,
    }
    out.json("comparison.json", cmp, "reference vs replaced graph: sites replaced, op delta, speedup, max error")
    g = graph_json(new, {"pattern": pattern})
    out.json("replaced_graph.json", g, "the rewritten graph (original ids kept; new nodes have id null)")
    out.text("replaced_graph.txt", graph_table(g["nodes"]), "the rewritten graph as a readable table")
    repro_args = {"run_config": run.config.to_dict(), "input_ids": run.inputs.prompts, "pattern": pattern,
                  "tolerance": tol, "expected_replaced": res["replaced"]}
    out.python("pattern_repro.py", call_repro(f"Pattern {pattern}", "pattern_repro.py", "torchinferno.workbench.pattern_run",
                                              "check_pattern", repro_args), "re-checks replacement count and numerics")
    return out.finish(**{k: cmp[k] for k in ("pattern", "replaced", "speedup", "max_abs_error", "ok")})
