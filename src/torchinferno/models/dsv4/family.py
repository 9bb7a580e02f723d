"""The dsv4 ``ModelFamily`` value registered in ``models/registry.py`` (a local compact family, not DeepSeek-V4)."""

from __future__ import annotations

import torch

from torchinferno.errors import ConfigError
from torchinferno.models.dsv4 import config as cfg
from torchinferno.models.dsv4 import weights
from torchinferno.models.dsv4.registry import DEFAULT_VARIANT, VARIANTS
from torchinferno.models.protocol import KVLayerSpec, KVSpec, ModelFamily
from torchinferno.models.promoted import load_variant_class


def build(config: cfg.DSv4Config, device="meta", dtype: torch.dtype = torch.float32, variant: str = DEFAULT_VARIANT,
          attention_backend=None):
    """Build a dsv4 model. On ``meta`` nothing is allocated; call ``materialize`` before loading.

    Latent attention reads its own cache layout, so ``attention_backend`` (a GQA backend) must be None.
    """
    if attention_backend is not None:
        raise ConfigError("dsv4 uses its own latent attention; attention_backend must be None")
    cls = load_variant_class(VARIANTS, variant, "dsv4")  # built-in or promoted (models/promoted.py)
    with torch.device(device):
        model = cls(config)
    return model.to(dtype=dtype)


def kv_spec(config: cfg.DSv4Config) -> KVSpec:
    """Per layer: the latent ``[c_kv | k_pe]`` (kv_lora_rank + rope_dim values per token)."""
    layer = KVLayerSpec(kind="mla", tensors=(("latent", (config.latent_dim,)),))
    return KVSpec.uniform(layer, config.num_hidden_layers)


FAMILY = ModelFamily(
    name="dsv4",
    aliases=(),
    hf_model_types=(cfg.HF_MODEL_TYPE,),
    config_cls=cfg.DSv4Config,
    sizes=cfg.SIZES,
    config_from_hf=cfg.config_from_hf,
    config_to_hf=cfg.config_to_hf,
    build=build,
    load_weights=weights.load_weights,
    export_weights=weights.export_weights,
    kv_spec=kv_spec,
    variants_module="torchinferno.models.dsv4.registry",
    parallel_module="torchinferno.models.dsv4.parallel",
    notes="local compact DeepSeek-style family (latent KV + small MoE with a shared expert), NOT DeepSeek-V4; "
          "validated by full-forward vs cached-decode equality and v1 == v0",
    extra={"config_from_deepseek_hf": cfg.config_from_deepseek_hf, "refusal_reason": weights.refusal_reason},
)
