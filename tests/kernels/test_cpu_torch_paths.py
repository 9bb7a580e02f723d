"""The torch (CPU) paths of ``kernels.api``'s element-wise entry points vs ``kernels.reference``.

These paths are rewritten for per-op overhead (LayerNorm of ``[x, -x]`` for RMSNorm, full-width
rope tables with one roll); the fp64 oracles catch a wrong sign, half or eps.
"""

from __future__ import annotations

import pytest
import torch

from torchinferno.kernels import api
from torchinferno.kernels.reference import ref_rms_norm, ref_rotary_neox, ref_swiglu

TOL = {torch.float32: 2e-6, torch.bfloat16: 1.6e-2}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 576), (8, 64), (3, 5, 48)])
def test_rms_norm_matches_reference(dtype, shape):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(*shape, generator=g) * 3).to(dtype)
    r = torch.randn(*shape, generator=g).to(dtype)
    w = (torch.rand(shape[-1], generator=g) + 0.5).to(dtype)
    for eps in (1e-5, 1e-1):  # a large eps shows up if it is dropped or scaled wrongly
        y = api.rms_norm(x, w, eps)
        assert y.dtype == dtype and y.shape == x.shape
        assert rel_err(y, ref_rms_norm(x.double(), w.double(), eps)) < TOL[dtype]
        y2, h = api.add_rms_norm(x, r, w, eps)
        assert torch.equal(h, x + r)
        assert rel_err(y2, ref_rms_norm(h.double(), w.double(), eps)) < TOL[dtype]


def test_rms_norm_small_rows_and_fp32_exactness():
    # near-zero rows: eps dominates; fp32 agrees with the oracle elementwise, not only in norm
    x = torch.tensor([[1e-4, -2e-4, 3e-4, 0.0], [1.0, 2.0, -3.0, 4.0]])
    w = torch.tensor([1.0, 0.5, 2.0, -1.0])
    torch.testing.assert_close(api.rms_norm(x, w, 1e-5), ref_rms_norm(x.double(), w.double(), 1e-5).float(),
                               atol=1e-6, rtol=1e-5)


def test_rms_norm_keeps_input_dtype_with_other_weight_dtype():
    x = torch.randn(2, 16, dtype=torch.bfloat16)
    w = torch.rand(16) + 0.5  # fp32 weight
    assert api.rms_norm(x, w, 1e-6).dtype == torch.bfloat16
    assert api.add_rms_norm(x, x, w, 1e-6)[0].dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_neox_matches_reference(dtype):
    g = torch.Generator().manual_seed(1)
    T, H, D = 5, 7, 64
    base = torch.randn(T, (H + 3) * D, generator=g).to(dtype)
    x = base[:, : H * D].view(T, H, D)  # a strided view, as the model passes it
    ang = torch.rand(T, D // 2, generator=g) * 6
    cos, sin = ang.cos(), ang.sin()
    want = ref_rotary_neox(x.double(), cos.double(), sin.double())
    got_half = api.rotary_neox(x, cos, sin)  # [T, D/2] tables
    got_wide = api.rotary_neox(x, *api.rotary_tables_neox(cos, sin, dtype))  # per-forward tables
    for got in (got_half, got_wide):
        assert got.dtype == dtype and got.shape == x.shape
        assert rel_err(got, want) < TOL[dtype]
    c, s = api.rotary_tables_neox(cos, sin, torch.float32)
    assert c.shape == s.shape == (T, 1, D)
    torch.testing.assert_close(s[:, 0, : D // 2], -sin)
    torch.testing.assert_close(c[:, 0, D // 2 :], cos)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_matches_reference(dtype):
    gu = torch.randn(6, 2 * 40, generator=torch.Generator().manual_seed(2)).to(dtype)
    got = api.swiglu_activation(gu)
    assert got.shape == (6, 40) and got.dtype == dtype
    assert rel_err(got, ref_swiglu(gu.double())) < TOL[dtype]


def test_one_sequence_in_consecutive_blocks_is_read_as_a_view():
    """Decode of one sequence whose blocks are consecutive ids (``AttentionMetadata.contiguous``, set by the engine's
    input batch on CPU) reads its context as one strided view: same output and same cache writes as the gather
    path over the same context in scattered blocks."""
    from torchinferno.models.common.attention import TorchAttention
    from torchinferno.models.common.attention_metadata import build_attention_metadata

    g = torch.Generator().manual_seed(0)
    H, Hkv, D, bs, length = 4, 2, 8, 4, 10
    ctx_k, ctx_v = torch.randn(length - 1, Hkv, D, generator=g), torch.randn(length - 1, Hkv, D, generator=g)
    q, k, v = torch.randn(1, H, D, generator=g), torch.randn(1, Hkv, D, generator=g), torch.randn(1, Hkv, D, generator=g)
    attn = TorchAttention(H, Hkv, D ** -0.5)

    def run(blocks, contiguous):
        kc, vc = torch.zeros(8, bs, Hkv, D), torch.zeros(8, bs, Hkv, D)
        for p in range(length - 1):
            kc[blocks[p // bs], p % bs], vc[blocks[p // bs], p % bs] = ctx_k[p], ctx_v[p]
        meta = build_attention_metadata([1], [length - 1], [blocks], bs)
        if contiguous:
            meta.block_tables_host, meta.contiguous = [[blocks[0]]], True
        out = attn(q, k, v, (kc, vc), meta)
        p = length - 1
        return out, kc[blocks[p // bs], p % bs].clone(), vc[blocks[p // bs], p % bs].clone()

    view = run([2, 3, 4], True)
    gather = run([5, 1, 7], False)
    for a, b in zip(view, gather):
        torch.testing.assert_close(a, b)
    # the flag is what selects the view: set on blocks that are not consecutive, it reads the wrong tokens
    assert not torch.allclose(run([2, 4, 3], True)[0], run([2, 4, 3], False)[0])
