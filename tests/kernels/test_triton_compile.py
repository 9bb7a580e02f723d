"""Every Triton kernel of kernels/triton/ compiles for Hopper (sm_90) on a machine without a GPU.

Triton's ahead-of-time path (``triton.compile`` of an ``ASTSource`` for a named ``GPUTarget``) runs the whole
pipeline down to a cubin with the ptxas its wheel carries, so a kernel variant that the front end or the
GPU lowering rejects (an FP8 tile carried across a PDL wait did, on the H200, in run 20) fails here in CI
instead of in a device session. This checks that the variants compile, not that they compute the right
values: the numerics tests compare them with torch on CUDA (tests/kernels/test_triton_kernels.py,
test_decode_gemv.py, test_cuda_decode_step.py).
"""

from __future__ import annotations

import inspect

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("triton.language")


def compile_sm90(fn, pointers: dict[str, str], constexprs: dict, floats: tuple[str, ...] = (), num_warps: int = 4,
                 num_stages: int = 2):
    """Compile ``fn`` (a ``@triton.jit`` kernel) for sm_90: parameters named in ``pointers`` take those pointer
    types (``*bf16``, ``*fp8e4nv``, ...), ``constexprs`` their values, ``floats`` fp32, every other one i32."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(inspect.signature(fn.fn).parameters)
    missing = set(pointers) - set(names) | set(constexprs) - set(names)
    assert not missing, f"not parameters of {fn.fn.__name__}: {sorted(missing)}"
    sig = {n: pointers.get(n, "constexpr" if n in constexprs else "fp32" if n in floats else "i32") for n in names}
    src = ASTSource(fn, sig, constexprs=dict(constexprs))
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps,
                                                                           "num_stages": num_stages})


def assert_waits_before_memory(compiled, pdl: bool) -> None:
    """A kernel launched with PDL may start before the previous kernel ends: the rule of ``decode_gemv.pdl_kwargs`` for
    kernels that wait first is that no global load, store or atomic comes before ``griddepcontrol.wait`` in the PTX
    (and without PDL there is no wait at all)."""
    import re

    ptx = compiled.asm["ptx"]
    wait = ptx.find("griddepcontrol.wait")
    if not pdl:
        assert wait < 0, "griddepcontrol.wait in a kernel compiled without PDL"
        return
    first = re.search(r"\b(ld|st|atom|red)\.global", ptx)
    assert wait >= 0 and first is not None and wait < first.start(), "global memory touched before the PDL wait"


def _attention_pointers(kv: str, q: str) -> dict[str, str]:
    return {"Q": q, "KC": kv, "VC": kv, "BT": "*i32", "SEQ": "*i32", "OUT": q, "OP": "*fp32", "LSE": "*fp32",
            "CNT": "*i32"}


@pytest.mark.parametrize("kv,q,block_n,pdl,merge,splits", [
    ("*bf16", "*bf16", 64, True, True, 32),     # the fused batch-1 step (Llama-3-8B)
    ("*bf16", "*bf16", 64, True, True, 64),     # the same with 4 waves of splits (probe variant)
    ("*bf16", "*bf16", 64, False, False, 8),    # batched decode, stage-2 merge
    ("*bf16", "*bf16", 64, False, False, 1),    # one split: direct output
    ("*fp8e4nv", "*bf16", 128, True, True, 32),  # FP8 cache under PDL (failed to compile in run 20)
    ("*fp8e4nv", "*bf16", 128, False, False, 8),
    ("*fp32", "*fp32", 64, True, True, 4),      # fp32 (ieee dots)
])
def test_decode_attention_stage1_compiles(kv, q, block_n, pdl, merge, splits):
    from torchinferno.kernels.triton import decode_attention as da

    compile_sm90(da._decode_stage1, _attention_pointers(kv, q), dict(
        GROUP=4, GROUP_PAD=16, D=128, D_PAD=128, DV=128, DV_PAD=128, PAGE=16, BLOCK_N=block_n, NUM_SPLITS=splits,
        IEEE=q == "*fp32", F16_DOT=kv == "*fp8e4nv", PDL=pdl, MERGE=merge), floats=("qk_scale",))


def test_decode_attention_mla_layout_and_stage2_compile():
    from torchinferno.kernels.triton import decode_attention as da

    compile_sm90(da._decode_stage1, _attention_pointers("*bf16", "*bf16"), dict(  # latent 576 / value 512, the MLA plan
        GROUP=16, GROUP_PAD=16, D=576, D_PAD=1024, DV=512, DV_PAD=512, PAGE=16, BLOCK_N=32, NUM_SPLITS=16,
        IEEE=False, F16_DOT=False, PDL=False, MERGE=True), floats=("qk_scale",))
    compile_sm90(da._decode_stage2, {"OP": "*fp32", "LSE": "*fp32", "OUT": "*bf16"},
                 dict(DV=128, DV_PAD=128, NUM_SPLITS=8, PDL=True))


@pytest.mark.parametrize("cache,q,block_n,warps,merge,splits,pdl", [
    ("*bf16", "*bf16", 64, 8, True, 16, True),     # batch 1, long context: one wave of programs (the step: PDL)
    ("*bf16", "*bf16", 32, 4, True, 4, False),     # batch 64: past a wave
    ("*bf16", "*bf16", 64, 8, False, 1, True),     # one split: direct output (the step at short contexts)
    ("*fp8e4nv", "*bf16", 64, 8, True, 16, True),  # FP8 latent cache (fp16 dots)
    ("*fp32", "*fp32", 16, 4, False, 8, False),    # fp32 (ieee dots), stage-2 merge
])
def test_mla_decode_attention_compiles(cache, q, block_n, warps, merge, splits, pdl):
    from torchinferno.kernels.triton import mla_decode_attention as mda

    assert mda.default_config(132 if warps == 8 else 133, 132, q == "*fp32") == {
        "block_n": block_n, "num_warps": warps, "num_stages": 2}
    k = compile_sm90(mda._mla_decode_stage1, {"Q": q, "C": cache, "BT": "*i32", "SEQ": "*i32", "OUT": q, "OP": "*fp32",
                                               "LSE": "*fp32", "CNT": "*i32"},
                     dict(R=512, R_PAD=512, RP=64, RP_PAD=64, BLOCK_H=16, PAGE=16, BLOCK_N=block_n, NUM_SPLITS=splits,
                          IEEE=q == "*fp32", F16_DOT=cache == "*fp8e4nv", MERGE=merge, PDL=pdl), floats=("qk_scale",),
                     num_warps=warps)
    assert_waits_before_memory(k, pdl)


@pytest.mark.parametrize("cache,pdl", [("*bf16", True), ("*fp8e4nv", True), ("*bf16", False)])
def test_mla_prologue_compiles(cache, pdl):
    """The MLA prologue (latent norm, both ropes, the cache append) as the deepseek step launches it: under PDL."""
    from torchinferno.kernels.triton import mla_prologue as mp

    k = compile_sm90(mp._mla_prologue_kernel, {"KV": "*bf16", "Q": "*bf16", "COS": "*fp32", "SIN": "*fp32",
                                               "NW": "*bf16", "LAT": "*bf16", "QPE": "*bf16", "CACHE": cache,
                                               "SLOTS": "*i64"},
                     dict(R=512, R_PAD=512, RD=64, HALF_PAD=32, BLOCK_H=16, INTERLEAVED=True, WRITE_CACHE=True,
                          SAT=448.0 if cache == "*fp8e4nv" else 0.0, PDL=pdl), floats=("eps",))
    assert_waits_before_memory(k, pdl)


def _gemv_pointers(kv: str = "*bf16") -> dict[str, str]:
    return {"X": "*bf16", "R": "*bf16", "NW": "*bf16", "W": "*bf16", "Y": "*bf16", "COS": "*bf16", "SIN": "*bf16",
            "KC": kv, "VC": kv, "SLOT": "*i64", "W2": "*bf16"}


@pytest.mark.parametrize("linear", ["qkv", "o", "gate_up", "down", "head"])
def test_fused_step_gemvs_compile_with_their_default_tiles(linear):
    """Each GEMV of the fused step with the tiles it launches (``cuda_decode.DEFAULT_CONFIGS``), under PDL."""
    from torchinferno.kernels.triton import decode_gemv as dg
    from torchinferno.models.llama3.cuda_decode import DEFAULT_CONFIGS

    cfg = DEFAULT_CONFIGS[linear]
    epi = {"qkv": dg.EPI_ROPE_KV, "gate_up": dg.EPI_SWIGLU}.get(linear, dg.EPI_PLAIN)
    compile_sm90(dg._decode_gemv_kernel, _gemv_pointers(), dict(
        ADD=linear in ("o", "down"), NORM=linear in ("qkv", "gate_up"), EPI=epi, TWO_W=False, NQ=32, NKV=8, HD=128,
        BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], PDL=True, EARLY_LAUNCH=cfg["early_launch"], SAT=0.0),
        floats=("eps",), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def test_qkv_gemv_with_an_fp8_cache_compiles():
    from torchinferno.kernels.triton import decode_gemv as dg

    compile_sm90(dg._decode_gemv_kernel, _gemv_pointers("*fp8e4nv"), dict(
        ADD=False, NORM=True, EPI=dg.EPI_ROPE_KV, TWO_W=False, NQ=32, NKV=8, HD=128, BLOCK_N=4, BLOCK_K=2048,
        PDL=True, EARLY_LAUNCH=True, SAT=448.0), floats=("eps",), num_stages=3)


@pytest.mark.parametrize("linear", ["proj", "gate_up", "down", "head"])
def test_deepseek_step_gemvs_compile_with_their_default_tiles(linear):
    """The deepseek-v3 batch-1 step's GEMVs (``models/deepseek_v32/cuda_decode.DEFAULT_CONFIGS``) under PDL; its
    q + kv_a projection reads two weights in one launch (``TWO_W``)."""
    from torchinferno.kernels.triton import decode_gemv as dg
    from torchinferno.models.deepseek_v32.cuda_decode import DEFAULT_CONFIGS

    cfg = DEFAULT_CONFIGS[linear]
    compile_sm90(dg._decode_gemv_kernel, _gemv_pointers(), dict(
        ADD=linear == "down", NORM=linear != "down", EPI=dg.EPI_SWIGLU if linear == "gate_up" else dg.EPI_PLAIN,
        TWO_W=linear == "proj", NQ=0, NKV=0, HD=0, BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], PDL=True,
        EARLY_LAUNCH=cfg["early_launch"], SAT=0.0), floats=("eps",), num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])


@pytest.mark.parametrize("product", ["absorb_q", "absorb_o"])
def test_deepseek_step_head_gemvs_compile_with_their_default_tiles(product):
    """The step's MLA absorption GEMVs (``kernels/triton/head_gemv.py``) at its tiles, under PDL."""
    from torchinferno.kernels.triton import head_gemv as hg
    from torchinferno.models.deepseek_v32.cuda_decode import DEFAULT_CONFIGS

    cfg = DEFAULT_CONFIGS[product]
    compile_sm90(hg._head_gemv_kernel, {"X": "*bf16", "W": "*bf16", "Y": "*bf16"}, dict(
        BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], PDL=True, EARLY_LAUNCH=cfg["early_launch"]),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


@pytest.mark.parametrize("kv,q,decode_m", [("*bf16", "*bf16", 0), ("*fp8e4nv", "*bf16", 0), ("*fp32", "*fp32", 0),
                                           ("*bf16", "*bf16", 16), ("*fp8e4nv", "*bf16", 16)])
def test_prefill_attention_compiles(kv, q, decode_m):
    """The varlen prefill kernel, also with its one-token-query path (``DECODE_M``: graph-padded steps)."""
    from torchinferno.kernels.triton import prefill_attention as pa

    compile_sm90(pa._prefill_kernel, {"Q": q, "KC": kv, "VC": kv, "OUT": q, "QSL": "*i32", "SEQ": "*i32", "BT": "*i32"},
                 dict(GROUP=4, GROUP_PAD=4, D=128, D_PAD=128, DV=128, DV_PAD=128, PAGE=16, BLOCK_Q=32, BLOCK_N=64,
                      IEEE=q == "*fp32", F16_DOT=kv == "*fp8e4nv", DECODE_M=decode_m), floats=("qk_scale",),
                 num_warps=8)


@pytest.mark.parametrize("residual", [False, True])
def test_norm_activation_rotary_kv_append_compile(residual):
    from torchinferno.kernels.triton import activation, kv_cache, norm, rotary

    compile_sm90(norm._rms_norm_kernel, {p: "*bf16" for p in ("X", "R", "W", "Y", "H")},
                 dict(HAS_RESIDUAL=residual, BLOCK_D=4096), floats=("eps",), num_warps=8)
    compile_sm90(activation._swiglu_kernel, {"GU": "*bf16", "OUT": "*bf16"}, dict(BLOCK=1024))
    from torchinferno.kernels.triton import moe_combine  # the grouped-GEMM MoE's combine; extra row with residual

    compile_sm90(moe_combine._weighted_gather_sum_kernel, {"Y": "*bf16", "RANK": "*i64", "W": "*fp32", "EXTRA": "*bf16",
                                                           "OUT": "*bf16"}, dict(HAS_EXTRA=residual, BLOCK=1024))
    compile_sm90(rotary._rotary_neox_kernel, {p: "*bf16" for p in ("X", "COS", "SIN", "OUT")},
                 dict(BLOCK_H=16, BLOCK_HALF=64))
    cache = "*fp8e4nv" if residual else "*bf16"  # both cache kinds, one per parameter
    compile_sm90(kv_cache._kv_append_kernel, {"K": "*bf16", "V": "*bf16", "KC": cache, "VC": cache, "SLOTS": "*i64"},
                 dict(BLOCK_H=8, BLOCK_D=128, BLOCK_DV=128, SAT=448.0 if residual else 0.0))


def test_fp8_and_fused_mlp_kernels_compile():
    from torchinferno.kernels.triton import fp8_gemv, fp8_quant, gemm_swiglu

    compile_sm90(fp8_quant._quant_rows_kernel, {"X": "*bf16", "Q": "*fp8e4nv", "S": "*fp32"},
                 dict(QMAX=fp8_quant.E4M3_MAX, INV_QMAX=fp8_quant.INV_E4M3_MAX, FLOOR=fp8_quant.EPS, BLOCK=4096,
                      ONE_PASS=True), num_warps=8)
    compile_sm90(fp8_gemv._fp8_skinny_dot_kernel, {"XQ": "*fp8e4nv", "XS": "*fp32", "W": "*fp8e4nv", "WS": "*fp32",
                                                   "Y": "*bf16"}, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=512), num_stages=3)
    for cfg in (gemm_swiglu._config(16), gemm_swiglu._config(2048)):
        cfg = dict(cfg)
        warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
        compile_sm90(gemm_swiglu._mm_swiglu_kernel, {"A": "*bf16", "W": "*bf16", "Y": "*bf16"},
                     dict(cfg, EVEN_K=True), num_warps=warps, num_stages=stages)


@pytest.mark.parametrize("out,even_k,bias", [("*bf16", True, False), ("*fp32", False, True)])
def test_fp8_block_kernels_compile(out, even_k, bias):
    """The block-FP8 quantizer, GEMM (every default tile row) and grouped MoE GEMMs (gate_up with SwiGLU, down with
    the routing weight) for sm_90 (kernels/triton/fp8_block.py, fp8_block_moe.py)."""
    from torchinferno.kernels.fp8_block import M_TILES
    from torchinferno.kernels.triton import fp8_block, fp8_block_moe

    compile_sm90(fp8_block._group_quant_kernel, {"X": out, "Q": "*fp8e4nv", "S": "*fp32"},
                 dict(GB=8, GROUP_K=128))
    for _, cfg in M_TILES:
        compile_sm90(fp8_block._block_mm_kernel, {"A": "*fp8e4nv", "AS": "*fp32", "B": "*fp8e4nv", "BS": "*fp32",
                                                  "C": out, "BIAS": out, "WS": "*fp32"},
                     dict(BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=128, GROUP_M=cfg.GROUP_M, EVEN_K=even_k,
                          HAS_BIAS=bias, QUANT_A=False, SPLIT_K=1), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    cfg = M_TILES[0][1]  # decode rows: the GEMM quantizes the activation itself, and splits K
    for split in (1, 4):
        compile_sm90(fp8_block._block_mm_kernel, {"A": out, "AS": "*fp32", "B": "*fp8e4nv", "BS": "*fp32", "C": out,
                                                  "BIAS": out, "WS": "*fp32"},
                     dict(BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=128, GROUP_M=cfg.GROUP_M, EVEN_K=even_k,
                          HAS_BIAS=bias, QUANT_A=True, SPLIT_K=split),
                     num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    from torchinferno.kernels.triton import tiles

    compile_sm90(tiles._sum_terms_kernel, {"Y": "*fp32", "OUT": out, "BIAS": out}, dict(HAS_BIAS=bias, BLOCK=1024))
    ptrs = {"A": "*fp8e4nv", "AS": "*fp32", "B": "*fp8e4nv", "BS": "*fp32", "W": "*fp32", "sorted_pairs": "*i32",
            "block_expert": "*i32", "num_padded": "*i32"}
    for swiglu in (True, False):
        for quant_a in (False, True):  # quant_a: the unquantized activation, quantized in the kernel (decode)
            compile_sm90(fp8_block_moe._moe_fp8_kernel, dict(ptrs, A=out if quant_a else "*fp8e4nv",
                                                             C=out if swiglu else "*fp32"),
                         dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, EVEN_K=even_k, SWIGLU=swiglu,
                              MUL_WEIGHT=not swiglu, ROUND=1 if out == "*bf16" else 0, QUANT_A=quant_a), num_stages=3)


@pytest.mark.parametrize("dtype,sink,tail", [
    ("*bf16", False, True),   # V3.2 DSA absorbed decode: 576-wide keys, the first 512 values, no sink (run s18a)
    ("*fp32", False, True),
    ("*bf16", True, False),   # V4 decode: K = V rows of 512, a sink per head
])
def test_sparse_sink_decode_kernels_compile(dtype, sink, tail):
    from torchinferno.kernels.triton import sparse_sink_decode as ssd

    ptrs = {"Q": dtype, "KV": dtype, "WIN": "*i32", "ENT_C": dtype, "ENT": "*i32", "SINKS": "*fp32", "OUT": "*fp32",
            "PM": "*fp32", "PL": "*fp32"}
    compile_sm90(ssd._sparse_sink_kernel, ptrs, dict(
        BLOCK_H=16, BLOCK_D=512, BLOCK_T=64 if tail else 16, BLOCK_N=16, SPLITS=4, HAS_SINK=sink, HAS_TAIL=tail,
        PRECISION="ieee" if dtype == "*fp32" else "tf32", ROUND_LOGITS=False), floats=("scale",))
    compile_sm90(ssd._merge_kernel, {"PACC": "*fp32", "PM": "*fp32", "PL": "*fp32", "SINKS": "*fp32", "OUT": dtype},
                 dict(SPLITS=4, BLOCK_S=4, BLOCK_D=512, HAS_SINK=sink))


@pytest.mark.parametrize("paged", [False, True])
def test_indexer_scores_kernel_compiles(paged):
    from torchinferno.kernels.triton import indexer_scores as ix

    compile_sm90(ix._indexer_scores_kernel, {"q_ptr": "*bf16", "k_ptr": "*bf16", "w_ptr": "*fp32", "lim_ptr": "*i32",
                                             "out_ptr": "*fp32", "tab_ptr": "*i32"},
                 dict(HAS_LIMIT=True, IEEE=False, BLOCK_Q=64, BLOCK_S=128, BLOCK_D=128, PAGED=paged,
                      PAGE=64 if paged else 1), floats=("scale",), num_warps=8)


def test_compile_harness_rejects_what_does_not_compile():
    """The harness reports a kernel Triton rejects (so a passing test above means something)."""
    import triton.language as tl

    @triton.jit
    def _bad(X, BLOCK: tl.constexpr):
        x = tl.load(X + tl.arange(0, BLOCK))  # BLOCK not a power of two: rejected by tl.arange
        tl.store(X + tl.arange(0, BLOCK), x)

    compile_sm90(_bad, {"X": "*fp32"}, {"BLOCK": 64})
    with pytest.raises(Exception):
        compile_sm90(_bad, {"X": "*fp32"}, {"BLOCK": 48})


def test_mla_prefill_kernel_compiles():
    """The in-place MLA prefill attention at DeepSeek's head dims with its default bf16 tiles (shared memory for
    3 stages of 64-key tiles fits sm_90)."""
    from torchinferno.kernels.triton import mla_prefill_attention as m

    cfg = m.default_config(False)
    compile_sm90(m._mla_prefill_kernel, {p: "*bf16" for p in ("QN", "QP", "KV", "KP", "OUT")},
                 dict(DN=128, DN_PAD=128, R=64, R_PAD=64, DV=128, DV_PAD=128, BLOCK_M=cfg["block_m"],
                      BLOCK_N=cfg["block_n"], IEEE=False), floats=("qk_scale",), num_warps=cfg["num_warps"],
                 num_stages=cfg["num_stages"])
