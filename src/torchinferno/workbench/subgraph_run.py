"""``profile-subgraph``: cut a node-id slice of a run's graph, run it standalone, compare, profile.

Artifacts: ``subgraph_spec.json`` (selected nodes, boundary inputs, outputs, constants, the
comparison ``max_abs_diff_vs_source`` against the same nodes inside the full graph, timing),
``subgraph.json``/``subgraph.txt`` (node table), ``subgraph_tensors.pt`` (constants, inputs,
expected outputs), ``operator_profile.json``, ``chrome_trace.json``, ``subgraph_repro.py``.
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


def profile_subgraph(out_dir: str | Path, source_run: str | Path, nodes: str | Sequence[str], device: str | None = None,
                     iters: int = 20) -> dict:
    """Extract ``nodes`` of ``source_run``'s graph into ``out_dir``; returns the manifest."""
    from torchinferno.graph.compile import time_callable
    from torchinferno.graph.node_table import graph_json, graph_signature, graph_table
    from torchinferno.graph.standalone import module_source
    from torchinferno.graph.subgraph import capture_boundary_values, extract_subgraph, max_abs_diff, parse_node_selection, snapshot
    from torchinferno.workbench.graph_artifacts import retrace_run
    from torchinferno.workbench.profiling import profile_calls
    from torchinferno.workbench.repro_templates import graph_repro

    run = retrace_run(source_run, device)
    num_nodes = len(run.gm.graph.nodes)
    ids = parse_node_selection(nodes, num_nodes)
    sub, spec = extract_subgraph(run.gm, ids)
    inputs, expected = capture_boundary_values(run.gm, run.inputs.args, spec)
    out = ArtifactDir(out_dir, "profile-subgraph")
    save_graph_case(out, "subgraph_tensors.pt", sub, inputs, expected, "constants, boundary inputs and expected outputs")

    with torch.no_grad():
        actual = sub(*snapshot(inputs))
    diff = max_abs_diff(actual, expected)
    tol = tolerance_for(next(run.model.parameters()).dtype)
    work = snapshot(inputs)  # in-place ops inside the slice may mutate their inputs: time on a copy
    median_us = time_callable(sub, work, iters)
    _, ops = profile_calls(lambda: sub(*work), run.config.device, out.path("chrome_trace.json"), iters=max(1, iters // 4),
                           label="subgraph")
    out.existing("chrome_trace.json", "chrome-trace", "torch.profiler trace of the subgraph (open in ui.perfetto.dev)")
    out.json("operator_profile.json", {"workload": "subgraph", "operators": ops}, "torch.profiler key averages of the subgraph")

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
    table = graph_json(sub)
    out.json("subgraph.json", table, "the subgraph's node table (original ids kept in meta)")
    out.text("subgraph.txt", graph_table(table["nodes"]), "the subgraph as a readable table")
    out.python("subgraph_repro.py",
               graph_repro(module_source(sub, "Subgraph"), "Subgraph", "subgraph_repro.py", "subgraph_tensors.pt",
                           f"Subgraph {sel} of {Path(source_run).name}", tol),
               "standalone script: runs the subgraph on the recorded inputs and checks the outputs")
    return out.finish(nodes=len(spec.nodes), boundary_inputs=len(spec.boundary_inputs), outputs=len(spec.outputs),
                      max_abs_diff_vs_source=diff, ok=diff <= tol, median_us=round(median_us, 3))
