"""In a bf16 model the MoE router (``gate.weight``, ``e_score_correction_bias``) and the DSA indexer's
``weights_proj`` stay fp32, as transformers and DeepSeek keep them; ``norm_topk_prob: null`` is False."""

import pytest
import torch
import torch.nn.functional as F

from torchinferno.checkpoint.auto import load_model_auto, save_pretrained
from torchinferno.models.common.moe import route_sigmoid_grouped
from torchinferno.models.common.rope import RopeScaling
from torchinferno.models.deepseek_v32.config import config_from_hf, config_to_hf, tiny_deepseek_v3_config
from torchinferno.models.dsv4.config import config_from_deepseek_hf
from torchinferno.models.dsv4.config import config_from_hf as dsv4_config_from_hf
from torchinferno.models.dsv4.config import config_to_hf as dsv4_config_to_hf
from torchinferno.models.dsv4.config import tiny_dsv4_config
from torchinferno.models.registry import get_family
from torchinferno.testing import randomize_, tiny_model

MOE_FAMILIES = ("deepseek-v3.2", "dsv4")


def _fp32_tensors(m) -> dict[str, torch.Tensor]:
    """Every tensor that must stay fp32: router weights/biases and the indexer's weights_proj."""
    return {n: t for n, t in list(m.named_parameters()) + list(m.named_buffers())
            if n.endswith(("gate.weight", "e_score_correction_bias", "weights_proj.weight"))}


@pytest.fixture(scope="module", params=MOE_FAMILIES)
def saved_fp32(request, tmp_path_factory):
    m = randomize_(tiny_model(request.param), correction_bias=0.3)
    d = tmp_path_factory.mktemp(request.param)
    save_pretrained(m, d)
    return request.param, m, d


def test_bf16_load_keeps_router_and_indexer_weights_fp32(saved_fp32):
    name, ref, d = saved_fp32
    m = load_model_auto(d, dtype=torch.bfloat16)
    want = _fp32_tensors(ref)
    got = _fp32_tensors(m)
    assert len(got) == len(want) >= 4 and (name != "deepseek-v3.2" or any("weights_proj" in n for n in got))
    for n, t in got.items():
        assert t.dtype == torch.float32 and torch.equal(t, want[n]), n  # the fp32 values, never bf16-rounded
    assert m.model.layers[1].mlp.experts.gate_up_proj.dtype == torch.bfloat16  # everything else is bf16


def test_bf16_routing_matches_an_fp32_router_reference(saved_fp32):
    name, ref, d = saved_fp32
    m = load_model_auto(d, dtype=torch.bfloat16)
    cfg = m.config
    x = torch.randn(256, cfg.hidden_size, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    for i in range(cfg.first_k_dense_replace, cfg.num_hidden_layers):
        gate, ref_gate = m.model.layers[i].mlp.gate, ref.model.layers[i].mlp.gate
        w, ids = gate(x)
        want_w, want_ids = route_sigmoid_grouped(
            F.linear(x.float(), ref_gate.weight), ref_gate.e_score_correction_bias, cfg.num_experts_per_tok,
            getattr(cfg, "n_group", 1), getattr(cfg, "topk_group", 1), cfg.norm_topk_prob, cfg.routed_scaling_factor)
        assert torch.equal(ids, want_ids) and torch.equal(w, want_w), i


@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_every_dtype_cast_keeps_them_fp32(name):
    ref = tiny_model(name)
    want = {n: t.clone() for n, t in _fp32_tensors(ref).items()}
    for m in (tiny_model(name, dtype=torch.bfloat16), tiny_model(name).half(), tiny_model(name).to(dtype=torch.bfloat16)):
        for n, t in _fp32_tensors(m).items():
            assert t.dtype == torch.float32 and torch.equal(t, want[n]), n
    fam = get_family(name)
    built = fam.build(fam.size("debug"), device="cpu", dtype=torch.bfloat16)
    assert all(t.dtype == torch.float32 for t in _fp32_tensors(built).values())
    assert all(t.dtype == torch.float64 for t in _fp32_tensors(tiny_model(name).double()).values())  # not narrowing


# ------------------------------------------------------------------ norm_topk_prob: null


def test_deepseek_norm_topk_prob_null_is_false():
    hf = config_to_hf(tiny_deepseek_v3_config())
    assert config_from_hf({**hf, "norm_topk_prob": None}).norm_topk_prob is False  # transformers: falsy
    assert config_from_hf({**hf, "norm_topk_prob": False}).norm_topk_prob is False
    hf.pop("norm_topk_prob")
    assert config_from_hf(hf).norm_topk_prob is True  # missing: transformers' default


def test_dsv4_norm_topk_prob_null_is_false():
    hf = config_to_hf(tiny_deepseek_v3_config(n_group=1, topk_group=1, rope_scaling=RopeScaling()))  # what dsv4 converts
    assert config_from_deepseek_hf({**hf, "norm_topk_prob": None}).norm_topk_prob is False
    assert config_from_deepseek_hf(hf).norm_topk_prob is True
    own = dsv4_config_to_hf(tiny_dsv4_config())
    assert dsv4_config_from_hf({**own, "norm_topk_prob": None}).norm_topk_prob is False
