"""deepseek-v3.2 internal equalities: absorbed == expanded, paged == dense, chunked == full,
indexer == dense reference, grouped MoE == per-token reference, v1 == v0, checkpoint/config errors."""

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from torchinferno.checkpoint import safetensors_io
from torchinferno.checkpoint.auto import load_model_auto, save_pretrained
from torchinferno.errors import CheckpointError, ConfigError
from torchinferno.models.common import mla, moe
from torchinferno.models.common.attention_metadata import build_attention_metadata, positions_for
from torchinferno.models.deepseek_v32.config import config_from_hf, config_to_hf, tiny_deepseek_v32_config
from torchinferno.models.registry import family_for_hf_config, get_family
from torchinferno.testing import randomize_

FAM = get_family("deepseek-v3.2")
V = 320


def make(cfg, seed=0, variant="v0", absorb_decode=True):
    torch.manual_seed(seed)
    m = randomize_(FAM.build(cfg, device="cpu", variant=variant, absorb_decode=absorb_decode).eval(), correction_bias=0.3)
    m.family = FAM
    return m


def twin(m, **kw):
    other = FAM.build(m.config, device="cpu", **kw).eval()
    other.load_state_dict(m.state_dict())
    return other


# 4 indexer heads: exact-zero (tied) scores happen, so selection must be layout independent.
CFGS = {
    "v32-top5-4heads": replace(tiny_deepseek_v32_config(), index_n_heads=4, index_topk=5),
    "v3": replace(tiny_deepseek_v32_config(), index_n_heads=0),
}


@pytest.fixture(scope="module", params=sorted(CFGS))
def model(request):
    return make(CFGS[request.param])


def run_schedule(m, rows, chunks, block_size, tables, num_blocks):
    """Feed each row in chunks (chunks[i] = list of chunk lengths; 1s are decode steps), all rows per step.

    Returns the logits of every fed token, per row, concatenated in row order.
    """
    caches = FAM.kv_spec(m.config).allocate(num_blocks, block_size, torch.float32, "cpu")
    done = [0] * len(rows)
    out = [[] for _ in rows]
    for step in range(max(len(c) for c in chunks)):
        active = [i for i in range(len(rows)) if step < len(chunks[i])]
        qlens = [chunks[i][step] for i in active]
        ctx = [done[i] for i in active]
        meta = build_attention_metadata(qlens, ctx, [tables[i] for i in active], block_size)
        ids = torch.cat([rows[i][done[i] : done[i] + q] for i, q in zip(active, qlens)])
        with torch.no_grad():
            logits = m.compute_logits(m(ids, positions_for(qlens, ctx), caches, meta))
        for (i, q), part in zip(zip(active, qlens), logits.split(qlens)):
            out[i].append(part)
            done[i] += q
    return torch.cat([torch.cat(o) for o in out])


def _rows(lengths, seed=7):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (n,), generator=g) for n in lengths]


def test_absorbed_decode_equals_expanded_and_full(model):
    """Batched ragged decode: absorbed latent attention == expanded kv_b_proj attention == full forward."""
    expanded = twin(model, absorb_decode=False)
    rows = _rows([14, 11, 16])
    chunks = [[6] + [1] * 8, [3] + [1] * 8, [8] + [1] * 8]
    tables = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    a = run_schedule(model, rows, chunks, 4, tables, 12)
    b = run_schedule(expanded, rows, chunks, 4, tables, 12)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        full = torch.cat([model.compute_logits(model(r, torch.arange(len(r)))) for r in rows])
    torch.testing.assert_close(a, full, atol=1e-5, rtol=1e-5)


def test_paged_shuffled_equals_dense(model):
    """Block size 4 with a shuffled block table == one block per row; includes chunked prefill with context."""
    rows = _rows([19, 13], seed=8)
    chunks = [[7, 5] + [1] * 7, [4, 4] + [1] * 5]
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(0)).tolist()
    paged = run_schedule(model, rows, chunks, 4, [perm[:5], perm[5:]], 10)
    dense = run_schedule(model, rows, chunks, 32, [[0], [1]], 2)
    torch.testing.assert_close(paged, dense, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        full = torch.cat([model.compute_logits(model(r, torch.arange(len(r)))) for r in rows])
    torch.testing.assert_close(paged, full, atol=1e-5, rtol=1e-5)


def test_absorbed_attention_matches_expanded_op():
    g = torch.Generator().manual_seed(1)
    H, dn, dv, R, r, L = 4, 16, 12, 32, 8, 9
    w = torch.randn(H * (dn + dv), R, generator=g) * 0.2
    qn, qp = torch.randn(2, H, dn, generator=g), torch.randn(2, H, r, generator=g)
    lat = torch.randn(2, L, R + r, generator=g)
    mask = torch.rand(2, L, generator=g) > 0.4
    mask[:, 0] = True
    got = mla.mla_absorbed_attention(qn, qp, lat, w, 0.3, mask)
    for b in range(2):
        want = mla.mla_expanded_attention(qn[b : b + 1], qp[b : b + 1], lat[b], w, 0.3, mask[b : b + 1])
        torch.testing.assert_close(got[b : b + 1], want, atol=1e-5, rtol=1e-5)


def test_indexer_selection_matches_dense_reference():
    """Vectorized scores + top-k over a causal block with context == the per-query dense reference."""
    g = torch.Generator().manual_seed(2)
    Q, S, Hi, Di, k = 6, 15, 8, 16, 5
    ctx = S - Q
    q, kk = torch.randn(Q, Hi, Di, generator=g), torch.randn(S, Di, generator=g)
    w = torch.randn(Q, Hi, generator=g)
    visible = torch.arange(S)[None] <= (ctx + torch.arange(Q))[:, None]
    from torchinferno.models.deepseek_v32.model import IndexTopK

    scores = mla.masked_scores(mla.indexer_scores(q, kk, w), visible)
    keep = mla.topk_keep_mask(scores, visible, IndexTopK(k)(scores))
    want = mla.reference_indexer_topk(q, kk, w, k, context_len=ctx)
    assert [set(torch.nonzero(row).flatten().tolist()) for row in keep] == want


def test_model_indexer_selection_matches_dense_reference():
    """The top-k a real V3.2 forward selects (hooked) == the dense reference on its own q/k/w."""
    from torchinferno.models.deepseek_v32.model import DSAIndexer, IndexTopK

    m = make(replace(tiny_deepseek_v32_config(), index_topk=6))
    proj, sel = [], []
    hooks = [x.register_forward_hook(lambda _m, _i, o: proj.append(o)) for x in m.modules() if isinstance(x, DSAIndexer)]
    hooks += [x.register_forward_hook(lambda _m, _i, o: sel.append(o)) for x in m.modules() if isinstance(x, IndexTopK)]
    ids = _rows([17], seed=9)[0]
    with torch.no_grad():
        m(ids, torch.arange(17))
    for h in hooks:
        h.remove()
    for p, s in zip(proj, sel, strict=True):
        want = mla.reference_indexer_topk(p.q, p.k, p.w, 6)
        got = [{int(i) for i in row if i <= t} for t, row in enumerate(s)]
        assert got == want


def test_grouped_moe_matches_per_token_reference():
    cfg = tiny_deepseek_v32_config()
    m = make(cfg)
    moe_block = m.model.layers[1].mlp
    x = torch.randn(23, cfg.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got = moe_block(x) - moe_block.shared_experts(x)
        want = moe.reference_moe(
            x, moe_block.gate.weight, moe_block.gate.e_score_correction_bias, moe_block.experts.gate_up_proj,
            moe_block.experts.down_proj, lambda h: F.silu(h.chunk(2, -1)[0]) * h.chunk(2, -1)[1],
            cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group, cfg.norm_topk_prob, cfg.routed_scaling_factor)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_group_limited_routing_respects_groups():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(50, 8, generator=g)
    bias = torch.randn(8, generator=g) * 0.5
    w, ids = moe.route_sigmoid_grouped(logits, bias, 2, 4, 1, True, 2.5)
    assert torch.equal(ids[:, 0] // 2, ids[:, 1] // 2)  # topk_group=1: both experts from one group
    torch.testing.assert_close(w.sum(-1), torch.full((50,), 2.5))  # normalized, then scaled
    torch.testing.assert_close(w / 2.5, logits.sigmoid().gather(1, ids) / logits.sigmoid().gather(1, ids).sum(-1, keepdim=True))


def test_v1_matches_v0(model):
    v1 = twin(model, variant="v1")
    rows = _rows([12, 5], seed=10)
    chunks = [[8, 1, 1, 1, 1], [5]]
    a = run_schedule(model, rows, chunks, 4, [[0, 1, 2], [3, 4]], 5)
    b = run_schedule(v1, rows, chunks, 4, [[0, 1, 2], [3, 4]], 5)
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_kv_spec_and_meta_build():
    from torchinferno.models.deepseek_v32.config import deepseek_v3_config, deepseek_v32_config

    spec = FAM.kv_spec(deepseek_v3_config())
    assert spec.num_layers == 61 and spec.layers[0].tensors == (("latent", (576,)),) and spec.layers[0].kind == "mla"
    spec32 = FAM.kv_spec(deepseek_v32_config())
    assert spec32.layers[0].tensors == (("latent", (576,)), ("index_k", (128,)))
    assert spec32.bytes_per_token(torch.bfloat16) == 61 * (576 + 128) * 2
    m = FAM.build(deepseek_v32_config(), device="meta", dtype=torch.bfloat16)
    n = sum(t.numel() for t in m.state_dict().values())  # parameters + router correction bias
    assert n == deepseek_v32_config().num_params() and 6.7e11 < n < 6.9e11


def test_registry_aliases_and_top_level_exports():
    import torchinferno

    assert get_family("dsv3.2") is FAM and get_family("deepseek") is FAM
    assert family_for_hf_config({"model_type": "deepseek_v3"}) is FAM
    assert family_for_hf_config({"model_type": "deepseek_v32"}) is FAM
    assert torchinferno.tiny_deepseek_v32_config() == tiny_deepseek_v32_config()
    assert torchinferno.DeepSeekV32ForCausalLM.__name__ == "DeepSeekV32ForCausalLM"
    assert set(FAM.sizes) >= {"debug", "deepseek-v3", "deepseek-v3.2"}


def test_config_round_trip_and_hub_spelling():
    c = tiny_deepseek_v32_config()
    assert config_from_hf(config_to_hf(c)) == c
    v3 = replace(c, index_n_heads=0, q_lora_rank=None, rope_interleave=False, index_head_dim=128, index_topk=2048)
    assert config_from_hf(config_to_hf(v3)) == v3  # (index dims are not part of a deepseek_v3 config.json)
    hub = {  # DeepSeek-V3.2-Exp config.json spelling (transformers 4 / original release)
        "model_type": "deepseek_v32", "vocab_size": 129280, "hidden_size": 7168, "num_hidden_layers": 61,
        "num_attention_heads": 128, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256, "moe_intermediate_size": 2048,
        "first_k_dense_replace": 3, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048,
        "rope_theta": 10000, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "num_nextn_predict_layers": 1,
        "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
    }
    c = config_from_hf(hub)
    assert c.rope_scaling.rope_type == "yarn" and c.rope_scaling.factor == 40 and c.has_indexer
    assert c.layer_mlp_types[:4] == ("dense", "dense", "dense", "sparse") and c.num_nextn_predict_layers == 1
    assert c.softmax_scale == pytest.approx(192**-0.5 * (0.1 * torch.log(torch.tensor(40.0)).item() + 1) ** 2)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    m = make(replace(tiny_deepseek_v32_config(), num_hidden_layers=2))
    d = tmp_path_factory.mktemp("dsv32")
    save_pretrained(m, d)
    return m, d, dict(safetensors_io.iter_tensors(d))


def _write(d, config, tensors):
    safetensors_io.save_hf_dir(d, config, tensors)
    return d


def test_save_load_round_trip_and_fused_expert_layout(saved, tmp_path):
    m, d, tensors = saved
    assert "model.layers.1.mlp.experts.7.up_proj.weight" in tensors
    ids = _rows([9], seed=11)[0]
    with torch.no_grad():
        want = m.compute_logits(m(ids, torch.arange(9)))
        back = load_model_auto(d, variant="v0")
        torch.testing.assert_close(back.compute_logits(back(ids, torch.arange(9))), want, atol=0, rtol=0)
        # transformers' in-memory layout: experts.gate_up_proj [E, 2I, D] / experts.down_proj [E, D, I]
        fused = {k: v for k, v in tensors.items() if ".experts." not in k}
        fused["model.layers.1.mlp.experts.gate_up_proj"] = m.model.layers[1].mlp.experts.gate_up_proj.detach().clone()
        fused["model.layers.1.mlp.experts.down_proj"] = m.model.layers[1].mlp.experts.down_proj.detach().clone()
        cfg = json.loads((d / "config.json").read_text())
        # MTP layer tensors after the last layer are skipped (num_nextn_predict_layers)
        cfg["num_nextn_predict_layers"] = 1
        fused["model.layers.2.eh_proj.weight"] = torch.zeros(4, 4)
        got = load_model_auto(_write(tmp_path / "fused", cfg, fused), variant="v0")
        torch.testing.assert_close(got.compute_logits(got(ids, torch.arange(9))), want, atol=0, rtol=0)


def test_wrong_shape_names_tensor(saved, tmp_path):
    _, d, tensors = saved
    bad = dict(tensors)
    bad["model.layers.1.self_attn.kv_b_proj.weight"] = torch.zeros(3, 3)
    cfg = json.loads((d / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"shape mismatch for tensor 'model\.layers\.1\.self_attn\.kv_b_proj\.weight'"):
        load_model_auto(_write(tmp_path / "shape", cfg, bad))


def test_missing_expert_names_tensor(saved, tmp_path):
    _, d, tensors = saved
    bad = {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.experts.3.up_proj.weight"}
    cfg = json.loads((d / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"missing 1 tensor.*model\.layers\.1\.mlp\.experts\.3\.up_proj\.weight"):
        load_model_auto(_write(tmp_path / "missing", cfg, bad))


def test_fp8_checkpoint_refused(saved, tmp_path):
    _, d, tensors = saved
    bad = dict(tensors)
    bad["model.layers.0.self_attn.kv_b_proj.weight_scale_inv"] = torch.ones(1, 1)
    cfg = json.loads((d / "config.json").read_text())
    with pytest.raises(CheckpointError, match="weight_scale_inv.*not supported yet"):
        load_model_auto(_write(tmp_path / "fp8", cfg, bad))


def test_bad_config_names_key(saved, tmp_path):
    _, d, tensors = saved
    cfg = json.loads((d / "config.json").read_text())
    with pytest.raises(ConfigError, match="model_type 'deepseek_v9'"):
        load_model_auto(_write(tmp_path / "mt", {**cfg, "model_type": "deepseek_v9"}, tensors))
    with pytest.raises(ConfigError, match="'kv_lora_rank'"):
        config_from_hf({k: v for k, v in cfg.items() if k != "kv_lora_rank"})
    with pytest.raises(ConfigError, match="'scoring_func'"):
        config_from_hf({**cfg, "scoring_func": "softmax"})
    with pytest.raises(ConfigError, match="needs q_lora_rank"):
        replace(tiny_deepseek_v32_config(), q_lora_rank=None)
