"""deepseek-v4 config.json mapping: transformers' configs (nested rope, legacy keys) read as transformers reads them."""

import pytest
import torch

from torchinferno.errors import ConfigError
from torchinferno.models.deepseek_v4.config import (
    CSA,
    HCA,
    SLIDING,
    DeepSeekV4Config,
    config_from_hf,
    config_to_hf,
    tiny_deepseek_v4_config,
)

transformers = pytest.importorskip("transformers")


def test_transformers_default_config_with_yarn():
    yarn = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1}
    hc = transformers.DeepseekV4Config(rope_parameters=yarn)
    c = config_from_hf(hc.to_dict())
    assert c.layer_types == tuple(hc.layer_types) and c.mlp_layer_types == tuple(hc.mlp_layer_types)
    assert c.qk_rope_head_dim == hc.qk_rope_head_dim == 64
    assert c.compress_rope_scaling["factor"] == 16.0 and c.compress_rope_theta == 160000.0
    assert c == DeepSeekV4Config(compress_rope_scaling=c.compress_rope_scaling)  # our defaults are transformers'


def test_legacy_keys_fold_in():
    d = transformers.DeepseekV4Config(compress_ratios=[0, 4, 128, 4], num_hidden_layers=4, num_hash_layers=1,
                                      qk_rope_head_dim=32, head_dim=128).to_dict()
    c = config_from_hf(d)
    assert c.layer_types == (SLIDING, CSA, HCA, CSA) and c.mlp_layer_types == ("hash_moe", "moe", "moe", "moe")
    assert c.qk_rope_head_dim == 32


def test_round_trip_through_transformers_and_param_count():
    cfg = tiny_deepseek_v4_config()
    d = config_to_hf(cfg)
    d.pop("architectures")
    hc = transformers.DeepseekV4Config(**d)
    assert config_from_hf(hc.to_dict()) == cfg
    with torch.device("meta"):
        hm = transformers.DeepseekV4ForCausalLM(hc)
    assert cfg.num_params() == sum(p.numel() for p in hm.parameters())


@pytest.mark.parametrize("kw,match", [
    ({"layer_types": ("sliding_attention",)}, "len\\(layer_types\\)"),
    ({"mlp_layer_types": ("dense",) * 4}, "mlp_layer_types"),
    ({"o_groups": 3}, "o_groups"),
    ({"scoring_func": "softmax"}, "scoring_func"),
])
def test_bad_configs_name_the_field(kw, match):
    with pytest.raises(ConfigError, match=match):
        tiny_deepseek_v4_config(**kw)


def test_raw_hub_style_config_reads_like_transformers():
    """A config.json as a release ships it (legacy keys, ``rope_scaling``, quantization fields): our reading equals our
    reading of transformers' normalized form of the same dict."""
    raw = {"model_type": "deepseek_v4", "vocab_size": 1000, "hidden_size": 64, "moe_intermediate_size": 32,
           "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "q_lora_rank": 48,
           "qk_rope_head_dim": 16, "compress_ratios": [0, 0, 4, 128, 4], "compress_rope_theta": 40000,
           "num_hash_layers": 2, "rope_theta": 10000, "sliding_window": 16, "o_groups": 2, "o_lora_rank": 24,
           "index_n_heads": 8, "index_head_dim": 16, "index_topk": 8, "n_routed_experts": 8, "num_experts_per_tok": 2,
           "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 4096, "beta_fast": 32,
                            "beta_slow": 1},
           "max_position_embeddings": 65536, "expert_dtype": "fp4", "num_nextn_predict_layers": 1,
           "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                   "weight_block_size": [128, 128]}}
    ours = config_from_hf(dict(raw))
    hc = transformers.DeepseekV4Config(**{k: v for k, v in raw.items() if k != "model_type"})
    assert ours == config_from_hf(hc.to_dict())
    assert ours.layer_types == (SLIDING, SLIDING, CSA, HCA, CSA) and ours.mlp_layer_types[:3] == ("hash_moe", "hash_moe", "moe")
    assert ours.compress_rope_scaling["factor"] == 16 and ours.qk_rope_head_dim == 16
