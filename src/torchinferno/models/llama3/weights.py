"""HF name <-> internal name mapping for llama3 (merged qkv / gate_up projections)."""

from __future__ import annotations

import re
from typing import Iterable, Iterator

import torch

from torchinferno.errors import CheckpointError

# HF name suffix -> (internal module suffix, shard index) for merged projections.
_MERGED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")


def _shard_sizes(model, internal: str) -> list[int]:
    cfg = model.config
    if "qkv_proj" in internal:
        hd = cfg.head_dim_
        return [cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd, cfg.num_key_value_heads * hd]
    return [cfg.intermediate_size, cfg.intermediate_size]


def hf_to_internal(model, hf_name: str) -> tuple[str, int | None]:
    """Map one HF tensor name to (internal parameter name, shard index or None)."""
    m = _LAYER.match(hf_name)
    if m:
        idx, mod, kind = m.groups()
        if mod in _MERGED:
            target, shard = _MERGED[mod]
            return f"model.layers.{idx}.{target}.{kind}", shard
    if hf_name == "lm_head.weight" and model.config.tie_word_embeddings:
        return "", None  # tied: the embedding is the head
    return hf_name, None


def load_weights(model, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy HF-named tensors into ``model`` (materialized, not meta); every parameter must be covered."""
    params = dict(model.named_parameters())
    covered: dict[str, set] = {name: set() for name in params}
    for hf_name, tensor in tensors:
        if _IGNORED.search(hf_name):
            continue
        internal, shard = hf_to_internal(model, hf_name)
        if internal == "":
            continue
        if internal not in params:
            raise CheckpointError(f"unexpected tensor '{hf_name}' for llama3 (no parameter '{internal}')")
        p = params[internal]
        if shard is None:
            dst = p.data
        else:
            sizes = _shard_sizes(model, internal)
            dst = p.data.narrow(0, sum(sizes[:shard]), sizes[shard])
        if tuple(tensor.shape) != tuple(dst.shape):
            raise CheckpointError(f"shape mismatch for tensor '{hf_name}': checkpoint {tuple(tensor.shape)}, model expects {tuple(dst.shape)}")
        dst.copy_(tensor.to(dst.dtype))
        covered[internal].add(shard)
    missing = []
    for name, got in covered.items():
        if name.endswith(("qkv_proj.weight", "qkv_proj.bias")):
            need = {0, 1, 2}
        elif name.endswith(("gate_up_proj.weight", "gate_up_proj.bias")):
            need = {0, 1}
        else:
            need = {None}
        if not need <= got:
            missing.append(name)
    if missing:
        shown = ", ".join(_internal_to_hf_names(m)[0] for m in missing[:5])
        raise CheckpointError(f"checkpoint is missing {len(missing)} tensor(s) for llama3, e.g. {shown}")


def _internal_to_hf_names(internal: str) -> list[str]:
    for hf_suffix, (target, _) in _MERGED.items():
        if f".{target}." in internal:
            return [internal.replace(target, s) for s, (t, _) in _MERGED.items() if t == target]
    return [internal]


def export_weights(model) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, tensor) pairs; merged projections are split back."""
    for name, p in model.named_parameters():
        merged = [(s, i) for s, (t, i) in _MERGED.items() if f".{t}." in name]
        if not merged:
            yield name, p.detach()
            continue
        target = next(t for s, (t, _) in _MERGED.items() if f".{t}." in name)
        sizes = _shard_sizes(model, target)
        chunks = p.detach().split(sizes, dim=0)
        for suffix, i in merged:
            yield name.replace(target, suffix), chunks[i]
