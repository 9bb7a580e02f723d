"""Fused MoE (kernels/fused_moe.py + kernels/triton/fused_moe.py) against the torch references.

* ``align_pairs`` (device sort/pad of (token, slot) pairs per expert) == a Python-loop oracle, incl. empty experts,
  dropped ids and zero tokens; its shapes depend on (T, top_k, E, block_m) only.
* The Triton GEMMs on Triton's CPU interpreter (a ``TRITON_INTERPRET=1`` subprocess running fused_moe_checks.py):
  fused experts == the grouped reference (fp32 1e-5, fp16 2e-3 relative to the largest output), SwiGLU and V4's
  clamped SwiGLU; tiny deepseek-v3.2 / dsv4 / deepseek-v4 models, fused path == reference path logits.
* The per-token kernels of one to a few tokens (``kernels.triton.moe_small``: no sort/pad, the top-k sum in the
  down kernel) == the grouped reference == the grouped Triton path, and the policy's token threshold picks them.
* Shared experts served by the same two launches (ids ``E + j`` at weight 1) == routed reference + the shared MLP,
  and a tiny model's logits with them fused == the separate shared MLP == the torch reference.
* On CUDA (skipped without): the same checks in fp32 / bf16, and one MoE layer captured in a CUDA graph and
  replayed with a different routing (no host sync, no data-dependent shape).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from torchinferno.kernels.fused_moe import (
    align_pairs,
    config_for,
    default_config,
    max_padded,
    reference_align,
)

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("T,K,E,B", [(1, 6, 64, 16), (5, 2, 4, 4), (33, 8, 16, 16), (7, 3, 5, 1), (0, 2, 4, 4),
                                     (64, 6, 8, 64)])
def test_align_pairs_matches_loop_oracle(T, K, E, B):
    g = torch.Generator().manual_seed(T * 100 + E)
    ids = torch.randint(0, E, (T, K), generator=g)
    if T > 3:
        ids[0] = ids[1]  # a repeated token
        ids[2, 0] = -1  # dropped pairs (another rank's experts)
        ids[3, -1] = E
        ids[:, 0] = torch.where(ids[:, 0] == 1, 0, ids[:, 0])  # expert 1 gets fewer pairs; some experts empty
    sp, be, n = align_pairs(ids, E, B)
    rp, rb, rn = reference_align(ids, E, B)
    assert torch.equal(sp, rp) and torch.equal(be, rb) and int(n) == rn
    assert sp.numel() == max_padded(T * K, E, B) and sp.numel() % B == 0 and be.numel() == sp.numel() // B


def test_align_pairs_bound_is_tight():
    """Every pair on its own expert (the worst case the static bound covers) fills it exactly."""
    ids = torch.arange(12).view(6, 2)
    sp, be, n = align_pairs(ids, 12, 8)
    assert int(n) == sp.numel() == 96 and bool((be >= 0).all())


def test_config_lookup_falls_back_to_defaults():
    assert config_for(6, 64, 1408, 2048, torch.float64) == default_config(6, 64, 1408, 2048)
    assert config_for(6, 64, 1408, 2048, torch.float64)["BLOCK_M"] == 16


def test_config_table_is_read_by_pair_bucket(tmp_path, monkeypatch):
    """A tune-moe table: the nearest stored bucket at or above the pair count, the largest past the end."""
    import json

    from torchinferno.kernels import fused_moe

    small = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256, "GROUP_M": 1, "num_warps": 4, "num_stages": 4}
    big = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({fused_moe.config_key(64, 1408, 2048, torch.bfloat16): {"8": small, "2048": big}}))
    monkeypatch.setattr(fused_moe, "CONFIG_FILE", path)
    fused_moe._stored_configs.cache_clear()
    try:
        assert fused_moe.config_for(6, 64, 1408, 2048, torch.bfloat16) == small
        assert fused_moe.config_for(9, 64, 1408, 2048, torch.bfloat16) == big
        assert fused_moe.config_for(50_000, 64, 1408, 2048, torch.bfloat16) == big
        assert fused_moe.config_for(6, 64, 2048, 1408, torch.bfloat16) == default_config(6, 64, 2048, 1408)
    finally:
        fused_moe._stored_configs.cache_clear()


@pytest.mark.parametrize("check", ["experts", "shared", "small", "model"])
def test_fused_moe_on_the_triton_interpreter(check, interpreter_check):
    interpreter_check("fused_moe_checks.py", check)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_experts_cuda(dtype):
    sys.path.insert(0, str(HERE))
    import fused_moe_checks as C

    dev = torch.device("cuda")
    C.check_experts(dev, dtype)
    C.check_experts(dev, dtype, T=300, K=6, E=64, D=256, inter=128)
    C.check_configs(dev, dtype)
    C.check_expert_parallel(dev, dtype)
    C.check_align(dev)
    C.check_routing(dev)
    C.check_experts(dev, dtype, T=1000, K=6, E=64, D=128, inter=64)  # past the one-program align (torch sort/pad)
    C.check_shared(dev, dtype)
    C.check_shared(dev, dtype, T=1, K=6, E=64, D=256, inter=128)  # the V2-Lite decode shape, scaled down
    C.check_shared(dev, dtype, T=300, K=6, E=64, D=256, inter=128, n_shared=1)
    C.check_small(dev, dtype)


@cuda
def test_fused_moe_models_cuda():
    sys.path.insert(0, str(HERE))
    import fused_moe_checks as C

    C.check_model(torch.device("cuda"))
    C.check_block_paths(torch.device("cuda"), torch.bfloat16)


@cuda
def test_fused_moe_layer_replays_from_a_cuda_graph():
    """A MoE block (router + fused experts + shared expert) captured once, replayed with new inputs (so a new
    routing): matches eager each time. A host sync inside would fail the capture."""
    from torchinferno.models.common.layers import SparseMoE
    from torchinferno.models.dsv4 import fused_ops
    from torchinferno.models.dsv4.config import tiny_dsv4_config

    torch.manual_seed(0)
    moe = SparseMoE(tiny_dsv4_config(), fused_ops).cuda().to(torch.bfloat16).eval()
    x = torch.randn(8, moe.gate.weight.shape[1], device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        moe(x)  # compile the kernels outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = moe(x)
        for seed in (1, 2, 3):
            x.copy_(torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).to(x))
            g.replay()
            torch.testing.assert_close(y, moe(x), atol=0, rtol=0)


@pytest.mark.parametrize("dt,swiglu,clamp,even_k,bm,bn,bk,warps,stages,shared", [
    ("*bf16", True, False, True, 16, 64, 128, 4, 4, False),   # decode gate_up (default config)
    ("*bf16", False, False, True, 16, 64, 128, 4, 4, False),  # decode down (routing weight fused)
    ("*bf16", True, False, True, 16, 64, 128, 4, 4, True),    # the same with shared experts fused in
    ("*bf16", False, False, True, 16, 64, 128, 4, 4, True),
    ("*bf16", True, True, False, 64, 128, 64, 8, 3, False),   # prefill tiles, V4 clamp, masked K tail
    ("*fp32", True, False, True, 32, 64, 64, 4, 2, True),     # fp32 (ieee dots)
])
def test_fused_moe_kernel_compiles_for_sm90(dt, swiglu, clamp, even_k, bm, bn, bk, warps, stages, shared):
    """The GEMM kernel's variants compile down to a cubin for Hopper without a GPU (test_triton_compile's helper)."""
    pytest.importorskip("triton")
    sys.path.insert(0, str(HERE))
    from test_triton_compile import compile_sm90

    from torchinferno.kernels.triton import fused_moe as fm

    out = dt if swiglu else "*fp32"
    compile_sm90(fm._moe_gemm_kernel, {"A": dt, "B": dt, "C": out, "W": out if swiglu else "*fp32", "S": dt,
                                       "sorted_pairs": "*i32", "block_expert": "*i32", "num_padded": "*i32"},
                 {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "SWIGLU": swiglu, "CLAMP": clamp,
                  "MUL_WEIGHT": not swiglu, "EVEN_K": even_k, "PRECISION": "ieee" if dt == "*fp32" else "tf32",
                  "HAS_SHARED": shared},
                 floats=("limit",), num_warps=warps, num_stages=stages)


@pytest.mark.parametrize("bm,e_pad,chunk", [(16, 64, 128), (64, 256, 32), (1, 16, 128)])
def test_align_kernel_compiles_for_sm90(bm, e_pad, chunk):
    pytest.importorskip("triton")
    sys.path.insert(0, str(HERE))
    from test_triton_compile import compile_sm90

    from torchinferno.kernels.triton import fused_moe as fm

    compile_sm90(fm._align_kernel, {"IDS": "*i64", "SORTED": "*i32", "BLOCK_EXPERT": "*i32", "NUM_PADDED": "*i32"},
                 {"BM": bm, "E_PAD": e_pad, "CHUNK": chunk})
    compile_sm90(fm._align_count_kernel, {"IDS": "*i64", "COUNTS": "*i32"}, {"E_PAD": e_pad, "CHUNK": chunk})
    compile_sm90(fm._align_plan_kernel, {"COUNTS": "*i32", "BASE": "*i32", "BLOCK_EXPERT": "*i32", "NUM_PADDED": "*i32"},
                 {"BM": bm, "E_PAD": e_pad, "CHUNK": chunk})
    compile_sm90(fm._align_place_kernel, {"IDS": "*i64", "BASE": "*i32", "SORTED": "*i32"},
                 {"E_PAD": e_pad, "CHUNK": chunk})


@pytest.mark.parametrize("E,k,G,TG,ssp", [(64, 6, 1, 1, False), (256, 8, 8, 4, False), (256, 6, 1, 1, True)])
def test_routing_kernel_compiles_for_sm90(E, k, G, TG, ssp):
    pytest.importorskip("triton")
    sys.path.insert(0, str(HERE))
    from test_triton_compile import compile_sm90

    from torchinferno.kernels.triton import moe_routing as mr

    compile_sm90(mr._route_kernel, {"LOGITS": "*fp32", "BIAS": "*fp32", "W_OUT": "*fp32", "IDS_OUT": "*i64"},
                 {"E": E, "TOP_K": k, "K_PAD": 8, "N_GROUP": G, "PER": E // G, "TOPK_GROUP": TG, "HAS_BIAS": True,
                  "NORM": True, "SQRT_SOFTPLUS": ssp, "N_SHARED": 2 if E == 64 else 0, "S_PAD": 2},
                 floats=("scaling",))


@pytest.mark.parametrize("fused_ends", [False, True])
def test_per_token_moe_and_router_route_kernels_compile_for_sm90(fused_ends):
    """The batch-1 MoE kernels at the stored policy's tiles, with and without a decode step's layer ends fused in
    (the RMSNorm in the router GEMV and the gate/up kernel, the residual add in the down kernel); the step's form
    under PDL."""
    pytest.importorskip("triton")
    sys.path.insert(0, str(HERE))
    from test_triton_compile import assert_waits_before_memory, compile_sm90

    from torchinferno.kernels import fused_moe
    from torchinferno.kernels.triton import moe_routing as mr
    from torchinferno.kernels.triton import moe_small as ms

    tiles = fused_moe.policy().small_m_tiles
    bf = {p: "*bf16" for p in ("B", "S", "ACT")}
    c1, c2 = tiles["gate_up"], tiles["down"]
    compiled = [compile_sm90(ms._pair_gate_up_kernel, {**bf, "X": "*bf16", "NW": "*bf16", "IDS": "*i64"}, dict(
        BLOCK_N=c1["BLOCK_N"], BLOCK_K=c1["BLOCK_K"], CLAMP=False, HAS_SHARED=True, MAY_DROP=False, RMS=fused_ends,
        PDL=fused_ends),
        floats=("limit", "eps"), num_warps=c1["num_warps"], num_stages=c1["num_stages"])]
    compiled.append(compile_sm90(ms._token_down_kernel, {**bf, "OUT": "*bf16", "RES": "*bf16", "IDS": "*i64", "W": "*fp32"}, dict(
        TOP_K=8, BLOCK_N=c2["BLOCK_N"], BLOCK_K=c2["BLOCK_K"], ONE_K=True, HAS_SHARED=True, MAY_DROP=False,
        ADD=fused_ends, PDL=fused_ends), num_warps=c2["num_warps"], num_stages=c2["num_stages"]))
    ptrs = {"X": "*bf16", "WR": "*fp32", "LOGITS": "*fp32", "CNT": "*i32", "CNT_ALL": "*i32", "BIAS": "*fp32",
            "W_OUT": "*fp32", "IDS_OUT": "*i64", "SORTED": "*i32", "BLOCK_EXPERT": "*i32", "NUM_PADDED": "*i32",
            "NW": "*bf16"}
    compiled.append(compile_sm90(mr._router_route_kernel, ptrs, dict(
        BLOCK_E=mr.ROUTER_TILES["block_e"], BLOCK_K=mr.ROUTER_TILES["block_k"], E=64, TOP_K=6, K_PAD=8, N_GROUP=1,
        PER=64, TOPK_GROUP=1, HAS_BIAS=False, NORM=True, SQRT_SOFTPLUS=False, N_SHARED=2, S_PAD=2, ALIGN=False, BM=16,
        E_PAD=128, CHUNK=128, RMS=fused_ends, PDL=fused_ends), floats=("scaling", "eps")))
    for k in compiled:  # the step's PDL form waits before any global access
        assert_waits_before_memory(k, pdl=fused_ends)
