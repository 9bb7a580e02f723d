"""Block-scaled FP8 (kernels/fp8_block.py, fp8_block_moe.py, triton/fp8_block*.py): the quantization rules, the
torch reference against float64 math, the module and swaps, the Triton kernels on Triton's CPU interpreter
(fp8_block_checks.py in a ``TRITON_INTERPRET=1`` subprocess: the interpreter runs FP8 ``tl.dot`` exactly, and the
kernels round to the E4M3 grid themselves because its fp32 -> fp8 cast is wrong across binades) and on CUDA
(skipped without: Triton == reference within fp8_block_checks' stated tolerances)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from torchinferno.checkpoint.fp8 import dequantize_fp8_block, quantize_fp8_block
from torchinferno.errors import ConfigError
from torchinferno.kernels.fp8_block import (
    E4M3_MAX,
    Fp8BlockLinear,
    block_config,
    dequantize_weight_blocks,
    fp8_block_linear_reference,
    quantize_fp8_groups,
    quantize_weight_blocks,
    swap_linear_for_fp8_block,
)

HERE = Path(__file__).resolve().parent


def test_weight_blocks_round_trip_matches_checkpoint_formula():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 200, generator=g) * 0.05
    w[:128, :128] *= 100  # blocks of very different ranges
    w[128:256, 128:] = 0  # an all-zero block
    q, s = quantize_weight_blocks(w)
    assert q.dtype == torch.float8_e4m3fn and tuple(s.shape) == (3, 2)
    deq = dequantize_weight_blocks(q, s)
    assert torch.equal(deq, dequantize_fp8_block(q, s, out_dtype=torch.float32))  # checkpoint/fp8.py's formula
    # every element within half an E4M3 step of its block: relative 2^-4 of the value, 2^-10 of the block scale
    full_s = s.repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :200]
    assert bool(((deq - w).abs() <= w.abs() * 2**-4 + full_s * 2**-10 + 1e-30).all())
    assert float(q.float().abs().amax()) == E4M3_MAX  # each nonzero block's largest element maps to 448
    assert torch.equal(deq[128:256, 128:], torch.zeros(128, 72))
    # a checkpoint quantized by checkpoint/fp8.py's rule, dequantized and re-quantized by ours: the same codes
    cq, cs = quantize_fp8_block(w)
    q2, s2 = quantize_weight_blocks(dequantize_fp8_block(cq, cs, out_dtype=torch.float32))
    assert torch.equal(q2.view(torch.uint8), cq.view(torch.uint8))
    assert torch.allclose(s2, cs, rtol=2e-7, atol=0)


def test_group_quantizer_scales_each_token_and_group():
    x = torch.zeros(3, 300)
    x[0, :128] = torch.linspace(-2, 2, 128)
    x[0, 128:256] = 1000.0
    x[1, 256:] = torch.randn(44)  # partial last group; groups 0 and 1 of row 1 all zero
    x[2] = torch.randn(300)
    q, s = quantize_fp8_groups(x)
    assert tuple(q.shape) == (3, 300) and tuple(s.shape) == (3, 3)
    assert float(s[0, 0]) == pytest.approx(2 / 448) and float(s[0, 1]) == pytest.approx(1000 / 448)
    assert float(s[1, 2]) == pytest.approx(float(x[1, 256:].abs().max()) / 448)
    assert float(s[1, 0]) > 0 and torch.equal(q[1, :256].float(), torch.zeros(256))
    deq = q.float() * s.repeat_interleave(128, 1)[:, :300]
    assert bool(((deq - x).abs() <= x.abs() * 2**-4 + s.repeat_interleave(128, 1)[:, :300] * 2**-10).all())


@pytest.mark.parametrize("M,N,K", [(4, 200, 300), (1, 64, 64), (9, 256, 384), (3, 130, 129)])
def test_reference_equals_float64_math_on_dequantized_operands(M, N, K):
    g = torch.Generator().manual_seed(M * N + K)
    x = torch.randn(M, K, generator=g) * 3
    wq, ws = quantize_weight_blocks(torch.randn(N, K, generator=g) * 0.05)
    bias = torch.randn(N, generator=g)
    got = fp8_block_linear_reference(x, wq, ws, bias)
    xq, xs = quantize_fp8_groups(x)
    x64 = xq.double() * xs.double().repeat_interleave(128, 1)[:, :K]
    want = x64 @ dequantize_weight_blocks(wq, ws, torch.float64).t() + bias.double()
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    # sabotage: the weight scales of the wrong block row -> the same check fails
    if ws.shape[0] > 1:
        bad = fp8_block_linear_reference(x, wq, ws.flip(0), bias)
        assert not torch.allclose(bad.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_reference_keeps_batch_dims_and_dtype():
    wq, ws = quantize_weight_blocks(torch.randn(48, 160) * 0.05)
    x = torch.randn(2, 3, 160, dtype=torch.bfloat16)
    y = fp8_block_linear_reference(x, wq, ws)
    assert y.shape == (2, 3, 48) and y.dtype == torch.bfloat16
    assert torch.equal(y[1, 2], fp8_block_linear_reference(x[1, 2:3], wq, ws)[0])  # per-token: rows independent


def test_module_swap_and_errors():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(160, 96), nn.ReLU(), nn.Linear(96, 40))
    x = torch.randn(5, 160)
    with torch.no_grad():
        want = model(x)
    names = swap_linear_for_fp8_block(model, skip=())
    assert names == ["0", "2"] and all(isinstance(model[i], Fp8BlockLinear) for i in (0, 2))
    assert model[0].kernel == "torch"  # no CUDA here: the reference
    got = model(x)
    assert float((got - want).abs().max() / want.abs().max()) < 0.1
    lin = model[0]
    assert torch.equal(got, model[2](torch.relu(fp8_block_linear_reference(x, lin.weight_fp8, lin.weight_scale_inv,
                                                                            lin.bias))))
    with pytest.raises(ConfigError, match="valid: auto, torch, triton"):
        Fp8BlockLinear(lin.weight_fp8, lin.weight_scale_inv, kernel="cutlass")
    with pytest.raises(ConfigError, match=r"need \[1, 2\]"):
        Fp8BlockLinear(lin.weight_fp8, torch.ones(2, 2))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="valid here: torch, auto"):
            Fp8BlockLinear(lin.weight_fp8, lin.weight_scale_inv, kernel="triton")


def test_block_config_narrows_tiles_for_few_rows():
    assert block_config(1, 2048, 2048)["BLOCK_N"] == 16  # 128 programs: a weight stream over the SMs
    assert block_config(1, 18432, 7168)["BLOCK_N"] == 64
    big = block_config(2048, 7168, 2048)
    assert (big["BLOCK_M"], big["BLOCK_N"], big["SPLIT_K"]) == (128, 128, 1)


def test_block_config_splits_k_for_decode_rows_only():
    o_proj = block_config(1, 7168, 16384)  # V3's o_proj at batch 1: 224 tiles x 4 shares of 32 K groups
    assert (o_proj["BLOCK_N"], o_proj["SPLIT_K"]) == (32, 4)
    assert block_config(1, 576, 7168)["SPLIT_K"] == 8  # kv_a: 36 tiles; 7 K groups a share
    assert block_config(1, 24576, 1536)["SPLIT_K"] == 2  # 12 K groups: shares of 6
    assert block_config(1, 2048, 512)["SPLIT_K"] == 1  # 4 K groups: nothing to share
    assert block_config(256, 7168, 16384)["SPLIT_K"] == 1  # past decode sizes
    for M, N, K in ((1, 100, 100), (16, 7168, 2048), (64, 7168, 16384), (3, 4096, 4096)):
        c = block_config(M, N, K)
        groups = -(-K // 128)
        assert c["SPLIT_K"] & (c["SPLIT_K"] - 1) == 0 and (c["SPLIT_K"] == 1 or groups // c["SPLIT_K"] >= 4)


def test_quantize_model_fp8_block_swaps_linears_and_experts():
    from torchinferno.kernels.fp8_block_moe import Fp8BlockExperts
    from torchinferno.kernels.fp8_linear import quantize_model
    from torchinferno.models.common.layers import RoutedExperts
    from torchinferno.testing import tiny_model

    m = tiny_model("deepseek-v3.2")
    names = quantize_model(m, "fp8-block")
    assert any(n.endswith("mlp.experts") for n in names) and any(n.endswith("o_proj") for n in names)
    assert not any(type(x) in (nn.Linear, RoutedExperts) for n, x in m.named_modules() if not n.endswith("lm_head"))
    assert m.fp8_block_kept == 0 and all(e.kernel == "torch" for e in m.modules() if isinstance(e, Fp8BlockExperts))
    with pytest.raises(ConfigError, match="valid: none, fp8, fp8-block"):
        quantize_model(m, "fp8-blocks")


def test_every_family_generates_under_fp8_block():
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.generate import generate
    from torchinferno.kernels.fp8_linear import quantize_model
    from torchinferno.models.registry import family_names
    from torchinferno.testing import tiny_model

    for family in family_names():
        m = tiny_model(family, dtype=torch.bfloat16)
        assert quantize_model(m, "fp8-block")
        out = generate(m, [[5, 9, 17, 33, 2]], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
        assert len(out[0].token_ids) == 3, family


@pytest.mark.parametrize("check", ["quant", "matmul", "experts",
                                   pytest.param("model", marks=pytest.mark.slow)])  # ~27 s on 2 cores
def test_fp8_block_on_the_triton_interpreter(check, interpreter_check):
    interpreter_check("fp8_block_checks.py", check)


def _fp8_cuda():
    from torchinferno.kernels.fp8_block import triton_supported

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if not triton_supported("cuda"):
        pytest.skip("needs FP8 tensor cores (compute capability >= 8.9) and Triton")
    sys.path.insert(0, str(HERE))
    import fp8_block_checks as C

    return C


def test_fp8_block_quant_and_matmul_cuda():
    C = _fp8_cuda()
    dev = torch.device("cuda")
    C.check_quant(dev)
    for dtype in (torch.float32, torch.bfloat16):
        C.check_matmul(dev, dtype)


def test_fp8_block_matmul_cuda_deepseek_shapes():
    """DeepSeek-V3 shapes at decode and prefill rows, the module path (default tiles) vs the reference, bf16."""
    C = _fp8_cuda()
    from torchinferno.kernels.fp8_block import Fp8BlockLinear

    g = torch.Generator(device="cuda").manual_seed(0)
    for M in (1, 16, 300):
        for N, K in ((576, 7168), (24576, 1536), (7168, 2048), (4096, 7168)):
            w = torch.randn(N, K, device="cuda", generator=g) * 0.02
            lin = Fp8BlockLinear(*quantize_weight_blocks(w))
            assert lin.kernel == "triton"
            x = torch.randn(M, K, device="cuda", generator=g, dtype=torch.bfloat16)
            err = C._rel(lin(x), fp8_block_linear_reference(x, lin.weight_fp8, lin.weight_scale_inv))
            assert err <= C.TOL[torch.bfloat16], f"M={M} N={N} K={K}: rel err {err:.2e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_block_experts_cuda(dtype):
    C = _fp8_cuda()
    dev = torch.device("cuda")
    C.check_experts(dev, dtype)
    C.check_experts(dev, dtype, cases=((300, 6, 64, 256, 128), (1000, 8, 32, 512, 256)), full=False)


def test_fp8_block_model_cuda():
    C = _fp8_cuda()
    C.check_model(torch.device("cuda"), torch.float32)
    C.check_model(torch.device("cuda"), torch.bfloat16)


def test_fp8_block_moe_replays_from_a_cuda_graph():
    """Block-FP8 experts (quantizers, sort/pad, grouped GEMMs, top-k sum) captured once, replayed with new inputs and
    so a new routing: equal to eager each time (a host sync inside would fail the capture)."""
    _fp8_cuda()
    from torchinferno.kernels.fp8_block_moe import Fp8BlockExperts, quantize_expert_blocks

    g = torch.Generator(device="cuda").manual_seed(0)
    E, D, inter, T, k = 16, 256, 128, 8, 4
    ex = Fp8BlockExperts(*quantize_expert_blocks(torch.randn(E, 2 * inter, D, device="cuda", generator=g) * 0.05),
                         *quantize_expert_blocks(torch.randn(E, D, inter, device="cuda", generator=g) * 0.05))
    x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    ids = torch.randint(0, E, (T, k), device="cuda", generator=g)
    w = torch.rand(T, k, device="cuda", generator=g)
    ex(x, ids, w)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ex(x, ids, w)
    for _ in range(3):
        x.copy_(torch.randn(T, D, device="cuda", generator=g))
        ids.copy_(torch.randint(0, E, (T, k), device="cuda", generator=g))
        graph.replay()
        assert torch.equal(y, ex(x, ids, w))
