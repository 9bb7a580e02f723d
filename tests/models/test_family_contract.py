"""Every registered family honours the contract: named sizes, meta build, HF config round trip, KV spec."""

import pytest
import torch

from torchinferno.errors import ConfigError
from torchinferno.models.registry import family_names, get_family
from torchinferno.testing import tiny_model


@pytest.mark.parametrize("name", family_names())
def test_sizes_meta_build_and_config_round_trip(name):
    fam = get_family(name)
    assert "debug" in fam.sizes
    for size in fam.sizes:
        cfg = fam.size(size)
        m = fam.build(cfg, device="meta")  # full-size configs too: nothing may be allocated
        assert all(p.device.type == "meta" for p in m.parameters())
        hf = fam.config_to_hf(cfg)
        assert fam.config_to_hf(fam.config_from_hf(hf)) == hf  # HF form is a fixed point
        spec = fam.kv_spec(cfg)
        assert spec.num_layers > 0 and spec.bytes_per_token(torch.bfloat16) == 2 * spec.values_per_token()


@pytest.mark.parametrize("name", family_names())
def test_export_names_load_back(name):
    fam = get_family(name)
    src = tiny_model(name)
    dst = tiny_model(name, seed=1)
    fam.load_weights(dst, fam.export_weights(src))
    for (a, pa), (b, pb) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert a == b and torch.equal(pa, pb), a


def test_llama3_8b_public_shapes():
    fam = get_family("llama3")
    cfg = fam.size("llama3-8b")
    assert round(cfg.num_params() / 1e9, 2) == 8.03
    assert fam.kv_spec(cfg).bytes_per_token(torch.bfloat16) == 32 * 2 * 8 * 128 * 2


def test_unknown_family_and_size_list_valid_names():
    with pytest.raises(ConfigError, match="llama3"):
        get_family("gpt-17")
    with pytest.raises(ConfigError, match="debug"):
        get_family("llama3").size("huge")
