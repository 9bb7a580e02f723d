"""bench-moe / tune-moe pieces that run without a GPU: the transformers peer is the same model (fp32 logits), the
layer and model sections run end to end on CPU with a wall-clock timer standing in for CUDA events, the V2-Lite-like
size has the issue's parameter count, and the tuner's grid fits the rows per expert."""

from __future__ import annotations

import time

import pytest
import torch

import torchinferno.bench.moe_bench as mb
import torchinferno.bench.moe_layer_bench as ml
from torchinferno.testing import tiny_model


def _wall_ms(fn, iters=1, warmup=0, **_):
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def test_transformers_peer_shares_our_weights_and_agrees():
    pytest.importorskip("transformers")
    model = tiny_model("deepseek-v3.2", size="debug-v3")
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.uniform_(-0.3, 0.3)
    hf = mb.hf_peer(model)
    assert hf.model.layers[1].mlp.experts.gate_up_proj.data_ptr() == model.model.layers[1].mlp.experts.gate_up_proj.data_ptr()
    ids = torch.randint(0, 320, (12,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
        got = model.compute_logits(model(ids, torch.arange(12)))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_sections_run_on_cpu(monkeypatch):
    for mod in (mb, ml):
        monkeypatch.setattr(mod, "cuda_time_ms", _wall_ms)
    monkeypatch.setattr(ml, "graph_time_ms", _wall_ms)
    monkeypatch.setattr(mb, "device_time_ms", _wall_ms)
    cpu = torch.device("cpu")
    rows = ml.layer_rows(cpu, E=8, top_k=2, D=32, inter=16, shared=1, batches=(1, 4), prefill=16, bw=1e11, mm=1e12,
                         log=lambda *_: None)
    assert [r["tokens"] for r in rows] == [1, 4, 16] and all(r["rel_err_vs_torch"] == 0 for r in rows)
    assert rows[0]["experts_hit"] <= 2 and "pct_of_matmul_rate" in rows[-1] and rows[0]["separate_shared_ms"] > 0
    assert rows[0]["shared_in_ms"] > 0 and "other_small_m_path_ms" in rows[1] and "other_small_m_path_ms" not in rows[2]
    model = tiny_model("deepseek-v3.2", size="debug-v3").to(torch.bfloat16)
    rep = mb.model_rows(model, cpu, batches=(1, 3), ctx=8, prefill=16, bw=1e11, mm=1e12, log=lambda *_: None)
    assert [r["batch"] for r in rep["decode"]] == [1, 3] and rep["prefill"]["tokens"] == 16
    assert rep["lean_step"] is None and "module_path_b1_ms" not in rep  # no lean step for deepseek on CPU
    assert rep["prefill"]["fused_device_ms"] > 0  # the prefill without host issue time, beside its wall time
    assert "per_layer" in rep["launches_b1"]  # (no CUDA kernels on CPU; the count itself: tests/kernels/test_launch_count)
    b1 = rep["decode"][0]
    dense = mb.active_bytes(model, [0] * 2)
    assert dense < b1["active_bytes"] <= dense + 2 * 2 * 3 * 64 * 32 * 2 + 8 * model.family.kv_spec(
        model.config).bytes_per_token(torch.bfloat16)  # 2 MoE layers x top-2 experts of 3 x D x I bf16 + KV


def test_v2_lite_shape_counts():
    from torchinferno.models.registry import get_family

    fam = get_family("deepseek-v3.2")
    model = fam.build(fam.size("v2-lite-shape"), device="meta").to(torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(9.27e9, rel=0.01)
    # without the embedding table, with the shared experts (2.56e9 before session 17: the name filter for the routed
    # experts' tensors also dropped the shared experts', which every step reads)
    assert mb.active_bytes(model, [6] * 15) == pytest.approx(3.08e9, rel=0.01)


def test_v3_scaled_shape(monkeypatch):
    """--model-shape v3-scaled: DeepSeek-V3's layers (first dense, the rest 256 experts top-8), fewer of them."""
    monkeypatch.setattr("torchinferno.bench.moe_models._randomize", lambda m, seed=0: None)
    monkeypatch.setattr("torchinferno.models.common.module_utils.materialize", lambda m, dev, dt: m.to(dtype=dt))
    model = mb.build_model_shape(torch.device("meta"), "v3-scaled", 3)
    assert model.config.layer_mlp_types == ("dense", "sparse", "sparse")
    assert model.config.hidden_size == 7168 and model.config.n_routed_experts == 256
    moe_bytes = 256 * 3 * 7168 * 2048 * 2
    assert sum(p.numel() * 2 for p in model.parameters()) == pytest.approx(2 * moe_bytes + 4.6e9, rel=0.05)
    with pytest.raises(ValueError, match="v2-lite"):
        mb.build_model_shape(torch.device("meta"), "v4", 1)


def test_tune_grid_bounds():
    from torchinferno.bench.moe_tune import grid

    assert {c["BLOCK_M"] for c in grid(6 / 64)} == {16}
    assert max(c["BLOCK_M"] for c in grid(192)) == 128
    assert all(c["num_warps"] in (4, 8) for c in grid(24))
    # prefill-sized row blocks add deeper pipelines; 256-wide N tiles only where asked (not gate_up's two accumulators)
    assert max(c["num_stages"] for c in grid(64)) == 4 and max(c["num_stages"] for c in grid(192)) == 5
    assert max(c["BLOCK_N"] for c in grid(192)) == 256 and max(c["BLOCK_N"] for c in grid(192, wide_n=False)) == 128
    assert len(grid(192)) == len({tuple(sorted(c.items())) for c in grid(192)}) <= 30
    assert min(c["BLOCK_M"] for c in grid(192)) == 64


def test_model_section_times_the_module_path_beside_a_lean_step(monkeypatch):
    """Where the family has a batch-1 step (CUDA; here a stand-in that declines every batch, on CPU), batch 1 is also
    timed through the module path in the same run, wall and device time."""
    from torchinferno.models.common import step_model as sm

    monkeypatch.setattr(mb, "cuda_time_ms", _wall_ms)
    monkeypatch.setattr(mb, "device_time_ms", _wall_ms)

    class Declines:
        def __call__(self, *args):
            return None

    monkeypatch.setattr(sm, "step_model", lambda model, dev, **kw: sm.LeanStepModel(model, Declines()))
    model = tiny_model("deepseek-v3.2", size="debug-v3").to(torch.bfloat16)
    rep = mb.model_rows(model, torch.device("cpu"), batches=(1,), ctx=8, prefill=0, log=lambda *_: None)
    assert rep["lean_step"] == "Declines" and rep["module_path_b1_ms"] > 0 and rep["module_path_b1_device_ms"] > 0


def test_fp8_block_model_section_on_cpu(monkeypatch):
    """--quantization fp8-block: the layer-by-layer built model runs the model section without the torch MoE
    reference; its active weights are the bf16 model's elements in fewer bytes (FP8 buffers counted, scales aside)."""
    from torchinferno.models.deepseek_v32.config import tiny_deepseek_v32_config

    monkeypatch.setattr(mb, "cuda_time_ms", _wall_ms)
    monkeypatch.setattr(mb, "device_time_ms", _wall_ms)
    monkeypatch.setattr(mb, "graph_time_ms", lambda fn, **kw: _wall_ms(fn))
    cfg = tiny_deepseek_v32_config(moe_intermediate_size=128, hidden_size=128)
    bf16, fp8 = mb.build_random(cfg, "cpu"), mb.build_random(cfg, "cpu", "fp8-block")
    (b_bytes, b_n), (f_bytes, f_n) = mb.active_weights(bf16, [2, 2]), mb.active_weights(fp8, [2, 2])
    assert f_n == b_n and f_bytes < 0.75 * b_bytes
    rep = mb.model_rows(fp8, torch.device("cpu"), batches=(1, 2), ctx=8, prefill=8, log=lambda *_: None,
                        torch_moe=False)
    assert [r["torch_ms"] for r in rep["decode"]] == [None, None] and rep["prefill"]["torch_ms"] is None
    # every weight GEMM for all 8 tokens but the LM head, which the prefill applies to the last token only
    head = cfg.vocab_size * cfg.hidden_size
    active = mb.active_weights(fp8, [cfg.num_experts_per_tok] * 2)[1]
    assert fp8.lm_head is not None and rep["prefill"]["flops_weights"] == 2 * (8 * (active - head) + head)
    assert rep["prefill"]["fused_graph_ms"] > 0 and "graph_error" not in rep["prefill"]
