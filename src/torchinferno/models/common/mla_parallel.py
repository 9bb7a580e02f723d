"""The tensor-parallel plan shared by the MLA + MoE families (deepseek-v3.2, dsv4).

Per layer: ``parallel.plan.shard_mla`` (heads split; latent, its cache and any indexer replicated), then
the dense MLP (intermediate split) or the MoE block (experts split across ranks, router replicated,
shared experts split, one all-reduce); vocab-parallel embedding and head. ``config`` stays the full one
(the latent cache does not shrink with the ranks).
"""

from __future__ import annotations

from torch import nn

from torchinferno.models.common.layers import SparseMoE
from torchinferno.parallel import plan
from torchinferno.parallel.comm import Comm
from torchinferno.parallel.config import ParallelConfig


def check(config, pcfg: ParallelConfig) -> None:
    """One-line ConfigError if the model cannot be split over ``pcfg.tp_size`` ranks."""
    pcfg.split(config.num_attention_heads, "num_attention_heads")
    pcfg.split(config.intermediate_size, "intermediate_size")
    pcfg.split(config.n_routed_experts, "n_routed_experts")
    if config.n_shared_experts:
        pcfg.split(config.moe_intermediate_size * config.n_shared_experts, "moe_intermediate_size * n_shared_experts")


def shard_model(model: nn.Module, pcfg: ParallelConfig, comm: Comm) -> None:
    check(model.config, pcfg)
    for layer in model.model.layers:
        plan.shard_mla(layer.self_attn, pcfg, comm)
        if isinstance(layer.mlp, SparseMoE):
            plan.shard_moe(layer.mlp, pcfg, comm)
        else:
            plan.shard_gated_mlp(layer.mlp, pcfg, comm)
    plan.shard_vocab(model, pcfg, comm)
    plan.disable_fused_steps(model)
    model.full_config = model.config


def tensor_rule(name: str, config, pcfg: ParallelConfig) -> plan.ShardRule:
    """Which part of HF tensor ``name`` this rank reads (``config``: the full model's)."""
    plan.refuse_scales(name)
    rest = plan.layer_suffix(name)
    if rest is None:
        return plan.vocab_or_whole(name, config.vocab_size, pcfg)
    h0, hl = pcfg.split(config.num_attention_heads, "num_attention_heads")
    qk = config.qk_nope_head_dim + config.qk_rope_head_dim
    if rest in ("self_attn.q_proj.weight", "self_attn.q_b_proj.weight"):
        return plan.rows(h0 * qk, hl * qk)
    if rest == "self_attn.kv_b_proj.weight":
        per = config.qk_nope_head_dim + config.v_head_dim
        return plan.rows(h0 * per, hl * per)
    if rest == "self_attn.o_proj.weight":
        return plan.cols(h0 * config.v_head_dim, hl * config.v_head_dim)
    if rest == "self_attn.o_proj.bias":
        return plan.row_parallel_bias(pcfg)
    shared = config.moe_intermediate_size * config.n_shared_experts
    mlp = plan.mlp_rule(rest, config.intermediate_size, shared, config.n_routed_experts, name, pcfg)
    return plan.WHOLE if mlp is None else mlp
