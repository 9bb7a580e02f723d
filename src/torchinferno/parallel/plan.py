"""Sharding plans: which module of a ``meta``-built model gets which parallel style, and which slice of
each checkpoint tensor a rank reads.

A family's ``models/<family>/parallel.py`` composes the helpers here:

* :func:`shard_gqa_attention`: query heads split; KV heads split, or one replicated KV head per rank
  when there are fewer KV heads than ranks; ``o_proj`` row-parallel (all-reduce after the block);
* :func:`shard_mla`: MLA heads split (``q_proj``/``q_b_proj``, ``kv_b_proj`` rows; ``o_proj`` columns);
  the latent projection, its cache and the DSA indexer are replicated (every rank caches the same latent);
* :func:`shard_gated_mlp`: ``gate_up_proj`` column-parallel, ``down_proj`` row-parallel;
* :func:`shard_moe`: routed experts split across ranks (expert parallel) with the router replicated
  (identical routing everywhere), shared experts column/row split, one all-reduce for the block;
* :func:`shard_vocab`: vocab-parallel embedding (all-reduce) and head (all-gather of the logits).

Helpers run on ``meta`` (nothing allocated) and keep parameter names, so ``family.load_weights`` fills
the rank from the tensors :class:`ShardRule` cuts. The fused decode steps (lean CPU, fused CUDA) read
unsharded weights and are turned off on a sharded model; the module path runs instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from torchinferno.errors import ConfigError
from torchinferno.models.common.layers import DirectWeightLinear
from torchinferno.parallel.comm import Comm
from torchinferno.parallel.config import ParallelConfig
from torchinferno.parallel.layers import (
    ExpertParallelExperts,
    ParallelLMHead,
    VocabParallelEmbedding,
    add_all_reduce,
)


@dataclass(frozen=True)
class ShardRule:
    """How a rank reads one checkpoint tensor: whole (the default), a slice ``[start, start + count)``
    along ``dim`` (zero-padded to ``pad_to`` rows), zeros (a row-parallel bias lives on rank 0 only),
    not at all (``skip``: another rank's expert), or under another name (``rename``: local expert index)."""

    dim: int = 0
    start: int = 0
    count: int | None = None
    pad_to: int | None = None
    zero: bool = False
    skip: bool = False
    rename: str | None = None

    def read(self, src) -> torch.Tensor:
        """This rank's part of ``src``: a tensor or a lazy safetensors slice (only the part is read)."""
        if self.count is None:
            t = src[:] if not isinstance(src, torch.Tensor) else src
        else:
            index = (slice(None),) * self.dim + (slice(self.start, self.start + self.count),)
            t = src[index]
        if self.zero:
            t = torch.zeros_like(t)
        if self.pad_to is not None and t.shape[self.dim] < self.pad_to:
            pad = list(t.shape)
            pad[self.dim] = self.pad_to - t.shape[self.dim]
            t = torch.cat([t, t.new_zeros(pad)], dim=self.dim)
        return t


WHOLE = ShardRule()


def rows(start: int, count: int) -> ShardRule:
    return ShardRule(dim=0, start=start, count=count)


def cols(start: int, count: int) -> ShardRule:
    return ShardRule(dim=1, start=start, count=count)


def row_parallel_bias(pcfg: ParallelConfig) -> ShardRule:
    return ShardRule(zero=pcfg.rank != 0)


def vocab_rule(vocab_size: int, pcfg: ParallelConfig) -> ShardRule:
    start, real, per = pcfg.padded_split(vocab_size)
    return ShardRule(dim=0, start=start, count=real, pad_to=per)


# ---------------------------------------------------------------------------------------- modules


def _linear(old: nn.Linear, in_f: int, out_f: int, cls: type[nn.Linear] = nn.Linear) -> nn.Linear:
    """A ``meta`` linear of the new shape with ``old``'s dtype and bias presence."""
    with torch.device("meta"):
        return cls(in_f, out_f, bias=old.bias is not None, dtype=old.weight.dtype)


def column(old: nn.Linear, start: int, count: int) -> nn.Linear:
    del start  # the slice is taken when reading the checkpoint
    return _linear(old, old.in_features, count, type(old))


def row(old: nn.Linear, count: int) -> nn.Linear:
    return _linear(old, count, old.out_features, type(old))


def shard_gqa_attention(attn: nn.Module, pcfg: ParallelConfig, comm: Comm) -> None:
    """``attn`` has ``num_heads``, ``num_kv_heads``, ``head_dim``, ``q_size``, ``kv_size``, merged ``qkv_proj``,
    ``o_proj`` and an attention backend ``attn(num_heads, num_kv_heads, scale)``."""
    _, hl = pcfg.split(attn.num_heads, "num_attention_heads")
    _, kvl = pcfg.kv_heads(attn.num_heads, attn.num_kv_heads)
    hd = attn.head_dim
    attn.qkv_proj = column(attn.qkv_proj, 0, (hl + 2 * kvl) * hd)
    attn.o_proj = row(attn.o_proj, hl * hd)
    attn.num_heads, attn.num_kv_heads, attn.q_size, attn.kv_size = hl, kvl, hl * hd, kvl * hd
    backend = attn.attn
    with torch.device("meta"):
        attn.attn = type(backend)(hl, kvl, backend.scale)
    add_all_reduce(attn, comm)


def shard_mla(attn: nn.Module, pcfg: ParallelConfig, comm: Comm) -> None:
    """An ``MLAProjections`` module: its heads split; the latent and the indexer replicated."""
    _, hl = pcfg.split(attn.num_heads, "num_attention_heads")
    qk = attn.nope_dim + attn.rope_dim
    if attn.q_lora_rank is None:
        attn.q_proj = column(attn.q_proj, 0, hl * qk)
    else:
        attn.q_b_proj = column(attn.q_b_proj, 0, hl * qk)
    attn.kv_b_proj = _linear(attn.kv_b_proj, attn.kv_b_proj.in_features, hl * (attn.nope_dim + attn.v_dim), DirectWeightLinear)
    attn.o_proj = row(attn.o_proj, hl * attn.v_dim)
    attn.num_heads = hl
    add_all_reduce(attn, comm)


def shard_gated_mlp(mlp: nn.Module, pcfg: ParallelConfig, comm: Comm | None) -> None:
    """A ``GatedMLP``: intermediate split. ``comm=None``: no all-reduce of its own (inside a MoE block)."""
    inter = mlp.down_proj.in_features
    _, il = pcfg.split(inter, "intermediate_size")
    mlp.gate_up_proj = column(mlp.gate_up_proj, 0, 2 * il)
    mlp.down_proj = row(mlp.down_proj, il)
    if comm is not None:
        add_all_reduce(mlp, comm)


def shard_moe(moe: nn.Module, pcfg: ParallelConfig, comm: Comm) -> None:
    """A ``SparseMoE``: experts split across ranks, router replicated, shared experts split, one all-reduce."""
    ex = moe.experts
    E, I2, D = ex.gate_up_proj.shape
    start, count = pcfg.split(E, "n_routed_experts")
    with torch.device("meta"):
        local = ExpertParallelExperts(start, count, D, I2 // 2, ex.ops)
    moe.experts = local.to(ex.gate_up_proj.dtype)
    if moe.shared_experts is not None:
        shard_gated_mlp(moe.shared_experts, pcfg, None)
    add_all_reduce(moe, comm)


def shard_vocab(model: nn.Module, pcfg: ParallelConfig, comm: Comm) -> None:
    """Embedding rows and head rows split by vocabulary (padded to equal shares)."""
    emb = model.model.embed_tokens
    V, D = emb.weight.shape
    start, _, per = pcfg.padded_split(V)
    with torch.device("meta"):
        new = VocabParallelEmbedding(V, D, start, per, comm).to(emb.weight.dtype)
    model.model.embed_tokens = new
    if model.lm_head is None:  # tied: the head reads the embedding's own rows
        model.lm_head = ParallelLMHead(V, comm, tied=new)
    else:
        with torch.device("meta"):
            w = nn.Parameter(torch.empty(per, D, dtype=model.lm_head.weight.dtype))
        model.lm_head = ParallelLMHead(V, comm, weight=w)


def disable_fused_steps(model: nn.Module) -> None:
    """The lean CPU / fused CUDA decode steps read whole weights: mark the model sharded, so runners keep its module
    path (models/common/step_model)."""
    model.sharded = True


# ---------------------------------------------------------------------------------------- tensors

_LAYER = re.compile(r"^model\.layers\.\d+\.(.+)$")
_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)(\d+)(\..+)$")


def layer_suffix(name: str) -> str | None:
    m = _LAYER.match(name)
    return m.group(1) if m else None


def vocab_or_whole(name: str, vocab_size: int, pcfg: ParallelConfig) -> ShardRule:
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return vocab_rule(vocab_size, pcfg)
    return WHOLE


def mlp_rule(rest: str, inter: int, shared_inter: int, experts: int, name: str, pcfg: ParallelConfig) -> ShardRule | None:
    """Rules of a dense ``mlp.*``, ``mlp.shared_experts.*`` and routed ``mlp.experts.*`` tensor (HF names);
    None: not an MLP tensor."""
    for prefix, n in (("mlp.shared_experts.", shared_inter), ("mlp.", inter)):
        for proj in ("gate_proj", "up_proj"):
            if rest.startswith(prefix + proj + "."):
                return rows(*pcfg.split(n, "intermediate_size"))
        if rest == prefix + "down_proj.weight":
            return cols(*pcfg.split(n, "intermediate_size"))
        if rest == prefix + "down_proj.bias":
            return row_parallel_bias(pcfg)
    if rest in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):  # fused 3-D layout
        return rows(*pcfg.split(experts, "n_routed_experts"))
    m = _EXPERT.match(name)
    if m:
        start, count = pcfg.split(experts, "n_routed_experts")
        e = int(m.group(2))
        if not start <= e < start + count:
            return ShardRule(skip=True)
        return ShardRule(rename=f"{m.group(1)}{e - start}{m.group(3)}")
    return None


def refuse_scales(name: str) -> None:
    if name.endswith("weight_scale_inv"):
        raise ConfigError(f"tensor parallelism does not read FP8 block-scaled checkpoints yet ('{name}'); "
                          "convert to bf16 first or use --tensor-parallel-size 1")
