"""NVFP4 reference numerics (CPU): E2M1 rounding, block/tensor scales, round trip, matmul error."""

from __future__ import annotations


import pytest
import torch

from torchinferno.kernels.nvfp4 import (
    E2M1_VALUES,
    NVFP4Linear,
    dequantize_nvfp4,
    nvfp4_linear_reference,
    quantize_nvfp4,
    round_to_e2m1,
    swap_linear_for_nvfp4,
)

GRID = torch.tensor(E2M1_VALUES, dtype=torch.float64)


def ref_e2m1(x: torch.Tensor) -> torch.Tensor:
    """float64 brute force: nearest grid magnitude, ties to the even code, saturate at 6; signed."""
    a = x.double().abs().clamp(max=6.0)
    d = (a[..., None] - GRID).abs()
    best = d.min(-1, keepdim=True).values
    cand = (d == best)  # one or two candidates
    codes = torch.arange(8)
    # among tied candidates prefer the even code
    score = torch.where(cand, (codes % 2) * 1 + 0, torch.full_like(codes, 10))
    code = score.argmin(-1)
    return torch.where(x < 0, -GRID[code], GRID[code])


def ref_quant_dequant(x: torch.Tensor) -> torch.Tensor:
    """Independent float64 statement of the NVFP4 encode/decode recipe."""
    x = x.double()
    ts = x.abs().max() / (6 * 448) if x.abs().max() > 0 else torch.tensor(1.0, dtype=torch.float64)
    ts = torch.tensor(float(ts.float()), dtype=torch.float64)  # stored as fp32
    blocks = x.reshape(*x.shape[:-1], -1, 16)
    s = (blocks.abs().amax(-1) / 6 / ts).float().clamp(max=448).to(torch.float8_e4m3fn).double()
    eff = (s * ts).float().double()  # the kernel forms the multiplier in fp32
    q = torch.where(eff[..., None] > 0, blocks / eff[..., None], torch.zeros_like(blocks))
    return (ref_e2m1(q.float()) * eff[..., None]).reshape(x.shape)


def test_e2m1_rounding_grid_and_ties():
    vals = torch.tensor([0.0, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 7.0, 100.0, -0.75, -5.0, -2.6])
    want = torch.tensor([0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 6.0, -1.0, -4.0, -3.0])
    codes = round_to_e2m1(vals)
    got = torch.where((codes & 8) != 0, -GRID[(codes & 7).long()], GRID[(codes & 7).long()])
    assert torch.equal(got.float(), want)
    x = torch.randn(4096) * 3
    codes = round_to_e2m1(x)
    got = torch.where((codes & 8) != 0, -GRID[(codes & 7).long()], GRID[(codes & 7).long()])
    assert torch.equal(got, ref_e2m1(x))


def test_layout_and_exact_round_trip():
    # Values already on the NVFP4 grid (E2M1 times a power-of-two block scale) survive exactly.
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (8, 64), generator=g, dtype=torch.uint8)
    vals = torch.where((codes & 8) != 0, -GRID[(codes & 7).long()], GRID[(codes & 7).long()]).float()
    vals[:, ::16] = 6.0  # every block reaches amax 6 so the block scales are exact powers of two
    scale = 2.0 ** torch.randint(-3, 4, (8, 4, 1), generator=g).float()
    x = (vals.view(8, 4, 16) * scale).view(8, 64)
    q = quantize_nvfp4(x)
    assert q.packed.shape == (8, 32) and q.packed.dtype == torch.uint8
    assert q.scales.shape == (8, 4) and q.scales.dtype == torch.float8_e4m3fn
    assert q.tensor_scale.dtype == torch.float32 and q.tensor_scale.dim() == 0
    torch.testing.assert_close(dequantize_nvfp4(q), x, rtol=1e-6, atol=0)
    # element 0 in the low nibble, element 1 in the high nibble
    c0 = round_to_e2m1(x[0, :2] / (q.scales[0, 0].float() * q.tensor_scale))
    assert int(q.packed[0, 0]) == int(c0[0]) | (int(c0[1]) << 4)


@pytest.mark.parametrize("shape,spread", [((64, 256), 1.0), ((3, 5, 32), 100.0), ((16, 128), 1e-3)])
def test_round_trip_matches_float64_recipe(shape, spread):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g) * spread
    x[..., 3] *= 50  # outliers: per-block scales must absorb them
    dq = dequantize_nvfp4(quantize_nvfp4(x))
    torch.testing.assert_close(dq.double(), ref_quant_dequant(x), rtol=1e-6, atol=1e-12)
    rel = float((dq - x).norm() / x.norm())
    assert rel < 0.12, rel  # 4-bit values with 16-element blocks: ~8-10% RMS on Gaussian data


def test_zero_and_bad_shapes():
    q = quantize_nvfp4(torch.zeros(2, 32))
    assert torch.equal(dequantize_nvfp4(q), torch.zeros(2, 32))
    with pytest.raises(ValueError):
        quantize_nvfp4(torch.zeros(2, 20))


@pytest.mark.parametrize("quantize_input,bound", [(False, 0.12), (True, 0.17)])
def test_linear_error_vs_float64(quantize_input, bound):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(32, 512, generator=g)
    w = torch.randn(96, 512, generator=g) / 512 ** 0.5
    b = torch.randn(96, generator=g)
    q = quantize_nvfp4(w)
    y = nvfp4_linear_reference(x, q, b, quantize_input=quantize_input)
    xq = dequantize_nvfp4(quantize_nvfp4(x)).double() if quantize_input else x.double()
    exact = xq @ dequantize_nvfp4(q).double().t() + b.double()
    torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-5)  # only fp32 accumulation error
    full = x.double() @ w.double().t()
    rel = float((y.double() - b.double() - full).norm() / full.norm())
    assert rel < bound, rel


def test_swap_linear_for_nvfp4():
    from torchinferno.testing import tiny_model

    m = tiny_model("llama3")
    ids = torch.arange(12)
    with torch.inference_mode():
        ref = m.compute_logits(m(ids, ids))
    names = swap_linear_for_nvfp4(m, lambda name, mod: "lm_head" not in name)
    assert names and all("lm_head" not in n for n in names)
    assert isinstance(m.model.layers[0].self_attn.qkv_proj, NVFP4Linear)
    assert type(m.lm_head) is torch.nn.Linear
    assert not any(type(mod) is torch.nn.Linear and "lm_head" not in n for n, mod in m.named_modules())
    with torch.inference_mode():
        out = m.compute_logits(m(ids, ids))
    cos = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0)
    assert cos > 0.95, float(cos)
