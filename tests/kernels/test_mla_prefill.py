"""MLA prefill through the flash-eligible form (kernels/mla_prefill.py): values zero-padded to the qk head dim, plain
causal SDPA (no mask tensor) == the reference ``mla_expanded_attention``; masked calls are the reference itself. On
CUDA (skipped without) the padded form runs under the flash backend alone (it is eligible) at DeepSeek's head dims."""

from __future__ import annotations

import pytest
import torch

from torchinferno.kernels.mla_prefill import expanded_attention
from torchinferno.models.common.mla import mla_expanded_attention


def _inputs(Q, S, H, dn, dv, R, r, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q_nope = torch.randn(Q, H, dn, generator=g)
    q_pe = torch.randn(Q, H, r, generator=g)
    latent = torch.randn(S, R + r, generator=g)
    w = torch.randn(H * (dn + dv), R, generator=g) * R**-0.5
    return [t.to(device=device, dtype=dtype) for t in (q_nope, q_pe, latent, w)]


def _rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("dn,dv,r", [(16, 16, 8), (12, 20, 4), (8, 24, 8)])  # dv > dn + r: falls back
def test_padded_values_equal_the_reference(dtype, tol, dn, dv, r):
    q_nope, q_pe, latent, w = _inputs(37, 37, 3, dn, dv, 32, r, dtype, "cpu")
    scale = (dn + r) ** -0.5
    got = expanded_attention(q_nope, q_pe, latent, w, scale, None, pad_v=True)
    want = mla_expanded_attention(q_nope.float(), q_pe.float(), latent.float(), w.float(), scale, None)
    assert got.shape == (37, 3, dv) and got.dtype == dtype
    assert _rel(got, want) <= tol


def test_masked_calls_are_the_reference():
    q_nope, q_pe, latent, w = _inputs(5, 12, 2, 8, 8, 16, 4, torch.float32, "cpu", seed=1)
    mask = torch.arange(12)[None, :] <= (7 + torch.arange(5))[:, None]
    got = expanded_attention(q_nope, q_pe, latent, w, 0.3, mask, pad_v=True)
    assert torch.equal(got, mla_expanded_attention(q_nope, q_pe, latent, w, 0.3, mask))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prefill_runs_the_flash_backend_cuda():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q_nope, q_pe, latent, w = _inputs(1000, 1000, 16, 128, 128, 512, 64, torch.bfloat16, "cuda")
    scale = 192**-0.5
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # raises if the padded form were not flash-eligible
        got = expanded_attention(q_nope, q_pe, latent, w, scale, None)
    want = mla_expanded_attention(q_nope.float(), q_pe.float(), latent.float(), w.float(), scale, None)
    assert _rel(got, want) <= 2e-2
