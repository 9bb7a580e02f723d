"""fused_rmsnorm_swiglu on CUDA (Triton add+norm, then a GEMM with a SwiGLU epilogue) vs its torch reference."""

from __future__ import annotations

import pytest
import torch

from torchinferno.kernels import custom_ops
from torchinferno.kernels.custom_ops import reference_fused_rmsnorm_swiglu


def _exact(x, res, w, gu, eps):
    """float64 of the same formula, for measuring both sides' error."""
    h = (x + res).double()  # the bf16 sum, as both sides normalize it
    n = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.double()
    g, u = (n @ gu.double().t()).chunk(2, -1)
    return g * torch.sigmoid(g) * u


@pytest.mark.cuda
@pytest.mark.parametrize("t,d,i", [(1, 256, 384), (7, 200, 1000), (300, 512, 384), (129, 1024, 2048)])
def test_cuda_fused_rmsnorm_swiglu_matches_reference(cuda_dev, t, d, i):
    g = torch.Generator(device=cuda_dev).manual_seed(t + d)
    bf = torch.bfloat16
    x = torch.randn(t, d, generator=g, device=cuda_dev).to(bf)
    res = torch.randn(t, d, generator=g, device=cuda_dev).to(bf)
    w = (torch.rand(d, generator=g, device=cuda_dev) + 0.5).to(bf)
    gu = (torch.randn(2 * i, d, generator=g, device=cuda_dev) * d**-0.5).to(bf)
    act, h = torch.ops.torchinferno.fused_rmsnorm_swiglu(x, res, w, gu, 1e-5)
    ref_act, ref_h = reference_fused_rmsnorm_swiglu(x, res, w, gu, 1e-5)
    assert act.shape == (t, i) and act.dtype == bf and torch.equal(h, ref_h)
    exact = _exact(x, res, w, gu, 1e-5)
    err, ref_err = (act.double() - exact).abs().max(), (ref_act.double() - exact).abs().max()
    assert err <= 2 * ref_err + 1e-3 * exact.abs().max(), (float(err), float(ref_err))
    from torchinferno.kernels.triton.gemm_swiglu import fused_rmsnorm_swiglu

    for epilogue in ("fused", "separate"):  # both forms the op dispatches between, at every size
        act2, h2 = fused_rmsnorm_swiglu(x, res, w, gu, 1e-5, epilogue=epilogue)
        err2 = (act2.double() - exact).abs().max()
        assert torch.equal(h2, ref_h) and err2 <= 2 * ref_err + 1e-3 * exact.abs().max(), (epilogue, float(err2))


@pytest.mark.cuda
def test_cuda_fused_op_passes_opcheck(cuda_dev):
    bf = torch.bfloat16
    x, res = torch.randn(5, 128, device=cuda_dev, dtype=bf), torch.randn(5, 128, device=cuda_dev, dtype=bf)
    w, gu = torch.rand(128, device=cuda_dev, dtype=bf), torch.randn(512, 128, device=cuda_dev, dtype=bf) * 0.1
    torch.library.opcheck(custom_ops.fused_rmsnorm_swiglu, (x, res, w, gu, 1e-5))
