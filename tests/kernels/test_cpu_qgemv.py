"""Our block-quantized CPU GEMV (kernels/cpu_qgemv.c) on GGUF Q8_0/Q4_0/Q4_1 blocks vs an fp64 torch reference.

The reference dequantizes the weight with ``gguf.quants.dequantize`` (ggml's own definition of the
formats, independent of our repacking) and quantizes the activation per block as the kernel's
contract says; the kernel must agree up to fp32 accumulation. Skips where the kernel is unavailable.
"""

from __future__ import annotations

import pytest
import torch

from torchinferno.kernels import cpu_qgemv

FORMATS = list(cpu_qgemv.GGUF_TYPES)


@pytest.fixture(scope="module")
def fn():
    f = cpu_qgemv.load()
    if f is None:
        pytest.skip(f"quantized CPU GEMV unavailable: {cpu_qgemv.unavailable_reason()}")
    return f


def _case(n: int, k: int, m: int, fmt: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g)  # per-row scales differ
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    return cpu_qgemv.quantize_weight(w, fmt), x


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", [(576, 576), (37, 64), (16, 32), (100, 1536), (1, 96)])
@pytest.mark.parametrize("m", [1, 3, 4, 5, 8, 9, 17])
def test_matches_reference_within_fp32_accumulation(fn, fmt, n, k, m):
    raw, x = _case(n, k, m, fmt)
    y = cpu_qgemv.make_qgemv(fn, cpu_qgemv.pack_blocks(raw, fmt), fmt, n, k, out_dtype=torch.float32)(x)
    ref = cpu_qgemv.reference_qgemv(x, raw, fmt)
    assert y.shape == (m, n)
    tol = 1e-5 * (x.float().abs() @ cpu_qgemv.dequantize_blocks(raw, fmt).abs().T).double() + 1e-6
    assert ((y.double() - ref).abs() <= tol).all(), (y.double() - ref).abs().max()


@pytest.mark.parametrize("fmt", FORMATS)
def test_bias_fp32_input_bf16_output_and_row_independence(fn, fmt):
    raw, x = _case(70, 128, 6, fmt, seed=3)
    bias = torch.randn(70)
    gemv = cpu_qgemv.make_qgemv(fn, cpu_qgemv.pack_blocks(raw, fmt), fmt, 70, 128, bias)
    y = gemv(x.float())  # fp32 input holding bf16 values: the same quantized activation
    assert y.dtype == torch.bfloat16
    ref = cpu_qgemv.reference_qgemv(x, raw, fmt, bias).to(torch.bfloat16)
    torch.testing.assert_close(y.float(), ref.float(), atol=0, rtol=2 ** -7)
    for r in range(6):  # a row's result does not depend on M or the other rows: bitwise
        assert torch.equal(gemv(x[r:r + 1]), y[r:r + 1])


def test_format_numbers_are_ggmls():
    """Our unpacking (w = d u + c) reproduces gguf's dequantization bit for bit, for every format."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(5, 64, generator=g)
    for fmt, f in cpu_qgemv.GGUF_TYPES.items():
        raw = cpu_qgemv.quantize_weight(w, fmt)
        assert raw.shape == (5, 2 * f.block_bytes)
        u, d, c = cpu_qgemv._unpack_blocks(raw, f)
        mine = (d.float()[..., None] * u.float() + c.float()[..., None]).reshape(5, 64)
        assert torch.equal(mine, cpu_qgemv.dequantize_blocks(raw, fmt)), fmt


def test_rejects_bad_input(fn):
    raw, x = _case(16, 32, 1, "q4_1")
    gemv = cpu_qgemv.make_qgemv(fn, cpu_qgemv.pack_blocks(raw, "q4_1"), "q4_1", 16, 32)
    with pytest.raises(TypeError, match="bf16/fp32"):
        gemv(x.half())
    with pytest.raises(ValueError, match="% 32"):
        cpu_qgemv.make_qgemv(fn, cpu_qgemv.pack_blocks(raw, "q4_1"), "q4_1", 16, 48)
