"""The llama3 ``ModelFamily`` value registered in ``models/registry.py``."""

from __future__ import annotations

import torch

from torchinferno.models.llama3 import config as cfg
from torchinferno.models.llama3 import weights
from torchinferno.models.llama3.registry import DEFAULT_VARIANT, VARIANTS
from torchinferno.models.protocol import KVLayerSpec, KVSpec, ModelFamily
from torchinferno.models.promoted import load_variant_class


def build(config: cfg.Llama3Config, device="meta", dtype: torch.dtype = torch.float32, variant: str = DEFAULT_VARIANT, attention_backend=None):
    """Build a llama3 model. On ``meta`` nothing is allocated; call ``materialize`` before loading."""
    cls = load_variant_class(VARIANTS, variant, "llama3")  # built-in or promoted (models/promoted.py)
    with torch.device(device):
        model = cls(config, attention_backend=attention_backend)
    return model.to(dtype=dtype)


def kv_spec(config: cfg.Llama3Config) -> KVSpec:
    shape = (config.num_key_value_heads, config.head_dim_)
    layer = KVLayerSpec(kind="mha", tensors=(("k", shape), ("v", shape)))
    return KVSpec.uniform(layer, config.num_hidden_layers)


FAMILY = ModelFamily(
    name="llama3",
    aliases=("llama",),
    hf_model_types=("llama",),
    config_cls=cfg.Llama3Config,
    sizes=cfg.SIZES,
    config_from_hf=cfg.config_from_hf,
    config_to_hf=cfg.config_to_hf,
    build=build,
    load_weights=weights.load_weights,
    export_weights=weights.export_weights,
    kv_spec=kv_spec,
    variants_module="torchinferno.models.llama3.registry",
    parallel_module="torchinferno.models.llama3.parallel",
    notes="Llama-3 architecture; validated against transformers LlamaForCausalLM",
)
