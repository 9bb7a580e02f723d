"""Offline graph toolkit: capture (make_fx, real or FakeTensor), stable node ids, passes, pattern
rewrites, subgraph extraction and torch.compile experiments.

Never imported by the runtime path (models, engine, server); workbenches and the CLI use it.
"""

from torchinferno.graph.capture import (
    NODE_ID,
    assign_node_ids,
    module_path,
    node_id,
    nodes_by_id,
    op_histogram,
    trace_with_make_fx,
)
from torchinferno.graph.compile import CompileExperiment, compile_forward
from torchinferno.graph.model_forward import prefill_forward, prefill_inputs, trace_prefill
from torchinferno.graph.passes import (
    PassRegistry,
    PassReport,
    annotate_matching_nodes,
    dead_code_elimination,
    replace_call_function_targets,
    replace_call_module_targets,
)
from torchinferno.graph.patterns import PATTERNS, apply_pattern, replace_subgraph_pattern
from torchinferno.graph.subgraph import capture_boundary_values, extract_subgraph, parse_node_selection

__all__ = [
    "NODE_ID", "assign_node_ids", "module_path", "node_id", "nodes_by_id", "op_histogram", "trace_with_make_fx",
    "CompileExperiment", "compile_forward", "prefill_forward", "prefill_inputs", "trace_prefill",
    "PassRegistry", "PassReport", "annotate_matching_nodes", "dead_code_elimination",
    "replace_call_function_targets", "replace_call_module_targets",
    "PATTERNS", "apply_pattern", "replace_subgraph_pattern",
    "capture_boundary_values", "extract_subgraph", "parse_node_selection",
]
