"""Tensor-parallel plan of deepseek-v4 (``ModelFamily.parallel_module``; helpers in ``parallel/plan.py``).

What is split and what is replicated, per layer, and why:

* attention: query heads split (``q_b_proj`` rows, the per-head ``sinks`` with them); the output's grouped
  low-rank projection follows the heads: a rank holds whole ``o_groups`` groups (``o_a_proj`` rows of its
  groups, ``o_b_proj`` columns) or, with more ranks than groups, its heads' columns of one group (``o_a_proj``
  block ``[group rows, head columns]``: the group's output is then a partial sum, which ``o_b_proj`` keeps
  linear); one all-reduce after ``o_b_proj``. Replicated: ``q_a_proj`` / ``q_a_norm`` (the q latent also feeds
  the indexer), the one shared K=V head (``kv_proj``, ``kv_norm``: a single head cannot be split), the
  compressor (its entries are K=V rows every head reads) and the CSA lightning indexer (its top-k needs the
  score summed over all indexer heads: replicated, every rank selects the very same entries without a
  collective). The per-token cache is therefore the full one on every rank (``config`` stays the full one).
* MoE: routed experts split across ranks (expert parallel, a balanced contiguous share; ranks may hold one
  expert more than others), router replicated (identical top-k and hash routing ``tid2eid`` everywhere);
  the shared expert's intermediate split (``gate_proj`` / ``up_proj`` rows, ``down_proj`` columns: its clamps are
  elementwise); one all-reduce after the block.
* replicated: mHC hyper-connections (``attn_hc``, ``ffn_hc``, ``hc_head``: cheap [T, n, n] mixing), norms.
* vocab-parallel embedding (all-reduce) and head (all-gather of the logits).

Checkpoint names of either spelling (transformers' or the release's) are matched through
``weights.canonical_name``; a rank reads only its slices. Release FP8 / MXFP4 checkpoints: per-expert
tensors and their scales are skipped / renumbered by expert; a split dense FP8 weight reads the rows / columns
of its 128x128 block scale that cover its slice (slices must be 128-aligned: V4-Flash's are at TP <= 8).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch
from torch import nn

from torchinferno.checkpoint.quant_v4 import FP8_BLOCK
from torchinferno.errors import ConfigError
from torchinferno.models.deepseek_v4.model import Experts, GroupedLinear
from torchinferno.models.deepseek_v4.weights import canonical_name
from torchinferno.parallel import plan
from torchinferno.parallel.comm import Comm
from torchinferno.parallel.config import ParallelConfig
from torchinferno.parallel.layers import add_all_reduce


@dataclass(frozen=True)
class OutputShare:
    """This rank's part of the grouped output projection: groups ``[g0, g0 + groups)`` of ``o_a_proj``
    (``o_lora_rank`` rows each), input columns ``[c0, c0 + width)`` of each group's ``K = H*hd/o_groups``."""

    g0: int
    groups: int
    c0: int
    width: int
    whole: bool  # True: whole groups (c0 == 0, width == K); False: a part of one group


def head_share(config, pcfg: ParallelConfig) -> tuple[int, int]:
    return pcfg.split(config.num_attention_heads, "num_attention_heads")


def output_share(config, pcfg: ParallelConfig) -> OutputShare:
    """The rank's dims ``[h0*hd, (h0+hl)*hd)`` of the flattened heads against the groups of ``K`` dims."""
    h0, hl = head_share(config, pcfg)
    hd, G = config.head_dim, config.o_groups
    K = config.num_attention_heads * hd // G
    a, n = h0 * hd, hl * hd
    if a % K == 0 and n % K == 0:
        return OutputShare(a // K, n // K, 0, K, True)
    if a // K == (a + n - 1) // K:
        return OutputShare(a // K, 1, a % K, n, False)
    raise ConfigError(f"o_groups={G} does not split over --tensor-parallel-size {pcfg.tp_size}: each rank's "
                      f"{hl} heads must be whole output groups or lie inside one")


def expert_share(n_experts: int, pcfg: ParallelConfig) -> tuple[int, int]:
    """``(start, count)``: a balanced contiguous share of the routed experts (counts differ by at most one)."""
    start = pcfg.rank * n_experts // pcfg.tp_size
    return start, (pcfg.rank + 1) * n_experts // pcfg.tp_size - start


def check(config, pcfg: ParallelConfig) -> None:
    """One-line ConfigError if the model cannot be split over ``pcfg.tp_size`` ranks."""
    head_share(config, pcfg)
    output_share(config, pcfg)
    pcfg.split(config.moe_intermediate_size, "moe_intermediate_size")
    if config.n_routed_experts < pcfg.tp_size:
        raise ConfigError(f"n_routed_experts={config.n_routed_experts} is fewer than --tensor-parallel-size {pcfg.tp_size}")


class ExpertParallelClampedExperts(Experts):
    """This rank's routed experts ``[start, start + count)`` of V4's clamped-SwiGLU experts.

    The router is replicated, so every rank sees the same ``ids``; this rank computes only the (token, expert)
    pairs of its experts and the MoE block's all-reduce adds the ranks' partial sums. Under fake tensors
    (tracing) every pair runs, other ranks' with weight 0; on CUDA the fused MoE drops the other ranks' pairs
    (id -1) on the device."""

    def __init__(self, cfg, ops, start: int, count: int):
        super().__init__(cfg, ops)
        D, I = cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(count, 2 * I, D, device=self.gate_up_proj.device))
        self.down_proj = nn.Parameter(torch.empty(count, D, I, device=self.down_proj.device))
        self.start, self.count = start, count

    def forward(self, x, ids, weights):  # x [T, D], ids / weights [T, k] -> [T, D] (this rank's partial sum)
        local = ids - self.start
        mine = (local >= 0) & (local < self.count)
        from torchinferno.models.common.moe import _is_fake

        if _is_fake(x):
            return super().forward(x, local.clamp(0, self.count - 1), weights * mine.to(weights.dtype))
        from torchinferno.kernels import fused_moe

        if self.moe_backend == "auto" and fused_moe.usable(x, self.gate_up_proj):
            return fused_moe.fused_experts(x, torch.where(mine, local, -1), weights, self.gate_up_proj, self.down_proj,
                                           limit=self.limit, may_drop=True)
        t, k = mine.nonzero(as_tuple=True)  # this rank's pairs, one per row
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        if t.numel():
            y = super().forward(x[t], local[t, k][:, None], weights[t, k][:, None])  # [P, D]
            out.index_add_(0, t, y.float())
        return out.to(x.dtype)


def _shard_attention(attn: nn.Module, config, pcfg: ParallelConfig, comm: Comm) -> None:
    _, hl = head_share(config, pcfg)
    share = output_share(config, pcfg)
    R = config.o_lora_rank
    attn.q_b_proj = plan.column(attn.q_b_proj, 0, hl * config.head_dim)
    dtype = attn.o_a_proj.weight.dtype
    with torch.device("meta"):
        attn.sinks = nn.Parameter(torch.empty(hl, dtype=torch.float32))
        attn.o_a_proj = GroupedLinear(share.width, share.groups * R, share.groups).to(dtype)
    attn.o_b_proj = plan.row(attn.o_b_proj, share.groups * R)
    attn.num_heads = hl
    # the forward reshapes its heads into cfg.o_groups groups: the rank-local count
    attn.cfg = replace(attn.cfg, num_attention_heads=hl, o_groups=share.groups)
    add_all_reduce(attn, comm)


def _shard_moe(moe: nn.Module, config, pcfg: ParallelConfig, comm: Comm) -> None:
    start, count = expert_share(config.n_routed_experts, pcfg)
    old = moe.experts
    with torch.device("meta"):
        moe.experts = ExpertParallelClampedExperts(config, old.ops, start, count).to(old.gate_up_proj.dtype)
    _, il = pcfg.split(config.moe_intermediate_size, "moe_intermediate_size")
    sh = moe.shared_experts
    sh.gate_proj = plan.column(sh.gate_proj, 0, il)
    sh.up_proj = plan.column(sh.up_proj, 0, il)
    sh.down_proj = plan.row(sh.down_proj, il)
    add_all_reduce(moe, comm)


def shard_model(model: nn.Module, pcfg: ParallelConfig, comm: Comm) -> None:
    """In place, on a ``meta``-built model: every layer, the embedding and the head become this rank's."""
    config = model.config
    check(config, pcfg)
    for layer in model.model.layers:
        _shard_attention(layer.self_attn, config, pcfg, comm)
        _shard_moe(layer.mlp, config, pcfg, comm)
    plan.shard_vocab(model, pcfg, comm)
    plan.disable_fused_steps(model)
    model.full_config = model.config


# ---------------------------------------------------------------------------------------- tensors

_EXPERT_INDEX = re.compile(r"(\.experts\.)(\d+)(\.)")
_SCALES = (".weight_scale_inv", ".scale")


@dataclass(frozen=True)
class BlockRule(plan.ShardRule):
    """A 2-D block ``[r0, r0 + rn) x [c0, c0 + cn)`` (``o_a_proj`` of a rank holding part of one group)."""

    c0: int = 0
    cn: int = 0

    def read(self, src) -> torch.Tensor:
        return src[self.start:self.start + self.count, self.c0:self.c0 + self.cn]


def _weight_rule(rest: str, name: str, config, pcfg: ParallelConfig) -> plan.ShardRule:
    """Rule of a layer tensor (internal suffix ``rest``; ``name`` as the checkpoint spells it)."""
    hd, R = config.head_dim, config.o_lora_rank
    if rest == "self_attn.q_b_proj.weight":
        h0, hl = head_share(config, pcfg)
        return plan.rows(h0 * hd, hl * hd)
    if rest == "self_attn.sinks":
        return plan.rows(*head_share(config, pcfg))
    if rest == "self_attn.o_a_proj.weight":
        s = output_share(config, pcfg)
        if s.whole:
            return plan.rows(s.g0 * R, s.groups * R)
        return BlockRule(start=s.g0 * R, count=R, c0=s.c0, cn=s.width)
    if rest == "self_attn.o_b_proj.weight":
        s = output_share(config, pcfg)
        return plan.cols(s.g0 * R, s.groups * R)
    if rest in ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"):
        return plan.rows(*pcfg.split(config.moe_intermediate_size, "moe_intermediate_size"))
    if rest == "mlp.shared_experts.down_proj.weight":
        return plan.cols(*pcfg.split(config.moe_intermediate_size, "moe_intermediate_size"))
    start, count = expert_share(config.n_routed_experts, pcfg)
    if rest in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):  # fused 3-D layout
        return plan.rows(start, count)
    m = _EXPERT_INDEX.search(name) if rest.startswith("mlp.experts.") else None
    if m:
        e = int(m.group(2))
        if not start <= e < start + count:
            return plan.ShardRule(skip=True)
        return plan.ShardRule(rename=name[: m.start()] + f"{m.group(1)}{e - start}{m.group(3)}" + name[m.end():])
    return plan.WHOLE


def tensor_rule(name: str, config, pcfg: ParallelConfig) -> plan.ShardRule:
    """Which part of checkpoint tensor ``name`` (either spelling) this rank reads (``config``: the full model's)."""
    canon = canonical_name(name)
    if canon is None:
        return plan.WHOLE  # ignored by load_weights (MTP, rope buffers)
    if canon in ("model.embed_tokens.weight", "lm_head.weight"):
        return plan.vocab_rule(config.vocab_size, pcfg)
    rest = plan.layer_suffix(canon)
    if rest is None:
        return plan.WHOLE
    for suffix in _SCALES:  # a quantization scale follows its weight (whole, by expert, or by 128-blocks)
        if rest.endswith(suffix):
            return _scale_rule(_weight_rule(rest[: -len(suffix)] + ".weight", name, config, pcfg), name)
    return _weight_rule(rest, name, config, pcfg)


def _scale_rule(base: plan.ShardRule, name: str) -> plan.ShardRule:
    """The rule of a scale whose weight reads ``base``: the same when whole or by expert; a slice of a dense
    weight reads the FP8 block scale ``[ceil(N/128), ceil(K/128)]`` of its 128-aligned blocks (the release
    quantizes dense tensors in FP8 and only the per-expert tensors in MXFP4)."""
    if base.count is None:
        return base
    spans = [(base.start, base.count)] + ([(base.c0, base.cn)] if isinstance(base, BlockRule) else [])
    if any(a % FP8_BLOCK or n % FP8_BLOCK for a, n in spans):
        raise ConfigError(f"tensor parallelism cannot split the 128x128 block scales of quantized '{name}' at "
                          f"{base.start}+{base.count}; convert the checkpoint (deepseek-v4-convert) or pick another "
                          "--tensor-parallel-size")
    if isinstance(base, BlockRule):
        return BlockRule(start=base.start // FP8_BLOCK, count=base.count // FP8_BLOCK, c0=base.c0 // FP8_BLOCK,
                         cn=base.cn // FP8_BLOCK)
    return plan.ShardRule(dim=base.dim, start=base.start // FP8_BLOCK, count=base.count // FP8_BLOCK)
