"""PassRegistry, annotate_matching_nodes, replace_call_function_targets, replace_call_module_targets."""

import pytest
import torch
from torch import fx, nn

from torchinferno.errors import ConfigError
from torchinferno.graph.passes import (
    PassRegistry,
    annotate_matching_nodes,
    dead_code_elimination,
    replace_call_function_targets,
    replace_call_module_targets,
)


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x):
        unused = x * 3  # noqa: F841  (dead code for the DCE pass)
        return self.act(self.proj(x)) + torch.sigmoid(x)


def test_registry_runs_in_order_and_reports_changes():
    gm = fx.symbolic_trace(Toy())
    x = torch.randn(2, 4)
    reg = PassRegistry()
    reg.register("dce", dead_code_elimination, "drop unused nodes")
    reg.register("sigmoid-to-tanh", lambda g: replace_call_function_targets(g, {torch.sigmoid: torch.tanh}))
    reg.register("noop", lambda g: 0)
    reports = reg.run(gm)
    assert [r.name for r in reports] == ["dce", "sigmoid-to-tanh", "noop"]
    assert reports[0].changed == 1 and reports[0].nodes_after == reports[0].nodes_before - 1
    assert reports[1].changed == 1 and reports[1].op_delta == {"torch.sigmoid": -1, "torch.tanh": 1}
    assert reports[2].changed == 0 and reports[2].op_delta == {}
    assert torch.allclose(gm(x), gm.act(gm.proj(x)) + torch.tanh(x))
    with pytest.raises(ConfigError, match="already registered"):
        reg.register("dce", dead_code_elimination)
    with pytest.raises(ConfigError, match="valid: dce, sigmoid-to-tanh, noop"):
        reg.run(gm, only=["nope"])


def test_replace_call_module_targets_rewires_nodes():
    gm = fx.symbolic_trace(Toy())
    x = torch.randn(3, 4)
    n = replace_call_module_targets(gm, {"act": nn.GELU()})
    assert n == 1
    targets = [node.target for node in gm.graph.nodes if node.op == "call_module"]
    assert "act" not in targets and "act__replaced" in targets
    assert not hasattr(gm, "act") and isinstance(gm.act__replaced, nn.GELU)
    assert torch.allclose(gm(x), nn.functional.gelu(gm.proj(x)) + torch.sigmoid(x))
    with pytest.raises(ConfigError, match="called modules: act__replaced, proj"):
        replace_call_module_targets(gm, {"nope": nn.ReLU()})


def test_aten_target_replacement_and_annotation(traced_llama):
    import copy

    model, gm, inputs = traced_llama
    g = copy.deepcopy(gm)
    n_mm = sum(1 for n in g.graph.nodes if n.target is torch.ops.aten.mm.default)
    assert annotate_matching_nodes(g, r"aten\.mm", "hot") == n_mm
    assert annotate_matching_nodes(g, r"layers\.0\.mlp", "layer0_mlp") > 0
    assert all(n.meta.get("hot") for n in g.graph.nodes if n.target is torch.ops.aten.mm.default)
    calls = []

    def counted_silu(x):
        calls.append(1)
        return torch.ops.aten.silu.default(x)

    assert replace_call_function_targets(g, {torch.ops.aten.silu.default: counted_silu}) == model.config.num_hidden_layers
    with torch.no_grad():
        assert torch.equal(g(*inputs.args), gm(*inputs.args))
    assert len(calls) == model.config.num_hidden_layers
