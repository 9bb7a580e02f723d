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
