"""deepseek-v3.2 family vs transformers DeepseekV3ForCausalLM / DeepseekV32ForCausalLM (fp32, same weights).

transformers runs with eager attention and eager experts; parameters it initializes to ones/zeros
(norms, the router correction bias) are randomized before ``save_pretrained`` so a missed or
mis-mapped tensor shows in the logits. Our side loads with ``load_model_auto(dir, variant="v0")``.
"""

from dataclasses import replace

import pytest
import torch

from torchinferno.checkpoint.auto import load_model_auto
from torchinferno.models.common.attention_metadata import build_attention_metadata, positions_for
from torchinferno.models.common.rope import RopeScaling
from torchinferno.models.deepseek_v32.config import DeepSeekV32Config, config_to_hf, tiny_deepseek_v32_config
from torchinferno.models.registry import get_family
from torchinferno.testing import randomize_

transformers = pytest.importorskip("transformers")

V = 320
# tiny_deepseek_v32_config: 3 layers (first dense), 8 experts in 4 groups (keep 2), top-2, one shared
# expert, YaRN (factor 4, mscale_all_dim 0.8), q LoRA; indexer 16 heads x 16, top-8.
CASES = {
    "v3-yarn-grouped": dict(index_n_heads=0),
    # also: non-interleaved MLA rope, no routing groups, unnormalized top-k weights, YaRN without
    # mscale (transformers then scales cos/sin by mscale(factor) but still applies mscale_all_dim²)
    "v3-no-q-lora": dict(index_n_heads=0, q_lora_rank=None, n_group=1, topk_group=1, norm_topk_prob=False,
                         rope_interleave=False,
                         rope_scaling=RopeScaling("yarn", factor=8.0, original_max_position_embeddings=64, mscale=0.0,
                                                  mscale_all_dim=1.0)),
    "v32-sparse-top8": dict(),
}


def hf_model(cfg: DeepSeekV32Config, seed: int = 0):
    d = config_to_hf(cfg)
    v32 = d["model_type"] == "deepseek_v32"
    cfg_cls = transformers.DeepseekV32Config if v32 else transformers.DeepseekV3Config
    hf_cfg = cfg_cls(**{k: v for k, v in d.items() if k not in ("architectures", "model_type")})
    hf_cfg._attn_implementation = "eager"
    hf_cfg._experts_implementation = "eager"  # the per-expert loop, not grouped_mm
    torch.manual_seed(seed)
    model_cls = transformers.DeepseekV32ForCausalLM if v32 else transformers.DeepseekV3ForCausalLM
    # correction bias large enough to change which experts win
    return randomize_(model_cls(hf_cfg).eval(), correction_bias=0.3)


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    cfg = replace(tiny_deepseek_v32_config(), **CASES[request.param])
    ref = hf_model(cfg)
    d = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(d)
    ours = load_model_auto(d, device="cpu", dtype=torch.float32, variant="v0")
    return request.param, ref, ours


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))


def test_loaded_config(pair):
    name, ref, ours = pair
    assert ours.config.has_indexer == name.startswith("v32")
    assert ours.config.q_lora_rank == ref.config.q_lora_rank
    assert ours.config.softmax_scale == pytest.approx(ref.model.layers[0].self_attn.scaling, rel=1e-12)
    assert ours.config.rope_attention_factor == pytest.approx(ref.model.rotary_emb.attention_scaling, rel=1e-12)
    assert ours.config.rope_interleave == getattr(ref.config, "rope_interleave", True)


def test_prefill_logits_match(pair):
    _, ref, ours = pair
    ids = _ids(21, 1)
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
        got = ours.compute_logits(ours(ids, torch.arange(21)))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_cached_decode_matches_full_forward(pair):
    """Prefill 6 tokens into a paged cache, then decode one token at a time (absorbed MLA path)."""
    _, ref, ours = pair
    fam = get_family("deepseek-v3.2")
    ids = _ids(20, 2)
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
        caches = fam.kv_spec(ours.config).allocate(num_blocks=6, block_size=4, dtype=torch.float32, device="cpu")
        table = [[5, 2, 0, 4, 1]]  # non-contiguous on purpose
        meta = build_attention_metadata([6], [0], table, 4)
        steps = [ours.compute_logits(ours(ids[:6], positions_for([6], [0]), caches, meta))]
        for t in range(6, 20):
            meta = build_attention_metadata([1], [t], table, 4)
            assert meta.is_decode
            steps.append(ours.compute_logits(ours(ids[t : t + 1], torch.tensor([t]), caches, meta)))
    torch.testing.assert_close(torch.cat(steps), want, atol=1e-5, rtol=1e-5)


def test_ragged_batch_matches_per_row(pair):
    _, ref, ours = pair
    rows = [_ids(n, 3 + n) for n in (5, 13, 1)]
    with torch.no_grad():
        meta = build_attention_metadata([len(r) for r in rows], [0, 0, 0], [[0], [1], [2]], 16)
        got = ours.compute_logits(ours(torch.cat(rows), positions_for(meta.query_lens_list, [0, 0, 0]), None, meta))
        want = torch.cat([ref(r[None]).logits[0] for r in rows])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _capture_topk(model, module_type):
    out = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: out.append(o)) for m in model.modules() if isinstance(m, module_type)]
    return out, hooks


def test_indexer_topk_sets_match_transformers(pair):
    name, ref, ours = pair
    if not name.startswith("v32"):
        pytest.skip("no indexer")
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Indexer

    from torchinferno.models.deepseek_v32.model import IndexTopK

    S, k = 21, ours.config.index_topk
    ids = _ids(S, 5)
    theirs, h1 = _capture_topk(ref, DeepseekV32Indexer)
    mine, h2 = _capture_topk(ours, IndexTopK)
    try:
        with torch.no_grad():
            ref(ids[None])
            ours(ids, torch.arange(S))
    finally:
        for h in h1 + h2:
            h.remove()
    assert len(theirs) == len(mine) == ours.config.num_hidden_layers
    for layer, (t_idx, m_idx) in enumerate(zip(theirs, mine)):
        assert m_idx.shape == (S, k)
        for q in range(S):  # keep only visible keys: both sides fill short rows with masked positions
            want = {int(s) for s in t_idx[0, q] if s <= q}
            got = {int(s) for s in m_idx[q] if s <= q}
            assert got == want, f"layer {layer} query {q}"
            assert len(got) == min(k, q + 1)


def test_v32_with_large_topk_equals_v3_on_shared_weights(pair):
    """index_topk >= length: DSA keeps every visible key, so V3.2 == V3 (transformers V3.2 vs our V3)."""
    name, ref, ours = pair
    if not name.startswith("v32"):
        pytest.skip("no indexer")
    fam = get_family("deepseek-v3.2")
    v3 = fam.build(replace(ours.config, index_n_heads=0), device="cpu", variant="v0")
    state = {k: v for k, v in ours.state_dict().items() if ".indexer." not in k}
    v3.load_state_dict(state, strict=True)
    big = fam.build(replace(ours.config, index_topk=64), device="cpu", variant="v0")
    big.load_state_dict(ours.state_dict())
    for layer in ref.model.layers:
        layer.self_attn.indexer.index_topk = 64
    ids = _ids(21, 6)
    try:
        with torch.no_grad():
            want = ref(ids[None]).logits[0]
            got_v3 = v3.compute_logits(v3(ids, torch.arange(21)))
            got_big = big.compute_logits(big(ids, torch.arange(21)))
            got_sparse = ours.compute_logits(ours(ids, torch.arange(21)))
    finally:
        for layer in ref.model.layers:
            layer.self_attn.indexer.index_topk = ours.config.index_topk
    torch.testing.assert_close(got_v3, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_big, got_v3, atol=1e-5, rtol=1e-5)
    assert (got_sparse - got_v3).abs().max() > 1e-3  # top-8 of 21 really is sparse
