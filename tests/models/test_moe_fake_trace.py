"""MoE under fake tracing: the routing-independent expert form equals the grouped loop, and eager
forwards never take it (eager numerics stay the grouped loop's)."""

import torch
import torch.nn.functional as F

from torchinferno.models.common import moe


def _act(h):
    g, u = h.chunk(2, -1)
    return F.silu(g) * u


def test_all_experts_form_equals_grouped_loop():
    g = torch.Generator().manual_seed(0)
    T, D, I, E, K = 7, 16, 8, 6, 2
    x = torch.randn(T, D, generator=g)
    gate_up, down = torch.randn(E, 2 * I, D, generator=g) * 0.1, torch.randn(E, D, I, generator=g) * 0.1
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])  # expert 5 may get no token
    w = torch.rand(T, K, generator=g)
    want = moe.grouped_expert_mlp(x, ids, w, gate_up, down, _act)
    got = moe._all_experts_mlp(x, ids, w, gate_up, down, _act)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_eager_forward_never_takes_the_fake_form(monkeypatch):
    from torchinferno.graph.model_forward import prefill_forward, prefill_inputs
    from torchinferno.testing import tiny_model

    def boom(*a, **k):
        raise AssertionError("eager forward took the fake-tracing MoE form")

    monkeypatch.setattr(moe, "_all_experts_mlp", boom)
    model = tiny_model("dsv4")
    inputs = prefill_inputs([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        assert prefill_forward(model, inputs)(*inputs.args).isfinite().all()
