"""The deepseek-v4 ``ModelFamily`` value registered in ``models/registry.py``."""

from __future__ import annotations

import torch

from torchinferno.errors import ConfigError
from torchinferno.models.deepseek_v4 import config as cfg
from torchinferno.models.deepseek_v4 import weights
from torchinferno.models.deepseek_v4.model import cache_layout
from torchinferno.models.deepseek_v4.registry import DEFAULT_VARIANT, VARIANTS
from torchinferno.models.promoted import load_variant_class
from torchinferno.models.protocol import KVLayerSpec, KVSpec, ModelFamily


def build(config: cfg.DeepSeekV4Config, device="meta", dtype: torch.dtype = torch.float32, variant: str = DEFAULT_VARIANT,
          attention_backend=None):
    """Build a deepseek-v4 model. On ``meta`` nothing is allocated; call ``materialize`` before loading.

    The attention reads its own per-token cache rows, so ``attention_backend`` (a GQA backend) must be None.
    """
    if attention_backend is not None:
        raise ConfigError("deepseek-v4 uses its own sliding/compressed attention; attention_backend must be None")
    cls = load_variant_class(VARIANTS, variant, "deepseek-v4")
    with torch.device(device):
        model = cls(config)
    return model.to(dtype=dtype)


WHOLE_TENSORS = ("centry", "ientry")  # one entry per closed window: read for the whole sequence


def kv_window(config: cfg.DeepSeekV4Config) -> int:
    """How far back a forward reads per-token rows: a step at context c reads positions >= c - W + 1 of ``kv``
    (the sliding keys, ``sliding_window - 1`` back), of ``ckv, cgate`` / ``ikv, igate`` (the still-open windows:
    ``2 * rate - 1`` back for CSA's overlapping pairs, ``rate - 1`` for HCA). W = the largest of those spans + 1."""
    w = config.sliding_window
    if cfg.CSA in config.layer_types:
        w = max(w, 2 * config.compress_rate_csa)
    if cfg.HCA in config.layer_types:
        w = max(w, config.compress_rate_hca)
    return w


def kv_spec(config: cfg.DeepSeekV4Config) -> KVSpec:
    """Per layer kind, one row per token: ``kv [head_dim]`` for sliding layers; HCA adds ``ckv, cgate [head_dim]``
    (raw compressor projections) and ``centry [head_dim]`` (each window's entry, at its last token's slot); CSA adds
    ``ckv, cgate [2*head_dim]``, ``centry`` and the indexer's ``ikv, igate [2*index_head_dim]``, ``ientry``.

    Two cache groups: the per-token rows are a sliding group of window ``kv_window(config)`` (the engine frees
    their blocks once they slide out); ``centry`` / ``ientry`` are kept for the whole sequence, one row per window
    (rate m: the engine packs them at ``rows_per_block(m, block_size)`` rows per block)."""
    W = kv_window(config)
    return KVSpec(layers=tuple(
        KVLayerSpec(kind=f"dsv4-{t}", tensors=cache_layout(config, t), window=W,
                    whole=tuple(n for n, _ in cache_layout(config, t) if n in WHOLE_TENSORS),
                    rates=tuple((n, config.compress_rate(t)) for n, _ in cache_layout(config, t) if n in WHOLE_TENSORS))
        for t in config.layer_types))


FAMILY = ModelFamily(
    name="deepseek-v4",
    aliases=("deepseek_v4",),
    hf_model_types=(cfg.HF_MODEL_TYPE,),
    config_cls=cfg.DeepSeekV4Config,
    sizes=cfg.SIZES,
    config_from_hf=cfg.config_from_hf,
    config_to_hf=cfg.config_to_hf,
    build=build,
    load_weights=weights.load_weights,
    export_weights=weights.export_weights,
    kv_spec=kv_spec,
    variants_module="torchinferno.models.deepseek_v4.registry",
    parallel_module="torchinferno.models.deepseek_v4.parallel",
    notes="DeepSeek-V4: mHC hyper-connections, sliding / CSA (indexer top-k) / HCA compressed attention with sinks, "
          "hash + top-k sqrt-softplus MoE; validated against transformers DeepseekV4ForCausalLM",
)
