"""Reference ops of the deepseek-v3.2 family: plain torch, written for readability and as the oracle.

An ops module is passed to the model at construction (``DeepSeekV32ForCausalLM(config, ops=...)``).
Every ops module of this family exposes the same functions with the same contracts; the MLA,
indexer and MoE compute comes from ``models/common/{mla,moe}.py``.
"""

from __future__ import annotations

from functools import partial

import torch

from torchinferno.kernels import mla_decode
from torchinferno.models.common import mla, moe
from torchinferno.models.common.attention import gather_kv
from torchinferno.models.common.norm_act_ops import Raw
from torchinferno.models.common.rope import apply_rope_interleaved, apply_rope_neox

rms_norm = Raw.rms_norm
add_rms_norm = Raw.add_rms_norm
silu_and_mul = Raw.silu_and_mul

NAME = "raw"


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x [T, H, r], cos/sin [T, r/2] -> rotated; ``interleaved`` rotates adjacent pairs, else halves.

    transformers' interleaved path returns the rotated pairs de-interleaved ([evens | odds]);
    we keep the pairs in place. q and k are permuted alike, so every q.k (and the logits) agree.
    """
    return apply_rope_interleaved(x, cos, sin) if interleaved else apply_rope_neox(x, cos, sin)


mla_expanded_attention = mla.mla_expanded_attention
mla_absorbed_attention = mla.mla_absorbed_attention
# DSA decode over the selected latent rows (flat slots [B, k]): the torch reference of kernels.sparse_sink_decode
mla_sparse_absorbed_attention = partial(mla_decode.sparse_absorbed_decode, use_triton=False)
indexer_scores = mla.indexer_scores


def indexer_scores_paged(q: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor, num_keys: int,
                         w: torch.Tensor, limits: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`indexer_scores` over the first ``num_keys`` keys of each row's blocks of a paged cache [N, page, Di]."""
    return indexer_scores(q, gather_kv(k_cache, block_tables, num_keys), w, limits)


route = moe.route_sigmoid_grouped
grouped_expert_mlp = moe.grouped_expert_mlp
