"""README region names (forward, attention, layers.N.attn|mlp|moe) resolve onto the module tree; bad names are one line."""

import pytest

from torchinferno.errors import ConfigError
from torchinferno.testing import tiny_model
from torchinferno.workbench.region_names import moe_layers, resolve_region


@pytest.fixture(scope="module")
def dsv4():
    return tiny_model("dsv4")


@pytest.mark.parametrize("name,path,cls", [
    ("layers.0.attn", "model.layers.0.self_attn", "LatentAttention"),
    ("attention", "model.layers.0.self_attn", "LatentAttention"),
    ("layers.0.mlp", "model.layers.0.mlp", "GatedMLP"),
    ("layers.2.mlp", "model.layers.2.mlp", "SparseMoE"),
    ("layers.1.moe", "model.layers.1.mlp", "SparseMoE"),
    ("moe", "model.layers.1.mlp", "SparseMoE"),
    ("layers.2", "model.layers.2", None),
    ("model.layers.0.self_attn", "model.layers.0.self_attn", "LatentAttention"),
    ("forward", "", "DSv4V1"),
])
def test_short_names_and_module_paths(dsv4, name, path, cls):
    got_path, module = resolve_region(dsv4, name)
    assert got_path == path
    if cls:
        assert type(module).__name__ == cls


def test_moe_on_a_dense_layer_names_the_moe_layers(dsv4):
    assert moe_layers(dsv4) == [1, 2]
    with pytest.raises(ConfigError, match=r"layer 0 is a dense MLP.*MoE layers: 1, 2"):
        resolve_region(dsv4, "layers.0.moe")


def test_moe_on_a_dense_model():
    with pytest.raises(ConfigError, match="no MoE layers"):
        resolve_region(tiny_model("llama3"), "layers.0.moe")
    with pytest.raises(ConfigError, match="no MoE layers"):
        resolve_region(tiny_model("llama3"), "moe")


def test_unknown_and_out_of_range_regions_list_valid_names(dsv4):
    with pytest.raises(ConfigError) as e:
        resolve_region(dsv4, "decoder")
    msg = str(e.value)
    assert "\n" not in msg and "forward" in msg and "layers.N.attn" in msg and "N in 0..2" in msg
    with pytest.raises(ConfigError, match=r"layers 0\.\.2"):
        resolve_region(dsv4, "layers.7.attn")
    with pytest.raises(ConfigError, match="close module paths: model.layers.0.self_attn"):
        resolve_region(dsv4, "model.layers.0.self_atn")
