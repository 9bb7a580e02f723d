"""``profile-subgraph``: cut a node-id slice of a run's graph, run it standalone, compare, profile.

Artifacts: ``source_graph.json`` (the re-traced source graph the ids refer to),
``subgraph_spec.json`` (selected nodes, boundary inputs, outputs, constants, the comparison
``max_abs_diff_vs_source`` against the same nodes inside the full graph, timing),
``subgraph_graph.json|txt|_module.py`` (the cut graph: node table and standalone source),
``output.json`` (shape/dtype/summary of each output and its difference from the full graph),
``subgraph_tensors.pt`` (constants, inputs, expected outputs), ``operator_profile.json``,
``chrome_trace.json``, ``memory_profile.json`` and ``subgraph_repro.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from torchinferno.workbench.artifacts import ArtifactDir


def tolerance_for(dtype: torch.dtype) -> float:
    return 1e-5 if dtype in (torch.float32, torch.float64) else 2e-2


def save_graph_case(out: ArtifactDir, name: str, gm, inputs: Sequence, expected: Sequence, description: str) -> None:
    """``torch.save`` constants + inputs + expected outputs of a standalone graph (for its repro)."""
    from torchinferno.graph.standalone import constants_of

    torch.save({"constants": constants_of(gm), "inputs": list(inputs), "expected": list(expected)}, out.path(name))
    out.existing(name, "torch-save", description)


def output_summary(actual: Sequence, expected: Sequence) -> list[dict]:
    """Per output: shape, dtype, sum / max |x| and the max abs difference from the expected value."""
    from torchinferno.graph.subgraph import max_abs_diff

    def flat(v):
        return [x for item in v for x in flat(item)] if isinstance(v, (list, tuple)) else [v]

    rows = []
    for i, (a, e) in enumerate(zip(flat(list(actual)), flat(list(expected)))):
        if not isinstance(a, torch.Tensor):
            rows.append({"index": i, "value": repr(a)[:200], "expected": repr(e)[:200]})
            continue
        af = a.detach().double()
        rows.append({"index": i, "shape": list(a.shape), "dtype": str(a.dtype),
                     "sum": float(af.sum()) if a.numel() else 0.0, "max_abs": float(af.abs().max()) if a.numel() else 0.0,
                     "max_abs_diff_vs_source": max_abs_diff([a], [e])})
    return rows


def profile_subgraph(out_dir: str | Path, source_run: str | Path, nodes: str | Sequence[str], device: str | None = None,
                     iters: int = 20) -> dict:
    """Extract ``nodes`` of ``source_run``'s graph into ``out_dir``; returns the manifest."""
    from torchinferno.graph.compile import time_callable
    from torchinferno.errors import ConfigError
    from torchinferno.graph.node_table import graph_json, graph_signature
    from torchinferno.graph.standalone import module_source
    from torchinferno.graph.subgraph import capture_boundary_values, extract_subgraph, max_abs_diff, parse_node_selection, snapshot
    from torchinferno.workbench.graph_artifacts import retrace_run, write_graph_artifacts
    from torchinferno.workbench.profiling import memory_profile, profile_calls, reset_memory
    from torchinferno.workbench.repro_templates import graph_repro

    if iters < 1:
        raise ConfigError(f"--iters must be >= 1, got {iters}")
    run = retrace_run(source_run, device)
    num_nodes = len(run.gm.graph.nodes)
    ids = parse_node_selection(nodes, num_nodes)
    sub, spec = extract_subgraph(run.gm, ids)
    inputs, expected = capture_boundary_values(run.gm, run.inputs.args, spec)
    out = ArtifactDir(out_dir, "profile-subgraph")
    out.json("source_graph.json", graph_json(run.gm, {"source_run": str(Path(source_run).resolve()),
                                                      "device": run.config.device}),
             "the source run's graph as re-traced here (the node ids --nodes refers to)")
    save_graph_case(out, "subgraph_tensors.pt", sub, inputs, expected, "constants, boundary inputs and expected outputs")

    with torch.no_grad():
        actual = sub(*snapshot(inputs))
    diff = max_abs_diff(actual, expected)
    tol = tolerance_for(next(run.model.parameters()).dtype)
    out.json("output.json", {"outputs": output_summary(actual, expected), "max_abs_diff_vs_source": diff,
                             "tolerance": tol, "ok": diff <= tol},
             "each subgraph output (shape, dtype, summary) and its difference from the same nodes in the full graph")
    work = snapshot(inputs)  # in-place ops inside the slice may mutate their inputs: time on a copy
    reset_memory(run.config.device)
    median_us = time_callable(sub, work, iters)
    _, ops = profile_calls(lambda: sub(*work), run.config.device, out.path("chrome_trace.json"), iters=max(1, iters // 4),
                           label="subgraph")
    out.existing("chrome_trace.json", "chrome-trace", "torch.profiler trace of the subgraph (open in ui.perfetto.dev)")
    out.json("operator_profile.json", {"workload": "subgraph", "operators": ops}, "torch.profiler key averages of the subgraph")
    out.json("memory_profile.json", memory_profile(run.config.device),
             "allocator statistics (CUDA) or process RSS (CPU) around the subgraph's timing and profile")

    sel = nodes if isinstance(nodes, str) else " ".join(nodes)
    data = {
        "source_run": str(Path(source_run).resolve()),
        "source_signature": graph_signature(run.gm),
        "source_num_nodes": num_nodes,
        "selection": sel,
        "node_ids": ids,
        "max_abs_diff_vs_source": diff,
        "tolerance": tol,
        "ok": diff <= tol,
        "median_us": round(median_us, 3),
        "iters": iters,
        **spec.to_dict(),
    }
    out.json("subgraph_spec.json", data, "selected nodes, boundary inputs, outputs, constants and the comparison vs the full graph")
    write_graph_artifacts(out, sub, {"source_run": str(Path(source_run).resolve()), "selection": sel}, stem="subgraph_graph",
                          what=f"the subgraph {sel} (original node ids kept)")
    out.python("subgraph_repro.py",
               graph_repro(module_source(sub, "Subgraph"), "Subgraph", "subgraph_repro.py", "subgraph_tensors.pt",
                           f"Subgraph {sel} of {Path(source_run).name}", tol, run.config.device),
               "standalone script: runs the subgraph on the recorded inputs and checks the outputs")
    return out.finish(nodes=len(spec.nodes), boundary_inputs=len(spec.boundary_inputs), outputs=len(spec.outputs),
                      max_abs_diff_vs_source=diff, ok=diff <= tol, median_us=round(median_us, 3))
