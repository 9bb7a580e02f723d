"""Write a captured graph as ``graph.json`` / ``graph.txt`` / ``graph_module.py`` and re-trace runs.

``retrace_run`` is how every follow-up command gets "the same graph": it rebuilds the model and
prompts from ``run_config.json`` / ``input_ids.json``, traces again and checks the signature
against the recorded ``graph.json`` so node ids mean the same nodes (a mismatch is an error).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import fx, nn

from torchinferno.errors import ConfigError
from torchinferno.graph.model_forward import PrefillInputs, trace_prefill
from torchinferno.graph.node_table import graph_json, graph_signature, graph_table, node_records
from torchinferno.graph.standalone import module_source
from torchinferno.workbench.artifacts import ArtifactDir, load_run_dir
from torchinferno.workbench.run_config import RunConfig, build_model


def write_graph_artifacts(out: ArtifactDir, gm: fx.GraphModule, extra: dict | None = None, stem: str = "graph",
                          what: str = "one prefill forward") -> dict:
    """``<stem>.json`` (node records), ``<stem>.txt`` (table) and ``<stem>_module.py`` (standalone source)."""
    data = graph_json(gm, extra)
    out.json(f"{stem}.json", data, f"every ATen node of {what}: stable id, op, target, shapes/dtypes, users, module")
    out.text(f"{stem}.txt", graph_table(data["nodes"]), "the node table (id, op, target, shape, module) for reading and grep")
    header = (f'"""Generated ATen graph of {what} (make_fx). Node names match {stem}.json.\n\n'
              "Constants (weights) are passed to ``Graph(constants)`` by attribute name; ``profile-subgraph``\n"
              'cuts runnable pieces of a run\'s graph with their inputs recorded."""\n\n')
    out.python(f"{stem}_module.py", header + module_source(gm, "Graph"), "the graph as Python source (torch.ops.aten calls)")
    return data


@dataclass
class TracedRun:
    config: RunConfig
    model: nn.Module
    gm: fx.GraphModule
    inputs: PrefillInputs
    run_dir: Path | None


def retrace_run(run_dir: str | Path, device: str | None = None) -> TracedRun:
    """Rebuild and re-trace a ``profile-run``; raises ``ConfigError`` if the graph diverged."""
    run = load_run_dir(run_dir)
    cfg = RunConfig.from_dict(run["run_config"])
    moved = device is not None and device != cfg.device
    if moved:  # another device may lower to other ATen ops (e.g. SDPA kernels): ids are the new trace's
        cfg.device = device
        cfg.validate()
    model = build_model(cfg)
    gm, inputs = trace_prefill(model, run["input_ids"])
    recorded = (run["graph"] or {}).get("signature")
    if recorded is not None and not moved and recorded != graph_signature(gm):
        raise ConfigError(f"re-tracing {run_dir} gave a different graph (signature {graph_signature(gm)} != recorded "
                          f"{recorded}); the model code or torch version changed since the run")
    return TracedRun(cfg, model, gm, inputs, Path(run_dir))


def trace_config(cfg: RunConfig) -> TracedRun:
    """Build and trace a fresh configuration (no run directory)."""
    from torchinferno.workbench.run_config import make_prompts

    model = build_model(cfg)
    prompts = make_prompts(cfg, model.config.vocab_size)
    gm, inputs = trace_prefill(model, prompts)
    return TracedRun(cfg, model, gm, inputs, None)


def eager_vs_graph(run: TracedRun) -> float:
    """max |graph(inputs) - eager forward(inputs)| over the prefill logits."""
    from torchinferno.graph.model_forward import prefill_forward

    with torch.no_grad():
        ref = prefill_forward(run.model, run.inputs)(*run.inputs.args)
        got = run.gm(*run.inputs.args)
    return float((ref.double() - got.double()).abs().max())


__all__ = ["write_graph_artifacts", "retrace_run", "trace_config", "eager_vs_graph", "TracedRun", "node_records"]
