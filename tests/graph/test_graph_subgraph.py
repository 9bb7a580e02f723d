"""Subgraph slices: standalone graphs whose boundary inputs come from the full graph; outputs
must equal the same nodes inside the full graph."""

import pytest
import torch

from torchinferno.errors import ConfigError
from torchinferno.graph.standalone import constants_of, module_source
from torchinferno.graph.subgraph import capture_boundary_values, extract_subgraph, max_abs_diff, parse_node_selection


def test_parse_selection_forms_and_errors():
    assert parse_node_selection("42:45", 100) == [42, 43, 44, 45]
    assert parse_node_selection("42,43", 100) == [42, 43]
    assert parse_node_selection(["42", "47", "1:2"], 100) == [1, 2, 42, 47]
    with pytest.raises(ConfigError, match=r"node id 100 is out of range \(valid: 0..99\)"):
        parse_node_selection("90:100", 100)
    with pytest.raises(ConfigError, match="cannot parse"):
        parse_node_selection("a-b", 100)
    with pytest.raises(ConfigError, match="end must be"):
        parse_node_selection("9:3", 100)


@pytest.mark.parametrize("sel", ["42:50", "20:120", "3,60,61", "0:10000"])
def test_slices_match_full_graph(traced_llama, sel):
    _, gm, inputs = traced_llama
    n = len(gm.graph.nodes)
    if sel == "0:10000":
        sel = f"0:{n - 1}"
    sub, spec = extract_subgraph(gm, parse_node_selection(sel, n))
    ins, expected = capture_boundary_values(gm, inputs.args, spec)
    assert len(ins) == len(spec.boundary_inputs) and len(expected) == len(spec.outputs) >= 1
    with torch.no_grad():
        assert max_abs_diff(sub(*ins), expected) <= 1e-6
    if sel.startswith("0:"):  # the whole graph: inputs are the placeholders, output is the logits
        assert [d["name"] for d in spec.boundary_inputs] == [p.name for p in gm.graph.nodes if p.op == "placeholder"]


def test_standalone_source_runs_without_fx(traced_llama):
    _, gm, inputs = traced_llama
    sub, spec = extract_subgraph(gm, range(30, 90))
    ins, expected = capture_boundary_values(gm, inputs.args, spec)
    ns: dict = {}
    exec(compile(module_source(sub, "Sub"), "<sub>", "exec"), ns)
    with torch.no_grad():
        out = ns["Sub"](constants_of(sub))(*ins)
    assert max_abs_diff(out, expected) <= 1e-6


def test_selection_without_compute_nodes_is_an_error(traced_llama):
    _, gm, _ = traced_llama
    with pytest.raises(ConfigError, match="no compute nodes"):
        extract_subgraph(gm, [0, 1])
