"""dsv4 model on the family contract (see ``models/protocol.py``). A local compact family, not DeepSeek-V4.

Per layer: latent attention (optional query LoRA; the cache holds only ``[c_kv | k_pe]`` per
token; decode optionally attends over the latent directly with ``kv_b_proj`` absorbed), then a
dense SwiGLU MLP (first ``first_k_dense_replace`` layers) or a small MoE (sigmoid top-k routing
with a selection-only correction bias, plus shared experts). Module names follow the
DeepSeek-V3 HF checkpoint except merged ``gate_up_proj`` (dense/shared MLPs) and the 3-D routed
expert tensors; ``weights.py`` maps the names.

Cache per layer (``family.kv_spec``): ``latent [blocks, block_size, kv_lora_rank + rope_dim]``.
"""

from __future__ import annotations

from types import ModuleType

import torch

from torchinferno.models.common.attention import gather_kv
from torchinferno.models.common.attention_metadata import AttentionMetadata
from torchinferno.models.common.causal_lm import CausalLMBase, DecoderStack, PreNormDecoderLayer
from torchinferno.models.common.layers import GatedMLP, RMSNorm, SparseMoE
from torchinferno.models.common.mla_projections import MLAProjections
from torchinferno.models.common.rope import RopeScaling, rope_cos_sin
from torchinferno.models.dsv4 import raw_ops
from torchinferno.models.dsv4.config import DSv4Config


class LatentAttention(MLAProjections):
    """MLA-style attention over a paged latent cache (dense cache = one block per row).

    ``absorb_decode``: decode batches attend over the cached latent with W_UK folded into the
    query and W_UV into the output (no per-head K/V is ever materialized); otherwise every batch
    takes the expanded path (per sequence: ``kv_b_proj`` expands the latent into K/V).
    """

    def __init__(self, cfg: DSv4Config, ops: ModuleType, absorb_decode: bool):
        super().__init__(cfg, ops, absorb_decode, bias=False)

    def forward(self, x, cos, sin, kv_cache: tuple[torch.Tensor, ...] | None, meta: AttentionMetadata | None):
        T, H = x.shape[0], self.num_heads
        decode = kv_cache is not None and meta is not None and meta.is_decode and self.absorb_decode
        # latent [T, R + r]: everything this layer caches (written into kv_cache[0] here)
        _, q_nope, q_pe, latent = self.project_and_write(x, cos, sin, None if kv_cache is None else kv_cache[0], meta,
                                                         decode_query=decode and not self.batch_invariant)
        if decode:
            if self.batch_invariant:
                o = self.each_decode_row(lambda qn, qp, m: self._decode_absorbed(qn, qp, kv_cache[0], m),
                                         meta, q_nope, q_pe)
            else:
                o = self._decode_absorbed(q_nope, q_pe, kv_cache[0], meta)
            return self.o_proj(o.reshape(T, H * self.v_dim))
        o = self._expanded(q_nope, q_pe, latent, kv_cache, meta)
        if self.batch_invariant and self.absorb_decode and kv_cache is not None and meta is not None:
            o = self.decode_rows_of_mixed(o, lambda qn, qp, m: self._decode_absorbed(qn, qp, kv_cache[0], m),
                                          meta, q_nope, q_pe)
        return self.o_proj(o.reshape(T, H * self.v_dim))

    def _expanded(self, q_nope, q_pe, latent, kv_cache, meta: AttentionMetadata | None):
        T = q_nope.shape[0]
        out = q_nope.new_empty(T, self.num_heads, self.v_dim)
        for b, (s, qlen, ctx) in enumerate(AttentionMetadata.spans_of(meta, T)):
            e, slen = s + qlen, ctx + qlen
            mask = None
            if ctx == 0:
                lat = latent[s:e]
            else:
                if kv_cache is None:
                    raise ValueError(f"sequence {b} has {ctx} context tokens but no KV cache was passed")
                lat = gather_kv(kv_cache[0], meta.block_tables[b : b + 1], slen)[0].to(q_nope.dtype)
                dev = q_nope.device  # query j (absolute position ctx + j) sees keys 0..ctx+j
                mask = torch.arange(slen, device=dev)[None, :] <= (ctx + torch.arange(qlen, device=dev))[:, None]
            out[s:e] = self.ops.latent_expanded_attention(q_nope[s:e], q_pe[s:e], lat, self.kv_b_proj.weight, self.scale, mask)
        return out

    def _decode_absorbed(self, q_nope, q_pe, cache: torch.Tensor, meta: AttentionMetadata):
        o = self.paged_decode(q_nope, q_pe, cache, meta)  # Triton over the paged cache (CUDA, fused ops)
        if o is not None:
            return o
        L = meta.max_seq_len
        lat = gather_kv(cache, meta.block_tables, L).to(q_nope.dtype)  # [B, L, R + r]
        mask = None
        if min(meta.seq_lens_list) != L:
            mask = torch.arange(L, device=q_nope.device)[None, :] < meta.seq_lens[:, None].to(q_nope.device)
        return self.ops.latent_absorbed_attention(q_nope, q_pe, lat, self.kv_b_proj.weight, self.scale, mask)


class DSv4DecoderLayer(PreNormDecoderLayer):
    def __init__(self, cfg: DSv4Config, layer_idx: int, ops: ModuleType, absorb_decode: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.self_attn = LatentAttention(cfg, ops, absorb_decode)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        dense = cfg.layer_mlp_types[layer_idx] == "dense"
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, ops) if dense else SparseMoE(cfg, ops)


class DSv4ForCausalLM(CausalLMBase):
    """dsv4 causal LM (local compact family, not DeepSeek-V4).

    ``forward(input_ids [T], positions [T], kv_caches, attn_meta) -> hidden [T, D]``;
    ``compute_logits(hidden [N, D]) -> [N, V]`` fp32.
    """

    family_name = "dsv4"  # registry name: ``.family``, ``from_pretrained`` refuses other families

    def __init__(self, config: DSv4Config, ops: ModuleType = raw_ops, absorb_decode: bool = False):
        layers = (DSv4DecoderLayer(config, i, ops, absorb_decode) for i in range(config.num_hidden_layers))
        super().__init__(config, ops, DecoderStack(config.vocab_size, config.hidden_size, config.rms_norm_eps, layers, ops))

    def rope_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        return rope_cos_sin(c.qk_rope_head_dim, c.rope_theta, c.max_position_embeddings, RopeScaling())
