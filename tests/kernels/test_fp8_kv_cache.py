"""FP8 KV cache: storage rule, torch paths, engine, and the Triton kernels (CUDA only).

An FP8 cache stores ``clamp(x, -max, max).to(float8)`` (unscaled); every reader must compute
exactly what it would over a higher-precision cache holding those dequantized values. So each
check runs the same op twice: over the FP8 cache, and over an fp32 copy of its contents.
"""

from __future__ import annotations

import pytest
import torch

from torchinferno.engine.config import EngineConfig
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.errors import ConfigError
from torchinferno.kernels import api
from torchinferno.kernels.kv_dtype import kv_store_values, parse_kv_cache_dtype
from torchinferno.models.common.attention import TorchAttention
from torchinferno.models.common.attention_metadata import build_attention_metadata
from torchinferno.testing import tiny_model

FP8 = torch.float8_e4m3fn


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.uint8)


def test_store_rule_saturates_and_rounds_once():
    x = torch.tensor([0.0, 1.0, -3.5, 0.3, 447.0, 449.0, 1e4, -1e4, float("inf")])
    got = kv_store_values(x, FP8).float()
    assert got[:3].tolist() == [0.0, 1.0, -3.5]  # representable values are exact
    assert abs(got[3].item() - 0.3) <= 0.3 * 2**-4  # 3 mantissa bits: within half an ulp
    assert got[5:].tolist() == [448.0, 448.0, -448.0, 448.0]  # saturates, never NaN
    assert kv_store_values(x, torch.float32) is not None and kv_store_values(x, torch.float32).dtype == torch.float32


def test_kv_cache_dtype_spellings():
    assert parse_kv_cache_dtype("fp8") is FP8 and parse_kv_cache_dtype("fp8_e5m2") is torch.float8_e5m2
    assert parse_kv_cache_dtype("auto") is None and parse_kv_cache_dtype(torch.bfloat16) is torch.bfloat16
    assert EngineConfig(kv_cache_dtype="fp8").kv_cache_dtype is FP8
    with pytest.raises(ConfigError, match="valid: auto, bfloat16, float16, float32, fp8"):
        EngineConfig(kv_cache_dtype="int4")


def test_write_kv_cache_torch_path_stores_the_rule_and_skips_padding():
    g = torch.Generator().manual_seed(0)
    kc = torch.zeros(4, 8, 2, 16, dtype=FP8)
    vc = torch.zeros(4, 8, 2, 12, dtype=FP8)
    k = torch.randn(5, 2, 16, generator=g) * 300  # some values past 448
    v = torch.randn(5, 2, 12, generator=g)
    slots = torch.tensor([3, -1, 17, 30, 9])
    api.write_kv_cache(k, v, kc, vc, slots)
    keep = slots >= 0
    assert torch.equal(_bytes(kc.view(-1, 2, 16)[slots[keep]]), _bytes(kv_store_values(k[keep], FP8)))
    assert torch.equal(_bytes(vc.view(-1, 2, 12)[slots[keep]]), _bytes(kv_store_values(v[keep], FP8)))
    assert int(_bytes(kc).view(-1, 2 * 16).any(-1).sum()) == 4  # nothing else written


def _run_attention(cache_dtype, q, k, v, kc, vc, meta):
    attn = TorchAttention(q.shape[1], k.shape[1], q.shape[-1] ** -0.5)
    kc, vc = kc.to(cache_dtype), vc.to(cache_dtype)
    with torch.inference_mode():
        out = attn(q, k, v, (kc, vc), meta)
    return out, kc, vc


@pytest.mark.parametrize("case", ["decode_dense_rows", "decode_gather", "decode_ragged", "extend"])
def test_torch_attention_over_fp8_equals_fp32_over_dequantized(case):
    g = torch.Generator().manual_seed(1)
    H, Hkv, D, bs, nblocks = 6, 2, 16, 8, 9
    kc8 = kv_store_values(torch.randn(nblocks, bs, Hkv, D, generator=g) * 4, FP8)
    vc8 = kv_store_values(torch.randn(nblocks, bs, Hkv, D, generator=g), FP8)
    if case == "extend":  # chunked prefill: 3 new tokens after 10 cached, and a fresh 4-token prompt
        qlens, ctxs, tables = [3, 4], [10, 0], [[5, 2], [7]]
    else:
        rows = {"decode_dense_rows": [1, 2, 3], "decode_gather": [6, 0, 4], "decode_ragged": [1, 2, 3]}[case]
        lens = [7, 7, 7] if case != "decode_ragged" else [3, 8, 5]
        qlens, ctxs, tables = [1] * 3, [n - 1 for n in lens], [[r] for r in rows]
    meta = build_attention_metadata(qlens, ctxs, tables, bs)
    meta.block_tables_host = tables if case != "extend" else None
    T = sum(qlens)
    q = torch.randn(T, H, D, generator=g)
    k = torch.randn(T, Hkv, D, generator=g) * 4
    v = torch.randn(T, Hkv, D, generator=g)
    out8, kc8, vc8 = _run_attention(FP8, q, k, v, kc8, vc8, meta)
    # Reference: fp32 caches holding the dequantized FP8 contents, fed the stored (rounded) new K/V.
    out32, kc32, vc32 = _run_attention(torch.float32, q, kv_store_values(k, FP8).float(), kv_store_values(v, FP8).float(),
                                       kc8.float(), vc8.float(), meta)
    assert torch.equal(kc8.float(), kc32) and torch.equal(vc8.float(), vc32)  # same bytes written
    torch.testing.assert_close(out8, out32, atol=1e-6, rtol=1e-6)
    # ...and it is the FP8 contents that were read: the unrounded K/V give a different answer.
    out_unrounded, _, _ = _run_attention(torch.float32, q, k, v, kc8.float(), vc8.float(), meta)
    assert not torch.allclose(out8, out_unrounded, atol=1e-4)


def test_paged_reference_reads_fp8_caches():
    g = torch.Generator().manual_seed(2)
    kc = kv_store_values(torch.randn(5, 4, 2, 8, generator=g), FP8)
    vc = kv_store_values(torch.randn(5, 4, 2, 8, generator=g), FP8)
    q = torch.randn(2, 4, 8, generator=g)
    bt = torch.tensor([[3, 1], [0, 4]], dtype=torch.int32)
    got = api.batched_paged_decode_attention(q, kc, vc, bt, torch.tensor([6, 3], dtype=torch.int32), 0.3)
    want = api.paged_attention_reference(q, kc.float(), vc.float(), [1, 1], [6, 3], bt, 0.3)
    torch.testing.assert_close(got, want)


def _greedy(engine: LLMEngine, prompts, max_tokens=6):
    from torchinferno.core.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    out = engine.run_to_completion()
    return [out[f"r{i}"].token_ids for i in range(len(prompts))]


def test_engine_fp8_cache_halves_bytes_and_generates(one_thread):
    model = tiny_model("llama3", seed=0)
    kw = {"block_size": 4, "kv_cache_memory": 256 * 1024, "max_num_seqs": 4, "max_model_len": 64}
    e32 = LLMEngine(model, None, EngineConfig(**kw))
    e8 = LLMEngine(model, None, EngineConfig(**kw, kv_cache_dtype="fp8"))
    assert e8.kv_cache.dtype is FP8 and all(t.dtype is FP8 for layer in e8.kv_cache.tensors for t in layer)
    assert e8.kv_cache.num_blocks == 4 * e32.kv_cache.num_blocks  # 1 byte per value instead of 4
    assert "float8_e4m3fn" in e8.describe()
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 250, (n,), generator=g).tolist() for n in (5, 11, 17)]
    got, want = _greedy(e8, prompts), _greedy(e32, prompts)
    assert all(len(x) == 6 for x in got)
    # FP8 rounding may flip a late near-tie, but the first token of most rows must agree.
    assert sum(x[0] == y[0] for x, y in zip(got, want)) >= 2
    assert e8.pool.num_used == 0


def test_engine_rejects_fp8_for_latent_caches():
    model = tiny_model("deepseek-v3.2", seed=0)
    with pytest.raises(ConfigError, match="GQA"):
        LLMEngine(model, None, EngineConfig(kv_cache_dtype="fp8", num_gpu_blocks=8, max_model_len=32))


# ------------------------------------------------------------------------------------- CUDA
def _dequantized_reference(q, kc, vc, qlens, slens, bt, scale):
    return api.paged_attention_reference(q.double().cpu(), kc.cpu().double(), vc.cpu().double(), qlens, slens,
                                         bt.cpu(), scale)


def _rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    assert not torch.isnan(a).any()
    return float((a - b).norm() / b.norm())


@pytest.mark.cuda
def test_triton_kv_append_fp8_matches_torch_rule(cuda_dev):
    from torchinferno.kernels.triton import kv_cache

    g = torch.Generator().manual_seed(4)
    kc = torch.zeros(6, 16, 2, 64, dtype=FP8, device=cuda_dev)
    vc = torch.zeros(6, 16, 2, 48, dtype=FP8, device=cuda_dev)
    kv = (torch.randn(9, 2 * (64 + 48), generator=g) * 200).to(torch.bfloat16).to(cuda_dev)
    k, v = kv[:, :128].view(9, 2, 64), kv[:, 128:].view(9, 2, 48)  # strided slices, as in the model
    slots = torch.randperm(96, generator=g)[:9].clone()
    slots[4] = -1
    kv_cache.write_kv_cache(k, v, kc, vc, slots.to(cuda_dev))
    kref, vref = torch.zeros_like(kc).cpu(), torch.zeros_like(vc).cpu()
    api.write_kv_cache(k.cpu(), v.cpu(), kref, vref, slots)
    assert torch.equal(_bytes(kc), _bytes(kref)) and torch.equal(_bytes(vc), _bytes(vref))


@pytest.mark.cuda
@pytest.mark.parametrize("num_splits", [None, 1, 8])
def test_triton_decode_over_fp8_cache(cuda_dev, num_splits):
    from torchinferno.kernels.triton import decode_attention

    g = torch.Generator().manual_seed(5)
    lens, H, Hkv, D, page = [1, 17, 300, 1029], 32, 8, 128, 16
    nblk = sum(-(-n // page) for n in lens) + 2
    kc = kv_store_values(torch.randn(nblk, page, Hkv, D, generator=g) * 3, FP8).to(cuda_dev)
    vc = kv_store_values(torch.randn(nblk, page, Hkv, D, generator=g), FP8).to(cuda_dev)
    perm = torch.randperm(nblk, generator=g)
    bt = torch.zeros(len(lens), max(-(-n // page) for n in lens), dtype=torch.int32)
    i = 0
    for b, n in enumerate(lens):
        nb = -(-n // page)
        bt[b, :nb] = perm[i:i + nb].to(torch.int32)
        i += nb
    q = torch.randn(len(lens), H, D, generator=g).to(torch.bfloat16).to(cuda_dev)
    out = decode_attention.batched_paged_decode_attention(q, kc, vc, bt.to(cuda_dev),
                                                          torch.tensor(lens, dtype=torch.int32, device=cuda_dev),
                                                          D**-0.5, num_splits=num_splits)
    assert _rel(out, _dequantized_reference(q, kc, vc, [1] * 4, lens, bt, D**-0.5)) < 1.5e-2


@pytest.mark.cuda
def test_triton_prefill_over_fp8_cache(cuda_dev):
    from torchinferno.kernels.triton import prefill_attention

    g = torch.Generator().manual_seed(6)
    qlens, ctxs, H, Hkv, D, page = [1, 40, 130, 7], [50, 0, 33, 200], 8, 2, 64, 16
    lens = [c + q for c, q in zip(ctxs, qlens)]
    nblk = sum(-(-n // page) for n in lens)
    kc = kv_store_values(torch.randn(nblk, page, Hkv, D, generator=g) * 3, FP8).to(cuda_dev)
    vc = kv_store_values(torch.randn(nblk, page, Hkv, D, generator=g), FP8).to(cuda_dev)
    bt = torch.zeros(len(lens), max(-(-n // page) for n in lens), dtype=torch.int32)
    i = 0
    for b, n in enumerate(lens):
        nb = -(-n // page)
        bt[b, :nb] = torch.arange(i, i + nb, dtype=torch.int32)
        i += nb
    T = sum(qlens)
    q = torch.randn(T, H, D, generator=g).to(torch.bfloat16).to(cuda_dev)
    qsl = torch.tensor([0, *torch.cumsum(torch.tensor(qlens), 0).tolist()], dtype=torch.int32, device=cuda_dev)
    out = prefill_attention.paged_prefill_attention(q, kc, vc, qsl, torch.tensor(lens, dtype=torch.int32, device=cuda_dev),
                                                    bt.to(cuda_dev), D**-0.5)
    assert _rel(out, _dequantized_reference(q, kc, vc, qlens, lens, bt, D**-0.5)) < 1.5e-2


@pytest.mark.cuda
def test_cuda_engine_fp8_graphs_equal_eager(cuda_dev):
    from torchinferno.models.common.attention_triton import TritonPagedAttention

    model = tiny_model("llama3", device=cuda_dev, dtype=torch.bfloat16, attention_backend=TritonPagedAttention)
    kw = {"max_num_seqs": 8, "max_num_batched_tokens": 64, "block_size": 4, "max_model_len": 64, "kv_cache_dtype": "fp8"}
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 250, (int(n),), generator=g).tolist() for n in torch.randint(1, 40, (11,), generator=g)]
    graphs = LLMEngine(model, None, EngineConfig(**kw))
    assert graphs.runner.uses_cuda_graphs
    eager = LLMEngine(model, None, EngineConfig(**kw, enforce_eager=True))
    assert _greedy(graphs, prompts, 9) == _greedy(eager, prompts, 9)
    assert graphs.stats().num_graph_steps > 0


def test_perf_smoke_fp8_cache_cli_cpu(capsys):
    import json

    from torchinferno.cli.main import main

    rc = main(["perf-smoke", "--device", "cpu", "--seq-len", "40", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
               "--iters", "2", "--kv-cache-dtype", "fp8", "--dtype", "float32"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["kv_cache_dtype"] == "float8_e4m3fn" and res["kv_bytes"] == 40 * 2 * 32  # one byte per value
    assert all(r["max_abs_err"] < 1e-5 for r in res["rows"])  # every path reads the stored values
