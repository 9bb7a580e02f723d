"""dsv4 (local compact family): cached decode == full forward (paged, dense, chunked), v1 == v0,
MoE == per-token reference, save/load round trip, and checkpoint/config errors naming the tensor/key."""

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import torchinferno
from torchinferno.checkpoint import safetensors_io
from torchinferno.checkpoint.auto import load_model_auto, save_pretrained
from torchinferno.cli.variants_cmds import cached_decode, full_forward, randomize
from torchinferno.errors import CheckpointError, ConfigError
from torchinferno.models.common import moe
from torchinferno.models.common.attention_metadata import build_attention_metadata, positions_for
from torchinferno.models.dsv4 import fused_ops
from torchinferno.models.dsv4.config import config_from_hf, config_to_hf, tiny_dsv4_config
from torchinferno.models.registry import family_for_hf_config, get_family

FAM = get_family("dsv4")
V = tiny_dsv4_config().vocab_size


def make(cfg=None, variant="v0", seed=0):
    m = randomize(FAM.build(cfg or tiny_dsv4_config(), device="cpu", variant=variant), seed).eval()
    m.family = FAM
    return m


def twin(m, variant):
    other = FAM.build(m.config, device="cpu", variant=variant).eval()
    other.load_state_dict(m.state_dict())
    other.family = FAM
    return other


CFGS = {"q-lora": tiny_dsv4_config(), "no-q-lora-interleaved": replace(tiny_dsv4_config(), q_lora_rank=None, rope_interleave=True)}


@pytest.fixture(scope="module", params=sorted(CFGS))
def model(request):
    return make(CFGS[request.param])


def _prompts(lengths, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("variant", ["v0", "v1"])
@pytest.mark.parametrize("backend", ["paged", "dense"])
def test_cached_decode_equals_full_forward(model, variant, backend):
    m = model if variant == "v0" else twin(model, variant)
    prompts = _prompts([11, 7, 14])
    trace = cached_decode(m, prompts, 6, backend, block_size=4)
    full = full_forward(m, [p + t[:-1] for p, t in zip(prompts, trace.tokens)])
    for got, want in zip(trace.logits, full, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_chunked_prefill_with_context_equals_full(model):
    """Chunks after cached context (expanded path with a causal offset mask), paged with a shuffled table."""
    m = twin(model, "v1")
    rows = [torch.tensor(p) for p in _prompts([13, 9], seed=4)]
    chunks = [[5, 4, 1, 1, 1, 1], [3, 3, 1, 1, 1]]
    tables = [[7, 2, 5, 0], [3, 6, 1]]
    caches = FAM.kv_spec(m.config).allocate(8, 4, torch.float32, "cpu")
    done, got = [0, 0], [[], []]
    for step in range(6):
        active = [i for i in range(2) if step < len(chunks[i])]
        q = [chunks[i][step] for i in active]
        c = [done[i] for i in active]
        meta = build_attention_metadata(q, c, [tables[i] for i in active], 4)
        ids = torch.cat([rows[i][done[i] : done[i] + n] for i, n in zip(active, q)])
        with torch.no_grad():
            out = m.compute_logits(m(ids, positions_for(q, c), caches, meta))
        for i, part in zip(active, out.split(q)):
            got[i].append(part)
            done[i] += chunks[i][step]
    for i in range(2):
        want = full_forward(m, [rows[i].tolist()])[0]
        torch.testing.assert_close(torch.cat(got[i]), want, atol=1e-5, rtol=1e-5)


def test_v1_matches_v0_and_uses_absorbed_decode(model, monkeypatch):
    calls = []
    real = fused_ops.latent_absorbed_attention
    monkeypatch.setattr(fused_ops, "latent_absorbed_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    v1 = twin(model, "v1")
    prompts = _prompts([10, 6], seed=5)
    ref = cached_decode(model, prompts, 5)
    got = cached_decode(v1, prompts, 5, forced=ref.tokens)
    assert calls, "v1 decode steps must take the absorbed path"
    for a, b in zip(got.logits, ref.logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_moe_matches_per_token_reference():
    cfg = tiny_dsv4_config()
    m = make(cfg)
    block = m.model.layers[1].mlp
    with torch.no_grad():
        block.gate.e_score_correction_bias.uniform_(-0.3, 0.3)
        x = torch.randn(19, cfg.hidden_size, generator=torch.Generator().manual_seed(6))
        got = block(x) - block.shared_experts(x)
        want = moe.reference_moe(x, block.gate.weight, block.gate.e_score_correction_bias, block.experts.gate_up_proj,
                                 block.experts.down_proj, lambda h: F.silu(h.chunk(2, -1)[0]) * h.chunk(2, -1)[1],
                                 cfg.num_experts_per_tok, 1, 1, cfg.norm_topk_prob, cfg.routed_scaling_factor)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_static_generator_greedy_matches_full_forward():
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.generate import generate

    m = make(variant="v1")
    prompts = _prompts([8, 5], seed=7)
    res = generate(m, prompts, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    for p, r in zip(prompts, res):
        full = full_forward(m, [p + r.token_ids[:-1]])[0]
        assert full[len(p) - 1 :].argmax(-1).tolist() == r.token_ids


def test_docs_say_local_name_and_exports():
    import torchinferno.models.dsv4 as pkg
    from torchinferno.models.dsv4.model import DSv4ForCausalLM

    assert "not DeepSeek-V4" in pkg.__doc__ and "not DeepSeek-V4" in DSv4ForCausalLM.__doc__
    assert "NOT DeepSeek-V4" in FAM.notes
    assert torchinferno.DSv4ForCausalLM is DSv4ForCausalLM
    assert torchinferno.tiny_dsv4_config() == tiny_dsv4_config()
    assert family_for_hf_config({"model_type": "torchinferno_dsv4"}) is FAM


def test_kv_spec_and_meta_build():
    cfg = FAM.size("small")
    spec = FAM.kv_spec(cfg)
    assert spec.num_layers == cfg.num_hidden_layers and spec.layers[0].tensors == (("latent", (160,)),)
    assert spec.bytes_per_token(torch.bfloat16) == cfg.num_hidden_layers * 160 * 2
    m = FAM.build(cfg, device="meta")
    assert sum(t.numel() for t in m.state_dict().values()) == cfg.num_params()
    with pytest.raises(ConfigError, match="attention_backend"):
        FAM.build(cfg, device="meta", attention_backend=object)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    m = make(variant="v0")
    with torch.no_grad():
        for n, b in m.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.uniform_(-0.3, 0.3)
    d = tmp_path_factory.mktemp("dsv4")
    save_pretrained(m, d)
    return m, d, dict(safetensors_io.iter_tensors(d))


def test_save_load_round_trip(saved, tmp_path):
    m, d, tensors = saved
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "torchinferno_dsv4" and config_from_hf(cfg) == m.config
    assert "model.layers.2.mlp.experts.7.down_proj.weight" in tensors and "model.layers.0.mlp.gate_proj.weight" in tensors
    ids = torch.tensor(_prompts([9], seed=8)[0])
    with torch.no_grad():
        want = m.compute_logits(m(ids, torch.arange(9)))
        back = load_model_auto(d, variant="v0")
        assert back.family is FAM
        torch.testing.assert_close(back.compute_logits(back(ids, torch.arange(9))), want, atol=0, rtol=0)
        # fused 3-D expert layout loads too
        fused = {k: v for k, v in tensors.items() if ".experts." not in k}
        for i in (1, 2):
            fused[f"model.layers.{i}.mlp.experts.gate_up_proj"] = m.model.layers[i].mlp.experts.gate_up_proj.detach().clone()
            fused[f"model.layers.{i}.mlp.experts.down_proj"] = m.model.layers[i].mlp.experts.down_proj.detach().clone()
        safetensors_io.save_hf_dir(tmp_path / "fused", cfg, fused)
        got = load_model_auto(tmp_path / "fused", variant="v0")
        torch.testing.assert_close(got.compute_logits(got(ids, torch.arange(9))), want, atol=0, rtol=0)


def _load_bad(tmp_path, cfg, tensors):
    safetensors_io.save_hf_dir(tmp_path, cfg, tensors)
    return load_model_auto(tmp_path)


def test_wrong_shape_missing_expert_and_indexer_name_the_tensor(saved, tmp_path):
    _, d, tensors = saved
    cfg = json.loads((d / "config.json").read_text())
    bad = {**tensors, "model.layers.1.self_attn.kv_b_proj.weight": torch.zeros(3, 3)}
    with pytest.raises(CheckpointError, match=r"shape mismatch for tensor 'model\.layers\.1\.self_attn\.kv_b_proj\.weight'"):
        _load_bad(tmp_path / "a", cfg, bad)
    bad = {k: v for k, v in tensors.items() if k != "model.layers.2.mlp.experts.5.gate_proj.weight"}
    with pytest.raises(CheckpointError, match=r"missing 1 tensor.*model\.layers\.2\.mlp\.experts\.5\.gate_proj\.weight"):
        _load_bad(tmp_path / "b", cfg, bad)
    bad = {**tensors, "model.layers.0.self_attn.indexer.wk.weight": torch.zeros(16, 64)}
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'model\.layers\.0\.self_attn\.indexer\.wk\.weight'.*indexer"):
        _load_bad(tmp_path / "c", cfg, bad)


def test_config_errors_name_the_key(saved):
    _, d, _ = saved
    cfg = json.loads((d / "config.json").read_text())
    with pytest.raises(ConfigError, match="model_type 'no_such_type'"):
        family_for_hf_config({**cfg, "model_type": "no_such_type"})
    with pytest.raises(ConfigError, match="'model_type' is 'deepseek_v3'"):
        config_from_hf({**cfg, "model_type": "deepseek_v3"})
    with pytest.raises(ConfigError, match="'kv_lora_rank'"):
        config_from_hf({k: v for k, v in cfg.items() if k != "kv_lora_rank"})
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        config_from_hf({**cfg, "num_experts_per_tok": 9})
    assert config_from_hf(config_to_hf(tiny_dsv4_config())) == tiny_dsv4_config()
