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
    # Sliding group (``window > 0``): every tensor NOT named in ``whole`` is read only for the trailing ``window``
    # tokens before a step's first query (positions >= num_computed_tokens - window); the pool may free its rows
    # before that. ``whole`` tensors (and every tensor of a layer with ``window == 0``) are kept for the whole
    # sequence. Default: one group, everything whole (every family but deepseek-v4).
    window: int = 0
    whole: tuple[str, ...] = ()
    # ``(name, m)``: that tensor has a row only at every m-th token (window w's row at its closing token
    # (w+1)*m - 1). A packed allocation (``KVSpec.allocate(pack=True)``) keeps ``rows_per_block(m, block_size)``
    # rows per block; readers address them with ``packed_slot`` (any allocation: it reads the rows per block).
    rates: tuple[tuple[str, int], ...] = ()

    @property
    def values_per_token(self) -> int:
        return sum(math.prod(shape) for _, shape in self.tensors)

    def rows_per_block(self, name: str, block_size: int, pack: bool) -> int:
        """Rows one block of tensor ``name`` holds: ``block_size``, or fewer for a packed tensor with a rate."""
        m = dict(self.rates).get(name)
        return rows_per_block(m, block_size) if (pack and m) else block_size

    def is_sliding(self, name: str) -> bool:
        """Whether tensor ``name`` belongs to the sliding group."""
        return self.window > 0 and name not in self.whole

    def group_values_per_token(self, sliding: bool) -> int:
        return sum(math.prod(shape) for name, shape in self.tensors if self.is_sliding(name) == sliding)

    def group_values_per_block(self, block_size: int, sliding: bool, pack: bool) -> int:
        return sum(math.prod(shape) * self.rows_per_block(name, block_size, pack)
                   for name, shape in self.tensors if self.is_sliding(name) == sliding)


def rows_per_block(rate: int, block_size: int) -> int:
    """Rows a block of ``block_size`` tokens needs for a tensor with one row per ``rate`` tokens (each at a
    window's closing token): ``block_size // rate`` when ``rate`` divides it, 1 when ``block_size`` divides ``rate``,
    else one per token (``block_size``: no packing)."""
    if rate <= block_size and block_size % rate == 0:
        return block_size // rate
    if rate > block_size and rate % block_size == 0:
        return 1
    return block_size


def packed_slot(block_ids: torch.Tensor, pos: torch.Tensor, block_size: int, rows: int) -> torch.Tensor:
    """Flat row of the token at ``pos`` (a closing token of a packed tensor, or any token when ``rows ==
    block_size``) in a tensor ``[num_blocks, rows, *S]``: ``block_ids`` = the table's ids of ``pos // block_size``."""
    return block_ids.long() * rows + (pos % block_size) * rows // block_size


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

    @property
    def sliding_window(self) -> int:
        """W of the sliding group (the largest layer window; 0: no sliding group, one block table)."""
        return max((layer.window for layer in self.layers), default=0)

    @property
    def is_hybrid(self) -> bool:
        """Two KV cache groups with their own block tables and pools: sliding (freed behind the window) and whole."""
        return self.sliding_window > 0

    def group_bytes_per_token(self, dtype: torch.dtype, sliding: bool) -> int:
        """Bytes per token of one group (``sliding`` or whole), unpacked; their sum is ``bytes_per_token``."""
        vals = sum(layer.group_values_per_token(sliding) for layer in self.layers)
        return vals * torch.empty((), dtype=dtype).element_size()

    def group_bytes_per_block(self, dtype: torch.dtype, block_size: int, sliding: bool, pack: bool = False) -> int:
        """Bytes of one block of one group (``pack``: tensors with a rate keep ``rows_per_block`` rows)."""
        vals = sum(layer.group_values_per_block(block_size, sliding, pack) for layer in self.layers)
        return vals * torch.empty((), dtype=dtype).element_size()

    def sequence_bytes(self, dtype: torch.dtype, num_tokens: int, block_size: int) -> int:
        """KV bytes one sequence of ``num_tokens`` holds in the engine's pool: whole blocks (per-window tensors
        packed) for every token, and for a hybrid spec the sliding group's blocks of one window (+ its partial
        blocks); the engine's real per-sequence need (``engine/kv_sizing``)."""
        n = -(-num_tokens // block_size)
        if not self.is_hybrid:
            return n * block_size * self.bytes_per_token(dtype)
        window = min(n, -(-self.sliding_window // block_size) + 1)
        return (n * self.group_bytes_per_block(dtype, block_size, sliding=False, pack=True)
                + window * self.group_bytes_per_block(dtype, block_size, sliding=True, pack=True))

    def allocate(self, num_blocks: int, block_size: int, dtype: torch.dtype, device: str | torch.device,
                 num_sliding_blocks: int | None = None, pack: bool = False) -> list[tuple[torch.Tensor, ...]]:
        """Zero-filled cache tensors, one tuple per layer (allocated once; never resized). Sliding-group tensors
        get ``num_sliding_blocks`` blocks (default ``num_blocks``): they are addressed by their own block table.
        ``pack``: tensors with a rate get ``rows_per_block`` rows per block instead of ``block_size``."""
        ns = num_blocks if num_sliding_blocks is None else num_sliding_blocks
        return [
            tuple(torch.zeros((ns if layer.is_sliding(name) else num_blocks,
                               layer.rows_per_block(name, block_size, pack), *shape), dtype=dtype, device=device)
                  for name, shape in layer.tensors)
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
