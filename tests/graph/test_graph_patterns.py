"""replace_subgraph_pattern: a real multi-node matcher; the fused-rmsnorm-swiglu pass replaces
exactly one site per decoder layer and keeps the logits equal."""

import copy

import pytest
import torch

from torchinferno.errors import ConfigError
from torchinferno.graph.capture import NODE_ID
from torchinferno.graph.patterns import apply_pattern, replace_subgraph_pattern



def _count(gm, target):
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is target)


def test_toy_pattern_replaced_and_numerics_kept():
    from torchinferno.graph.capture import trace_with_make_fx

    def f(x, y):
        return torch.relu(x * y + 1.0) * 2.0 + (x * y + 1.0)

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    gm = trace_with_make_fx(f, (x, y))
    ref = gm(x, y)
    matches = replace_subgraph_pattern(gm, lambda a, b: a * b + 1.0, lambda a, b: torch.addcmul(torch.ones_like(a), a, b),
                                       example_inputs=(x, y), tag="fma")
    # make_fx does no CSE: ``x * y + 1.0`` is computed twice, so there are two sites
    assert len(matches) == 2 and all(len(m["matched_ids"]) == 2 for m in matches)
    assert _count(gm, torch.ops.aten.mul.Tensor) == 1  # only the "* 2.0" is left
    assert torch.allclose(gm(x, y), ref)


@pytest.mark.parametrize("variant", [None, "v0"])
def test_fused_rmsnorm_swiglu_replaces_one_site_per_layer(traced_llama, variant):
    import torchinferno.kernels.custom_ops  # noqa: F401

    model, gm, inputs = traced_llama
    if variant is not None:
        from torchinferno.graph.model_forward import trace_prefill
        from torchinferno.testing import tiny_model

        model = tiny_model("llama3", variant=variant)
        gm, inputs = trace_prefill(model, inputs.prompts)
    layers = model.config.num_hidden_layers
    new = copy.deepcopy(gm)
    res = apply_pattern(new, "fused-rmsnorm-swiglu")
    assert res["replaced"] == layers
    fused = torch.ops.torchinferno.fused_rmsnorm_swiglu.default
    assert _count(new, fused) == layers
    assert _count(new, torch.ops.aten.silu.default) == 0 and _count(gm, torch.ops.aten.silu.default) == layers
    assert _count(gm, torch.ops.aten.mm.default) - _count(new, torch.ops.aten.mm.default) == layers
    silu_ids = {n.meta[NODE_ID] for n in gm.graph.nodes if n.target is torch.ops.aten.silu.default}
    assert silu_ids <= {i for m in res["matches"] for i in m["matched_ids"]}
    with torch.no_grad():
        assert torch.allclose(new(*inputs.args), gm(*inputs.args), atol=1e-5, rtol=0)


def test_swiglu_pattern_and_unknown_name(traced_llama):
    model, gm, inputs = traced_llama
    new = copy.deepcopy(gm)
    assert apply_pattern(new, "swiglu")["replaced"] == model.config.num_hidden_layers
    with torch.no_grad():
        assert torch.allclose(new(*inputs.args), gm(*inputs.args), atol=1e-6)
    with pytest.raises(ConfigError, match="valid: fused-rmsnorm-swiglu, rms-norm, swiglu"):
        apply_pattern(new, "nope")


def test_rms_norm_pattern_replaces_every_norm(traced_llama):
    model, gm, inputs = traced_llama
    new = copy.deepcopy(gm)
    res = apply_pattern(new, "rms-norm")
    assert res["replaced"] == 2 * model.config.num_hidden_layers + 1  # input + post-attention norms, final norm
    assert sum(1 for n in new.graph.nodes if n.target is torch.ops.torchinferno.rms_norm.default) == res["replaced"]
    with torch.no_grad():
        assert torch.allclose(new(*inputs.args), gm(*inputs.args), atol=1e-5, rtol=0)


def test_swiglu_pattern_matches_an_unprojected_gate_up_split():
    """A gate/up pair that is an input (no GEMM before the split) is still a swiglu site."""
    import torch.nn.functional as F

    from torchinferno.graph.capture import trace_with_make_fx

    def act(gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    x = torch.randn(3, 16)
    gm = trace_with_make_fx(act, (x,))
    assert apply_pattern(gm, "swiglu")["replaced"] == 1
    assert torch.allclose(gm(x), act(x), atol=1e-6)
