"""The family contract: the only thing workbenches (engine, server, profiler, simulator) know.

A family is one folder under ``models/`` with the same file names (config, model, weights,
raw_ops, fused_ops, v0, v1, registry) and registers a :class:`ModelFamily` value. Workbenches
import this module and ``models.registry``; never a family folder.

Forward contract of every built model (a real ``nn.Module``)::

    hidden = model(input_ids, positions, kv_caches, attn_meta)   # [T] , [T] -> [T, D]
    logits = model.compute_logits(hidden[idx])                   # [N, D] -> [N, V] (fp32)

* tokens of all sequences are flattened to one ``[T]`` tensor (no padding);
* ``positions[t]`` is the absolute position of token ``t`` in its sequence;
* ``kv_caches`` is a list with one entry per layer, each a tuple of tensors laid out as
  ``KVLayerSpec.tensors`` says, shaped ``[num_blocks, block_size, *per_token_shape]``;
  ``None`` runs without a cache (a plain causal forward of each sequence);
* ``attn_meta`` (``models.common.attention_metadata.AttentionMetadata``) says where each
  sequence's queries start, how long each sequence is, and where new KV goes. It is passed
  explicitly: there is no global forward context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
from torch import nn


@dataclass(frozen=True)
class KVLayerSpec:
    """What one layer stores per token.

    ``tensors`` is a tuple of ``(name, per_token_shape)``: e.g. ``(("k", (Hkv, D)), ("v", (Hkv, D)))``
    for GQA, or ``(("latent", (kv_lora_rank + rope_dim,)),)`` for MLA. Cache code allocates
    ``[num_blocks, block_size, *shape]`` for each entry and never interprets the names.
    """

    kind: str
    tensors: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def values_per_token(self) -> int:
        return sum(math.prod(shape) for _, shape in self.tensors)


@dataclass(frozen=True)
class KVSpec:
    """Per-layer KV layout of a model; bytes per token follow from it."""

    layers: tuple[KVLayerSpec, ...]

    @staticmethod
    def uniform(layer: KVLayerSpec, num_layers: int) -> "KVSpec":
        """Every layer stores the same thing."""
        return KVSpec(layers=(layer,) * num_layers)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def values_per_token(self) -> int:
        return sum(layer.values_per_token for layer in self.layers)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return self.values_per_token() * torch.empty((), dtype=dtype).element_size()

    def allocate(self, num_blocks: int, block_size: int, dtype: torch.dtype, device: str | torch.device) -> list[tuple[torch.Tensor, ...]]:
        """Zero-filled cache tensors, one tuple per layer (allocated once; never resized)."""
        return [
            tuple(torch.zeros((num_blocks, block_size, *shape), dtype=dtype, device=device) for _, shape in layer.tensors)
            for layer in self.layers
        ]


@dataclass(frozen=True)
class ModelFamily:
    """One model family as the rest of the system sees it.

    Invariants: ``build(config, device="meta")`` allocates no memory; ``load_weights`` consumes
    HF-named tensors one at a time and raises ``CheckpointError`` naming the tensor on a
    mismatch; ``export_weights`` yields HF names so ``save_pretrained`` output loads in
    transformers; ``kv_spec(config)`` fully describes the cache the model reads/writes.
    """

    name: str
    aliases: tuple[str, ...]
    hf_model_types: tuple[str, ...]
    config_cls: type
    sizes: Mapping[str, Callable[[], Any]]
    config_from_hf: Callable[[dict], Any]
    config_to_hf: Callable[[Any], dict]
    build: Callable[..., nn.Module]
    load_weights: Callable[[nn.Module, Iterable[tuple[str, torch.Tensor]]], None]
    export_weights: Callable[[nn.Module], Iterator[tuple[str, torch.Tensor]]]
    kv_spec: Callable[[Any], KVSpec]
    variants_module: str = ""
    parallel_module: str = ""  # tensor-parallel plan: check / shard_model / tensor_rule (parallel/plan.py)
    notes: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def parallel_plan(self):
        """The family's tensor-parallel plan module; ConfigError if it has none."""
        import importlib

        from torchinferno.errors import ConfigError

        if not self.parallel_module:
            raise ConfigError(f"family {self.name} has no tensor-parallel plan (use --tensor-parallel-size 1)")
        return importlib.import_module(self.parallel_module)

    def size(self, name: str):
        from torchinferno.errors import ConfigError

        if name not in self.sizes:
            raise ConfigError(f"unknown size '{name}' for family {self.name} (valid: {', '.join(sorted(self.sizes))})")
        return self.sizes[name]()
