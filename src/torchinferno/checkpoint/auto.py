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
             "float16": torch.float16, "fp16": torch.float16,
             "auto": torch.bfloat16}  # "auto" as ModelSpec resolves it (engine/assembly.resolve_auto) where no spec is
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


def _resolve(model: str | Path, cache_dir: str | Path | None):
    """(checkpoint dir, family, typed config) of anything ``load_model_auto`` accepts."""
    from torchinferno.checkpoint.zoo import resolve_model

    ckpt = resolve_model(str(model), cache_dir=cache_dir)
    hf_config = safetensors_io.read_config(ckpt)
    family = family_for_hf_config(hf_config)
    return ckpt, family, family.config_from_hf(hf_config)


def _fill(m: nn.Module, family: ModelFamily, ckpt, device, dtype) -> nn.Module:
    """Materialize a ``meta``-built model on ``device`` / ``dtype`` and stream the checkpoint into it."""
    materialize(m, device, resolve_dtype(dtype))
    family.load_weights(m, safetensors_io.iter_tensors(ckpt))
    m.eval()
    m.family = family
    m.checkpoint_dir = Path(ckpt)
    return m


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
    ckpt, family, config = _resolve(model, cache_dir)
    kw = {} if variant is None else {"variant": variant}
    backend = attention_backend or default_attention_backend(family, config, device)
    if backend is not None:
        kw["attention_backend"] = backend
    return _fill(family.build(config, device="meta", **kw), family, ckpt, device, dtype)


from_pretrained = load_model_auto


def load_model_class(cls: type[nn.Module], model: str | Path, device: str | torch.device = "cpu",
                     dtype: str | torch.dtype | None = None, cache_dir: str | Path | None = None, **model_kwargs) -> nn.Module:
    """``cls.from_pretrained``: a checkpoint of ``cls``'s family built as exactly ``cls(config, **model_kwargs)``.

    ``cls`` names its family with ``family_name``; a checkpoint of another family is refused with a
    one-line ConfigError before any weight is read.
    """
    from torchinferno.errors import ConfigError

    name = getattr(cls, "family_name", None)
    if name is None:
        raise ConfigError(f"{cls.__name__} does not name a model family (family_name); use load_model_auto")
    expected = get_family(name)
    ckpt, family, config = _resolve(model, cache_dir)
    if family.name != expected.name:
        raise ConfigError(f"{model} is a {family.name} checkpoint; {cls.__name__} loads {expected.name} checkpoints "
                          "(load_model_auto picks the family from config.json)")
    with torch.device("meta"):
        m = cls(config, **model_kwargs)
    return _fill(m, family, ckpt, device, dtype)


def model_family(model: nn.Module, family_name: str | None = None) -> ModelFamily:
    """The family of ``model``: its ``.family`` (loaders set it; every family class derives it from its
    registry name), else ``family_name``. ConfigError if neither tells, or if they disagree."""
    from torchinferno.errors import ConfigError
    from torchinferno.models.registry import family_names

    family = getattr(model, "family", None)
    if family_name is not None:
        named = get_family(family_name)
        if family is not None and family.name != named.name:
            raise ConfigError(f"family_name '{family_name}' does not match the model's family {family.name}")
        return named
    if family is None:
        raise ConfigError(f"cannot tell the model family of {type(model).__name__}; pass family_name "
                          f"(valid: {', '.join(family_names())})")
    return family


def save_pretrained(model: nn.Module, out_dir: str | Path, family_name: str | None = None, max_shard_bytes: int = 2 * 1024**3) -> Path:
    """Write ``model`` in the HF layout (config.json + safetensors) of its family (``model_family``)
    so transformers (or ``load_model_auto``) can load it."""
    family = model_family(model, family_name)
    return safetensors_io.save_hf_dir(
        out_dir, family.config_to_hf(model.config), family.export_weights(model), max_shard_bytes=max_shard_bytes
    )
