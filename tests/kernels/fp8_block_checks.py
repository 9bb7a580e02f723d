"""Block-FP8 checks shared by the Triton interpreter run (tests/kernels/test_fp8_block.py, ``TRITON_INTERPRET=1``
subprocess, CPU tensors) and the CUDA run (same test file, on a GPU).

* ``check_quant``: the kernels' E4M3 rounding == torch's cast on every tie; the Triton per-token-group quantizer
  == ``kernels.fp8_block.quantize_fp8_groups`` bitwise (codes
  and scales), including values that round across a binade (the interpreter's own fp32 -> fp8 cast gets 127.99
  wrong; the kernel rounds before the cast), zero groups, partial groups, saturation.
* ``check_matmul``: the block GEMM == ``fp8_block_linear_reference`` for even / partial / sub-128 shapes, several
  tile configs, with and without bias.
* ``check_experts``: the fused block-FP8 MoE == ``fp8_block_experts_reference`` (tight) and within the activation
  quantization's bound of ``grouped_expert_mlp`` over the dequantized weights (the bf16 oracle).
* ``check_model``: a tiny deepseek-v3.2 model under ``--quantization fp8-block``: the Triton path's logits == the
  torch reference path's (every module's ``kernel`` switched).

Tolerances (max abs error / max abs reference): the interpreter sums exactly as numpy does, so the fp32 outputs
agree to summation order; on CUDA Hopper's FP8 MMA accumulates one 128-group imprecisely (DeepGEMM: ~14 bits)
before the fp32 promotion, hence ``CUDA_FP32_TOL``. Where a MoE's activation is quantized between its GEMMs, an
activation within a rounding error of an E4M3 tie takes the other code under any change of summation order: at
(T, k, E, D, I) = (1000, 8, 32, 512, 256) the torch reference itself moves by 1.3e-2 (max) / 1.5e-3 (norm) when its
input moves by 1e-6 relative, and H100 / H200 runs measured 1.1e-2 (fp32) and 2.5e-2 (bf16) max. So on CUDA the
GEMM outputs must meet the max-error tolerance or, failing that, ``CUDA_NORM_TOL`` on the norm-relative error
(one misrouted pair of that case moves it by 1.4e-2, a quarter of a tile's rows far more).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
CUDA_FP32_TOL = 1e-3
CUDA_NORM_TOL = {torch.float32: 4e-3, torch.float16: 6e-3, torch.bfloat16: 8e-3}
MODEL_TOL = {"cpu": 1e-4, "cuda": 2e-2}  # a whole model: on CUDA an activation code may round the other way
DEQUANT_GAP = 0.12  # block-FP8 vs the bf16 math on the dequantized weights: the activation quantization (~3 bits)


def _tol(device, dtype) -> float:
    return max(TOL[dtype], CUDA_FP32_TOL) if torch.device(device).type == "cuda" else TOL[dtype]


def _rel(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


def _norm_rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def _assert_close(got, ref, device, dtype, what: str) -> None:
    """``got`` == ``ref`` within the module docstring's tolerances (max error; on CUDA, else the norm error)."""
    err = _rel(got, ref)
    if err <= _tol(device, dtype):
        return
    assert torch.device(device).type == "cuda", f"{what}: rel err {err:.2e} > {_tol(device, dtype):.0e}"
    nerr = _norm_rel(got, ref)
    assert nerr <= CUDA_NORM_TOL[dtype], f"{what}: rel err {err:.2e} (max), {nerr:.2e} (norm) > {CUDA_NORM_TOL[dtype]}"


def check_e4m3_rounding(device) -> None:
    """The kernels' fp32 -> E4M3 rounding (``_e4m3_rne`` + cast) == torch's cast on every exact tie between two
    E4M3 values, the fp32 neighbours of each tie, every E4M3 value and random magnitudes over 2^-17 .. 448."""
    import triton

    from torchinferno.kernels.triton.fp8_block import _e4m3_round_kernel

    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[torch.isfinite(grid)].sort().values
    ties = (grid[1:] + grid[:-1]) / 2
    g = torch.Generator().manual_seed(5)
    v = torch.cat([ties, ties.nextafter(torch.tensor(1e9)), ties.nextafter(torch.tensor(-1e9)), grid,
                   torch.randn(20000, generator=g) * torch.logspace(-5, 2.6, 20000)]).to(device)
    out = torch.empty(v.numel(), dtype=torch.float8_e4m3fn, device=device)
    _e4m3_round_kernel[(triton.cdiv(v.numel(), 1024),)](v, out, v.numel(), BLOCK=1024)
    want = v.clamp(-448, 448).to(torch.float8_e4m3fn)
    bad = (out.view(torch.uint8) != want.view(torch.uint8)).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} values round differently, e.g. {v[bad[:3]].tolist()}"


def check_quant(device) -> None:
    from torchinferno.kernels.fp8_block import quantize_fp8_groups
    from torchinferno.kernels.triton.fp8_block import quantize_fp8_groups_triton

    check_e4m3_rounding(device)

    g = torch.Generator().manual_seed(0)
    cases = [torch.randn(7, 300, generator=g) * 5, torch.randn(3, 128, generator=g), torch.randn(2, 1, generator=g),
             torch.randn(4, 1000, generator=g) * torch.logspace(-6, 2, 1000)]
    carry = torch.zeros(2, 256)  # x / scale right below a power of two: rounds up into the next binade
    carry[0, :8] = torch.tensor([448.0, 127.99, -127.99, 0.01561, 3.9999, -7.999, 0.0019, 1e-4])
    carry[1, 128:] = 1.0  # group 0 all zero: the EPS scale and zero codes
    carry[1, 130] = -3.0
    cases.append(carry)
    for x in cases:
        for dtype in (torch.float32, torch.float16):
            xd = x.to(dtype).to(device)
            q, s = quantize_fp8_groups_triton(xd)
            rq, rs = quantize_fp8_groups(xd)
            assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)), f"codes differ for {tuple(x.shape)} {dtype}"
            assert torch.equal(s, rs), f"scales differ for {tuple(x.shape)} {dtype}"


MATMUL_SHAPES = [(5, 200, 300), (33, 256, 256), (1, 64, 64), (17, 130, 129), (2, 384, 512), (70, 96, 1000)]


def check_matmul(device, dtype) -> None:
    from torchinferno.kernels.fp8_block import block_config, fp8_block_linear_reference, quantize_weight_blocks
    from torchinferno.kernels.triton.fp8_block import fp8_block_matmul, quantize_fp8_groups_triton

    g = torch.Generator().manual_seed(1)
    extra = [{"BLOCK_M": 16, "BLOCK_N": 128, "GROUP_M": 4, "num_warps": 4, "num_stages": 2},
             {"BLOCK_M": 64, "BLOCK_N": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 3},
             # split-K: shares of unequal size and more shares than K groups (the launcher caps them)
             {"BLOCK_M": 16, "BLOCK_N": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2, "SPLIT_K": 3},
             {"BLOCK_M": 16, "BLOCK_N": 64, "GROUP_M": 1, "num_warps": 4, "num_stages": 2, "SPLIT_K": 16}]
    for i, (M, N, K) in enumerate(MATMUL_SHAPES):
        x = (torch.randn(M, K, generator=g) * 2).to(dtype).to(device)
        wq, ws = quantize_weight_blocks((torch.randn(N, K, generator=g) * 0.05).to(device))
        bias = (torch.randn(N, generator=g) * 0.1).to(dtype).to(device) if i % 2 else None
        ref = fp8_block_linear_reference(x, wq, ws, bias)
        xq, xs = quantize_fp8_groups_triton(x)
        for j, cfg in enumerate((block_config(M, N, K), *extra[: 1 + i % 2], *extra[2:])):
            got = fp8_block_matmul(xq, xs, wq, ws, dtype, cfg, bias)
            err = _rel(got, ref)
            assert err <= _tol(device, dtype), f"{(M, N, K)} {cfg}: rel err {err:.2e}"
            if j not in (0, 2 + i % 2):  # the in-GEMM quantizer (opt-in since run 52): the default and a split-K tile
                continue
            fused = fp8_block_matmul(x, None, wq, ws, dtype, cfg, bias)  # quantized inside: the same codes
            if torch.device(device).type == "cpu":
                assert torch.equal(fused, got), f"{(M, N, K)} {cfg}: in-GEMM quantization differs"
            else:  # the same codes; the compiler may schedule the fp32 sums differently
                assert _rel(fused, ref) <= _tol(device, dtype), f"{(M, N, K)} {cfg}: in-GEMM quantization"


def _silu_and_mul(h):
    g, u = h.chunk(2, dim=-1)
    return F.silu(g) * u


def check_experts(device, dtype, cases=((37, 4, 8, 192, 160), (3, 2, 4, 128, 128), (1, 6, 16, 64, 48)),
                  full: bool = True) -> None:
    from torchinferno.kernels import fp8_block_moe as fm
    from torchinferno.kernels.fp8_block import dequantize_weight_blocks
    from torchinferno.models.common.moe import grouped_expert_mlp

    g = torch.Generator().manual_seed(2)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
    for T, k, E, D, inter in cases:
        x = torch.randn(T, D, generator=g).to(dtype).to(device)
        gu, gus = fm.quantize_expert_blocks((torch.randn(E, 2 * inter, D, generator=g) * 0.05).to(device))
        dn, dns = fm.quantize_expert_blocks((torch.randn(E, D, inter, generator=g) * 0.05).to(device))
        w = torch.rand(T, k, generator=g).to(device)
        rnd = torch.randint(0, E, (T, k), generator=g)
        dup = rnd.clone()
        dup[:, -1] = dup[:, 0]  # a token routed twice to one expert
        hot = torch.full((T, k), E - 1)
        for name, ids in (("random", rnd), ("dup", dup), ("hot", hot))[: 3 if full else 1]:
            ids = ids.to(device)
            ref = fm.fp8_block_experts_reference(x, ids, w, gu, gus, dn, dns)
            got = fm.fused_fp8_block_experts(x, ids, w, gu, gus, dn, dns)
            _assert_close(got, ref, device, dtype, f"{name} {(T, k, E, D, inter)} {dtype}")
            other = fm.fused_fp8_block_experts(x, ids, w, gu, gus, dn, dns, quant_inline=T > fm.FUSE_QUANT_MAX_TOKENS)
            if torch.device(device).type == "cpu":  # quantized inside the GEMMs or by their own launches: same codes
                assert torch.equal(other, got), f"{name}: in-GEMM vs separate quantization differ"
            else:
                _assert_close(other, ref, device, dtype, f"{name}: the other quantization placement")
            if name == "random":
                deq = grouped_expert_mlp(x, ids, w, dequantize_weight_blocks(gu, gus, dtype),
                                         dequantize_weight_blocks(dn, dns, dtype), _silu_and_mul)
                gap = _rel(ref, deq)
                assert gap <= DEQUANT_GAP, f"block-FP8 experts vs dequantized bf16 math: {gap:.3f}"
                got2 = fm.fused_fp8_block_experts(x, ids, w, gu, gus, dn, dns, configs=(cfg, cfg))
                _assert_close(got2, ref, device, dtype, "explicit tiles")
        drop = rnd.clone()
        drop[::2, -1] = E  # another rank's expert: contributes 0
        drop = drop.to(device)
        ref = fm.fp8_block_experts_reference(x, drop, w, gu, gus, dn, dns)
        got = fm.fused_fp8_block_experts(x, drop, w, gu, gus, dn, dns, may_drop=True)
        _assert_close(got, ref, device, dtype, "dropped ids")


def tiny_deepseek(device, dtype, damp: float = 0.3, **overrides):
    """Tiny random deepseek-v3.2 (fused ops variant) with config ``overrides``; experts of 128 rows by default.

    Matrices (not the embedding) are scaled by ``damp``: at ``randomize_``'s N(0, 0.08) the random network is chaotic
    (the existing per-channel ``--quantization fp8`` moves its logits by 100% of their range, the indexer's top-k
    flips); at 0.3x block FP8 moves them by ~5% and the argmax holds, so a comparison means something."""
    from torchinferno.models.deepseek_v32.config import tiny_deepseek_v32_config
    from torchinferno.models.registry import get_family
    from torchinferno.testing import randomize_

    fam = get_family("deepseek-v3.2")
    torch.manual_seed(0)
    cfg = tiny_deepseek_v32_config(**{"moe_intermediate_size": 128, **overrides})
    model = randomize_(fam.build(cfg, device="cpu"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "embed" not in name:
                p.mul_(damp)
    model = model.to(device=device, dtype=dtype).eval()
    model.family = fam
    return model


def save_fp8_checkpoint(d: Path, **overrides) -> dict[str, torch.Tensor]:
    """:func:`tiny_deepseek` (CPU fp32, config ``overrides``) saved in the hub layout with every projection matrix as
    FP8 blocks (norms, embedding, head, router and the indexer's fp32 weights_proj kept as they are, as the release
    does). Returns the tensors written."""
    from torchinferno.checkpoint import safetensors_io
    from torchinferno.checkpoint.fp8 import quantize_fp8_block

    model = tiny_deepseek("cpu", torch.float32, **overrides)
    tensors = {}
    for name, t in model.family.export_weights(model):
        if (t.dim() == 2 and "norm" not in name and "embed" not in name and "lm_head" not in name
                and not name.endswith(("mlp.gate.weight", "weights_proj.weight"))):
            tensors[name], tensors[name + "_scale_inv"] = quantize_fp8_block(t.float())
        else:
            tensors[name] = t.detach().clone()
    hf = model.family.config_to_hf(model.config)
    hf["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    safetensors_io.save_hf_dir(d, hf, tensors)
    return tensors


def check_model(device, dtype=torch.float32) -> None:
    """Tiny deepseek-v3.2 (experts of 128 rows, hidden 64: partial K blocks) under fp8-block, a 6-token prefill into
    a paged cache and 3 decode steps: Triton == torch reference."""
    from fused_moe_checks import _cached_logits

    from torchinferno.kernels.fp8_block import Fp8BlockLinear
    from torchinferno.kernels.fp8_block_model import quantize_model_fp8_block
    from torchinferno.kernels.fp8_block_moe import Fp8BlockExperts

    model = tiny_deepseek(device, dtype, num_hidden_layers=2)  # one dense layer, one MoE layer
    base = _cached_logits(model, device, dtype)
    names = quantize_model_fp8_block(model, kernel="torch")
    mods = [m for m in model.modules() if isinstance(m, (Fp8BlockLinear, Fp8BlockExperts))]
    assert len(mods) == len(names) and any(isinstance(m, Fp8BlockExperts) for m in mods)
    want = _cached_logits(model, device, dtype)
    for m in mods:
        m.kernel = "triton"
    got = _cached_logits(model, device, dtype)
    err = _rel(got, want)
    assert err <= MODEL_TOL[torch.device(device).type], f"Triton vs torch fp8-block logits: rel err {err:.2e}"
    gap = _rel(want, base)
    assert gap <= DEQUANT_GAP, f"fp8-block vs unquantized logits: {gap:.3f}"


def main() -> None:
    sys.path[:0] = [str(Path(__file__).resolve().parent)]
    from triton_interpreter_checks import run_checks  # the interpreter patches (Triton dispatch accepts CPU tensors)

    def matmul(cpu):
        check_matmul(cpu, torch.float32)
        check_matmul(cpu, torch.float16)

    def experts(cpu):
        check_experts(cpu, torch.float32, cases=((13, 4, 8, 192, 160), (1, 6, 16, 64, 48)))
        check_experts(cpu, torch.float16, cases=((9, 3, 4, 128, 96),), full=False)

    run_checks({"quant": check_quant, "matmul": matmul, "experts": experts, "model": check_model})


if __name__ == "__main__":
    main()
