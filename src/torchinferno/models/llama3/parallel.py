"""Tensor-parallel plan of llama3 (``ModelFamily.parallel_module``; helpers in ``parallel/plan.py``).

Per layer: query heads split over ranks; KV heads split too, or (fewer KV heads than ranks) each rank
keeps a replica of the one KV head its query heads read; ``o_proj`` row-parallel; the SwiGLU MLP's
intermediate split; vocab-parallel embedding and head. The rank's ``config`` becomes the rank-local one
(heads, KV heads, intermediate) so ``load_weights`` and ``kv_spec`` see local shapes; ``full_config``
keeps the model's.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from torchinferno.parallel import plan
from torchinferno.parallel.comm import Comm
from torchinferno.parallel.config import ParallelConfig


def check(config, pcfg: ParallelConfig) -> None:
    """One-line ConfigError if the model cannot be split over ``pcfg.tp_size`` ranks."""
    pcfg.split(config.num_attention_heads, "num_attention_heads")
    pcfg.kv_heads(config.num_attention_heads, config.num_key_value_heads)
    pcfg.split(config.intermediate_size, "intermediate_size")


def local_config(config, pcfg: ParallelConfig):
    _, hl = pcfg.split(config.num_attention_heads, "num_attention_heads")
    _, kvl = pcfg.kv_heads(config.num_attention_heads, config.num_key_value_heads)
    _, il = pcfg.split(config.intermediate_size, "intermediate_size")
    return replace(config, num_attention_heads=hl, num_key_value_heads=kvl, head_dim=config.head_dim_,
                   intermediate_size=il)


def shard_model(model: nn.Module, pcfg: ParallelConfig, comm: Comm) -> None:
    """In place, on a ``meta``-built model: every layer, the embedding and the head become this rank's."""
    check(model.config, pcfg)
    for layer in model.model.layers:
        plan.shard_gqa_attention(layer.self_attn, pcfg, comm)
        plan.shard_gated_mlp(layer.mlp, pcfg, comm)
    plan.shard_vocab(model, pcfg, comm)
    plan.disable_fused_steps(model)
    model.full_config, model.config = model.config, local_config(model.config, pcfg)


def tensor_rule(name: str, config, pcfg: ParallelConfig) -> plan.ShardRule:
    """Which part of HF tensor ``name`` this rank reads (``config``: the full model's)."""
    rest = plan.layer_suffix(name)
    if rest is None:
        return plan.vocab_or_whole(name, config.vocab_size, pcfg)
    hd = config.head_dim_
    h0, hl = pcfg.split(config.num_attention_heads, "num_attention_heads")
    kv0, kvl = pcfg.kv_heads(config.num_attention_heads, config.num_key_value_heads)
    if rest.startswith("self_attn.q_proj."):
        return plan.rows(h0 * hd, hl * hd)
    if rest.startswith(("self_attn.k_proj.", "self_attn.v_proj.")):
        return plan.rows(kv0 * hd, kvl * hd)
    if rest == "self_attn.o_proj.weight":
        return plan.cols(h0 * hd, hl * hd)
    if rest == "self_attn.o_proj.bias":
        return plan.row_parallel_bias(pcfg)
    mlp = plan.mlp_rule(rest, config.intermediate_size, 0, 0, name, pcfg)
    return plan.WHOLE if mlp is None else mlp
