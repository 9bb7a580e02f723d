"""Custom ops in torch.ops.torchinferno: numerics vs kernels/reference.py, fake impls, opcheck."""

import pytest
import torch
import torch.nn.functional as F

from torchinferno.kernels import custom_ops
from torchinferno.kernels.reference import ref_rms_norm, ref_swiglu


def _inputs(dtype, T=6, D=32, inter=24):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    return r(T, D), r(T, D), (torch.rand(D, generator=g) + 0.5).to(dtype), r(2 * inter, D) * 0.1


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
def test_ops_match_reference(dtype, tol):
    x, res, w, gu = _inputs(dtype)
    assert torch.allclose(torch.ops.torchinferno.rms_norm(x, w, 1e-5).float(), ref_rms_norm(x, w, 1e-5).float(), atol=tol)
    gate_up = x.repeat(1, 2)
    assert torch.equal(torch.ops.torchinferno.swiglu_activation(gate_up), ref_swiglu(gate_up))
    act, h = torch.ops.torchinferno.fused_rmsnorm_swiglu(x, res, w, gu, 1e-5)
    assert act.shape == (6, 24) and act.dtype == dtype and torch.equal(h, x + res)
    # independent composition: residual add -> RMSNorm -> gate/up GEMM -> silu(gate) * up
    hf = (x + res).float()
    normed = (w.float() * hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype)
    gate, up = F.linear(normed, gu).float().chunk(2, -1)
    assert torch.allclose(act.float(), F.silu(gate) * up, atol=tol * 4, rtol=tol)


def test_ops_trace_with_fake_tensors():
    from torch.fx.experimental.proxy_tensor import make_fx

    x, res, w, gu = _inputs(torch.float32)
    gm = make_fx(lambda *a: torch.ops.torchinferno.fused_rmsnorm_swiglu(*a, 1e-5), tracing_mode="fake")(x, res, w, gu)
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.torchinferno.fused_rmsnorm_swiglu.default in ops
    out = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.torchinferno.fused_rmsnorm_swiglu.default][0]
    assert [tuple(v.shape) for v in out.meta["val"]] == [(6, 24), (6, 32)]


def test_opcheck():
    x, res, w, gu = _inputs(torch.float32, T=3, D=8, inter=4)
    torch.library.opcheck(custom_ops.rms_norm, (x, w, 1e-5))
    torch.library.opcheck(custom_ops.swiglu_activation, (gu.t().contiguous(),))
    torch.library.opcheck(custom_ops.fused_rmsnorm_swiglu, (x, res, w, gu, 1e-5))
