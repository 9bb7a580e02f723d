"""``load_model_auto`` / ``from_pretrained`` / ``save_pretrained``: family chosen from config.json."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from torchinferno.checkpoint import safetensors_io
from torchinferno.models.common.module_utils import materialize
from torchinferno.models.protocol import ModelFamily
from torchinferno.models.registry import family_for_hf_config, get_family


def resolve_dtype(dtype: str | torch.dtype | None, default: torch.dtype = torch.float32) -> torch.dtype:
    from torchinferno.errors import ConfigError

    if dtype is None:
        return default
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ConfigError(f"unknown dtype '{dtype}' (valid: float32, bfloat16, float16)")
    return table[dtype]


def default_attention_backend(family: ModelFamily, config, device: str | torch.device) -> type[nn.Module] | None:
    """The attention backend a model of ``family`` is built with on ``device`` when none is asked for.

    On CUDA with Triton importable, a family whose every layer stores plain K/V (``KVLayerSpec.kind
    == "mha"``, i.e. GQA attention that takes an ``attention_backend``) gets ``TritonPagedAttention``:
    paged Triton kernels whose decode path is CUDA-graph capturable. Anywhere else ``None``: the
    family's own default (``TorchAttention`` for llama3; DeepSeek families use their latent attention
    and refuse a backend).
    """
    if torch.device(device).type != "cuda":
        return None
    from torchinferno.kernels import triton as tri

    layers = family.kv_spec(config).layers
    if not tri.available() or not layers or any(layer.kind != "mha" for layer in layers):
        return None
    from torchinferno.models.common.attention_triton import TritonPagedAttention

    return TritonPagedAttention


def load_model_auto(
    model: str | Path,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = torch.float32,
    variant: str | None = None,
    cache_dir: str | Path | None = None,
    attention_backend: type[nn.Module] | None = None,
) -> nn.Module:
    """Load any supported checkpoint: registry name, HF dir, ``.gguf`` file or hub id.

    The family is picked from ``config.json`` (``model_type``); the model is built on ``meta``,
    materialized on ``device`` and filled tensor by tensor (no full state dict in memory).
    ``attention_backend`` defaults to ``default_attention_backend`` (Triton paged attention for
    GQA families on CUDA). The returned module has ``.family`` (the ``ModelFamily``) and
    ``.checkpoint_dir`` set.
    """
    from torchinferno.checkpoint.zoo import resolve_model

    ckpt = resolve_model(str(model), cache_dir=cache_dir)
    hf_config = safetensors_io.read_config(ckpt)
    family = family_for_hf_config(hf_config)
    config = family.config_from_hf(hf_config)
    kw = {} if variant is None else {"variant": variant}
    backend = attention_backend or default_attention_backend(family, config, device)
    if backend is not None:
        kw["attention_backend"] = backend
    m = family.build(config, device="meta", **kw)
    materialize(m, device, resolve_dtype(dtype))
    family.load_weights(m, safetensors_io.iter_tensors(ckpt))
    m.eval()
    m.family = family
    m.checkpoint_dir = Path(ckpt)
    return m


from_pretrained = load_model_auto


def save_pretrained(model: nn.Module, out_dir: str | Path, family_name: str | None = None, max_shard_bytes: int = 2 * 1024**3) -> Path:
    """Write ``model`` in the HF layout (config.json + safetensors) so transformers can load it."""
    family = getattr(model, "family", None) or get_family(family_name or "llama3")
    return safetensors_io.save_hf_dir(
        out_dir, family.config_to_hf(model.config), family.export_weights(model), max_shard_bytes=max_shard_bytes
    )
