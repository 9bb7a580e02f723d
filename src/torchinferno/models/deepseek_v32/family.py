"""The deepseek-v3.2 ``ModelFamily`` value registered in ``models/registry.py``."""

from __future__ import annotations

import torch

from torchinferno.errors import ConfigError
from torchinferno.models.deepseek_v32 import config as cfg
from torchinferno.models.deepseek_v32 import weights
from torchinferno.models.deepseek_v32.registry import DEFAULT_VARIANT, VARIANTS
from torchinferno.models.protocol import KVLayerSpec, KVSpec, ModelFamily
from torchinferno.models.promoted import load_variant_class


def build(config: cfg.DeepSeekV32Config, device="meta", dtype: torch.dtype = torch.float32, variant: str = DEFAULT_VARIANT,
          attention_backend=None, absorb_decode: bool = True):
    """Build a deepseek-v3.2 model. On ``meta`` nothing is allocated; call ``materialize`` before loading.

    MLA attends over its own latent cache layout, so ``attention_backend`` (a GQA backend) must be None.
    """
    if attention_backend is not None:
        raise ConfigError("deepseek-v3.2 uses its own latent (MLA) attention; attention_backend must be None")
    cls = load_variant_class(VARIANTS, variant, "deepseek-v3.2")  # built-in or promoted (models/promoted.py)
    with torch.device(device):
        model = cls(config, absorb_decode=absorb_decode)
    return model.to(dtype=dtype)


def kv_spec(config: cfg.DeepSeekV32Config) -> KVSpec:
    """Per layer: the MLA latent ``[c_kv | k_pe]`` (576 values/token at full size) + the indexer key (V3.2)."""
    tensors: tuple[tuple[str, tuple[int, ...]], ...] = (("latent", (config.latent_dim,)),)
    if config.has_indexer:
        tensors += (("index_k", (config.index_head_dim,)),)
    layer = KVLayerSpec(kind="mla", tensors=tensors)
    return KVSpec.uniform(layer, config.num_hidden_layers)


FAMILY = ModelFamily(
    name="deepseek-v3.2",
    aliases=("dsv3.2", "deepseek"),
    hf_model_types=cfg.HF_MODEL_TYPES,
    config_cls=cfg.DeepSeekV32Config,
    sizes=cfg.SIZES,
    config_from_hf=cfg.config_from_hf,
    config_to_hf=cfg.config_to_hf,
    build=build,
    load_weights=weights.load_weights,
    export_weights=weights.export_weights,
    kv_spec=kv_spec,
    variants_module="torchinferno.models.deepseek_v32.registry",
    parallel_module="torchinferno.models.deepseek_v32.parallel",
    notes="DeepSeek-V3/V3.2: MLA latent cache + absorbed decode, DSA indexer, sigmoid group-limited MoE; "
          "validated against transformers DeepseekV3ForCausalLM / DeepseekV32ForCausalLM",
)
