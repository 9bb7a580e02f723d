"""DeepSeek-V3 / V3.2 model on the family contract (see ``models/protocol.py``).

Per layer: MLA attention (optional query LoRA, latent-only KV cache, weight absorption on
decode), the V3.2 lightning indexer when ``config.has_indexer`` (top-k causal key selection per
query), then a dense SwiGLU MLP (first ``first_k_dense_replace`` layers) or the MoE block
(sigmoid group-limited routing + shared experts). Module names follow the HF checkpoint except
for merged ``gate_up_proj`` (dense/shared MLPs) and the fused 3-D expert tensors; ``weights.py``
maps the names. The ops module is chosen at construction and never patched afterwards.

Cache per layer (``family.kv_spec``): ``latent [blocks, block_size, kv_lora_rank + rope_dim]``
and, with the indexer, ``index_k [blocks, block_size, index_head_dim]``.
"""

from __future__ import annotations

from types import ModuleType
from typing import NamedTuple

import torch
from torch import nn

from torchinferno.models.common.attention import gather_kv
from torchinferno.models.common.attention_metadata import AttentionMetadata
from torchinferno.models.common.causal_lm import CausalLMBase, DecoderStack, PreNormDecoderLayer
from torchinferno.models.common.layers import FP32Linear, GatedMLP, RMSNorm, SparseMoE
from torchinferno.models.common.mla_projections import MLAProjections
from torchinferno.models.common.rope import rope_cos_sin
from torchinferno.models.common.mla import masked_scores, selected_slots, topk_keep_mask
from torchinferno.models.deepseek_v32 import raw_ops
from torchinferno.models.deepseek_v32.config import DeepSeekV32Config

# The indexer's k_norm is a LayerNorm with eps 1e-6 (as transformers and the public release build it);
# the latent norms' fixed eps is in common/mla_projections.py.


class IndexerProj(NamedTuple):
    q: torch.Tensor  # [T, Hi, Di] rope applied to the first rope_dim dims
    k: torch.Tensor  # [T, Di] (cached as ``index_k``)
    w: torch.Tensor  # [T, Hi] fp32 head weights, with Hi^-0.5 * Di^-0.5 folded in


class IndexTopK(nn.Module):
    """scores [..., Q, S] (-inf = not visible) -> indices [..., Q, min(top_k, S)] of the kept keys.

    Ties are real here (ReLU makes a key score exactly 0 when every head's dot product is
    negative), and ``torch.topk`` breaks them differently for a ``[Q, S]`` prefill block and a
    ``[B, 1, L]`` decode row. A stable descending sort keeps the earlier key among equal scores,
    so cached decode selects exactly what the full forward selects. transformers uses ``topk``
    (arbitrary tie order); the two agree whenever the k-th score is not tied.
    A module of its own so tools (and the oracle test) can hook the selection.
    """

    def __init__(self, top_k: int):
        super().__init__()
        self.top_k = top_k

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        k = min(self.top_k, scores.shape[-1])
        return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


class DSAIndexer(nn.Module):
    """Lightning indexer of DeepSeek Sparse Attention.

    ``q = wq_b(q_latent)`` (Hi heads), one shared key ``k = LayerNorm(wk(x))``; rope is applied
    NON-interleaved to the first ``rope_dim`` dims of both (the corrected public release and
    transformers). ``score[t, s] = sum_h w_h(t) * ReLU(q_h(t) . k(s))`` with
    ``w = weights_proj(x) * Hi^-0.5 * Di^-0.5``. transformers applies ``Di^-0.5`` to the dot
    product before the ReLU; a positive scale commutes with ReLU, so we fold it into ``w``.
    The public release's Hadamard rotation and FP8 quantization of q/k are omitted (as in
    transformers): the rotation preserves dot products, FP8 only perturbs them.
    """

    def __init__(self, cfg: DeepSeekV32Config, ops: ModuleType):
        super().__init__()
        self.n_heads, self.head_dim, self.rope_dim = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
        self.wq_b = nn.Linear(cfg.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden_size, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.weights_proj = FP32Linear(cfg.hidden_size, self.n_heads, bias=False)  # fp32 in a bf16 model
        self.topk = IndexTopK(cfg.index_topk)
        self.weight_scale = self.n_heads**-0.5 * self.head_dim**-0.5
        self.ops = ops

    def forward(self, x: torch.Tensor, q_latent: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> IndexerProj:
        T, r = x.shape[0], self.rope_dim
        q = self.wq_b(q_latent).view(T, self.n_heads, self.head_dim)
        q = torch.cat([self.ops.rope(q[..., :r], cos, sin, False), q[..., r:]], dim=-1)
        k = self.k_norm(self.wk(x))
        k = torch.cat([self.ops.rope(k[:, None, :r], cos, sin, False)[:, 0], k[:, r:]], dim=-1)
        w = self.weights_proj(x) * self.weight_scale  # [T, Hi] fp32 (weights_proj is kept and run in fp32)
        return IndexerProj(q, k, w)

    def select(self, q, k, w, visible: torch.Tensor, limits: torch.Tensor | None = None) -> torch.Tensor:
        """Keep-mask [..., Q, S]: the top-k visible keys of each query (q [...,Q,Hi,Di], k [...,S,Di]). ``limits``
        [..., Q] (optional): the caller's promise that ``visible == arange(S) < limits[..., None]`` (the ops then
        mask by position and the [..., Q, S] mask is not read for the scores)."""
        if limits is not None:
            scores = self.ops.indexer_scores(q, k, w, limits=limits)
        else:
            scores = masked_scores(self.ops.indexer_scores(q, k, w), visible)
        return topk_keep_mask(scores, visible, self.topk(scores))

    def select_positions(self, q, k_cache, block_tables, num_keys: int, w, limits: torch.Tensor) -> torch.Tensor:
        """Positions [B, Q, min(top_k, num_keys)] of the kept keys (q [B, Q, Hi, Di]; keys: the first ``num_keys``
        of each row's blocks of the paged ``index_k`` cache [N, bs, Di], read in place where the ops can; limits
        [B, Q]: key s visible iff s < limits). The same scores and tie rule as :meth:`select` over the gathered keys;
        where fewer than top_k keys are visible the tail holds invisible positions (>= limits), masked by the caller."""
        return self.topk(self.ops.indexer_scores_paged(q, k_cache, block_tables, num_keys, w, limits=limits))


class DeepSeekMLA(MLAProjections):
    """Multi-head latent attention over the paged latent cache (dense = one block per row).

    DSA decode (an indexer and more cached tokens than ``index_topk``): with ``sparse_decode`` (default) the
    indexer's top-k positions become flat latent-cache slots ``[B, min(index_topk, L)]`` on the device and the
    absorbed attention reads only those rows (``ops.mla_sparse_absorbed_attention``); ``sparse_decode = False``
    keeps the dense path (every cached row, the keep-mask applied): the reference it is tested against.
    """

    def __init__(self, cfg: DeepSeekV32Config, ops: ModuleType, absorb_decode: bool = True):
        super().__init__(cfg, ops, absorb_decode, bias=cfg.attention_bias)
        self.indexer = DSAIndexer(cfg, ops) if cfg.has_indexer else None
        self.index_topk = cfg.index_topk if cfg.has_indexer else 0
        self.sparse_decode = True

    @property
    def supports_cuda_graphs(self) -> bool:
        """A decode step reads only device tensors and bounded rows (``kernels.cuda_graphs``): the paged absorbed
        decode, or with the DSA indexer the sparse decode (at most ``index_topk`` latent rows per sequence). Under
        capture the indexer's width is the whole block table: its kernel reads the paged index keys in place and
        skips key tiles past every row's length, but the scores [B, width] and their stable sort span it all."""
        paged = self._paged_ops() and self.absorb_decode
        return paged and (self.indexer is None or self.sparse_decode)

    def forward(self, x, cos, sin, kv_cache: tuple[torch.Tensor, ...] | None, meta: AttentionMetadata | None):
        T, H = x.shape[0], self.num_heads
        decode = kv_cache is not None and meta is not None and meta.is_decode and self.absorb_decode
        # latent [T, R + r]: all this layer caches for MLA (written into kv_cache[0] here)
        q_latent, q_nope, q_pe, latent = self.project_and_write(
            x, cos, sin, None if kv_cache is None else kv_cache[0], meta,
            decode_query=decode and self.indexer is None and not self.batch_invariant)
        idx = self.indexer(x, q_latent, cos, sin) if self.indexer is not None else None
        if kv_cache is not None and meta is not None and idx is not None:
            self.write_latent(kv_cache[1], idx.k, meta)
        if decode:
            if self.batch_invariant:
                o = self.each_decode_row(lambda qn, qp, ix, m: self._decode_absorbed(qn, qp, ix, kv_cache, m),
                                         meta, q_nope, q_pe, idx)
            else:
                o = self._decode_absorbed(q_nope, q_pe, idx, kv_cache, meta)
        else:
            o = self._expanded(q_nope, q_pe, latent, idx, kv_cache, meta)
            if self.batch_invariant and self.absorb_decode and kv_cache is not None and meta is not None:
                o = self.decode_rows_of_mixed(o, lambda qn, qp, ix, m: self._decode_absorbed(qn, qp, ix, kv_cache, m),
                                              meta, q_nope, q_pe, idx)
        return self.o_proj(o.reshape(T, H * self.v_dim))

    def _expanded(self, q_nope, q_pe, latent, idx: IndexerProj | None, kv_cache, meta):
        """Prefill / chunked prefill / mixed batches: per sequence, expand the latent via kv_b_proj."""
        T = q_nope.shape[0]
        out = q_nope.new_empty(T, self.num_heads, self.v_dim)
        for b, (s, qlen, ctx) in enumerate(AttentionMetadata.spans_of(meta, T)):
            e, slen = s + qlen, ctx + qlen
            if ctx == 0:
                lat = latent[s:e]
                ik = None if idx is None else idx.k[s:e]
            else:
                if kv_cache is None:
                    raise ValueError(f"sequence {b} has {ctx} context tokens but no KV cache was passed")
                bt = meta.block_tables[b : b + 1]
                lat = gather_kv(kv_cache[0], bt, slen)[0].to(q_nope.dtype)
                ik = None if idx is None else gather_kv(kv_cache[1], bt, slen)[0]
            sparse = idx is not None and self.index_topk < slen
            if ctx and not sparse and getattr(self.ops, "MLA_PREFILL_CONTEXT", False):  # lower-right causal, no mask
                out[s:e] = self.ops.mla_expanded_attention(q_nope[s:e], q_pe[s:e], lat, self.kv_b_proj.weight,
                                                           self.scale, None, context_len=ctx)
                continue
            mask = None
            if ctx or sparse:  # query j (absolute position ctx + j) sees keys 0..ctx+j
                dev = q_nope.device
                mask = torch.arange(slen, device=dev)[None, :] <= (ctx + torch.arange(qlen, device=dev))[:, None]
            if sparse:
                limits = ctx + 1 + torch.arange(qlen, device=q_nope.device)  # the causal mask above, by position
                mask = self.indexer.select(idx.q[s:e], ik, idx.w[s:e], mask, limits)
            out[s:e] = self.ops.mla_expanded_attention(q_nope[s:e], q_pe[s:e], lat, self.kv_b_proj.weight, self.scale, mask)
        return out

    def _decode_absorbed(self, q_nope, q_pe, idx: IndexerProj | None, kv_cache, meta: AttentionMetadata):
        """One new token per sequence: attend over the cached latent with W_UK / W_UV absorbed."""
        if idx is None:
            o = self.paged_decode(q_nope, q_pe, kv_cache[0], meta)  # Triton over the paged cache (CUDA, fused ops)
            if o is not None:
                return o
        L = meta.max_seq_len
        if idx is not None and self.index_topk < L and self.sparse_decode:
            return self._decode_sparse(q_nope, q_pe, idx, kv_cache, meta)
        lat = gather_kv(kv_cache[0], meta.block_tables, L).to(q_nope.dtype)  # [B, L, R + r]
        visible = torch.arange(L, device=q_nope.device)[None, :] < meta.seq_lens[:, None].to(q_nope.device)  # [B, L]
        mask = None if min(meta.seq_lens_list) == L and not self.capturing(q_nope) else visible
        if idx is not None and self.index_topk < L:
            ik = gather_kv(kv_cache[1], meta.block_tables, L)  # [B, L, Di]
            limits = meta.seq_lens[:, None].to(q_nope.device)  # visible, by position
            mask = self.indexer.select(idx.q[:, None], ik, idx.w[:, None], visible[:, None], limits)[:, 0]
        return self.ops.mla_absorbed_attention(q_nope, q_pe, lat, self.kv_b_proj.weight, self.scale, mask)

    def _decode_sparse(self, q_nope, q_pe, idx: IndexerProj, kv_cache, meta: AttentionMetadata):
        """DSA decode over the selected rows only: the indexer's top-k positions [B, k] (k = min(index_topk, L),
        L = ``meta.max_seq_len``: a static width under capture) -> flat latent slots (-1: not visible) -> absorbed
        attention over those rows. No host value is read beyond the shapes."""
        L = meta.max_seq_len
        dev = q_nope.device
        lens = meta.seq_lens.to(dev)
        pos = self.indexer.select_positions(idx.q[:, None], kv_cache[1], meta.block_tables, L, idx.w[:, None],
                                            lens[:, None])[:, 0]  # [B, k]
        slots = selected_slots(pos, lens, meta.block_tables.to(dev), kv_cache[0].shape[1])  # [B, k]
        return self.ops.mla_sparse_absorbed_attention(q_nope, q_pe, kv_cache[0], self.kv_b_proj.weight, self.scale,
                                                      slots)


class DeepSeekDecoderLayer(PreNormDecoderLayer):
    def __init__(self, cfg: DeepSeekV32Config, layer_idx: int, ops: ModuleType, absorb_decode: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.self_attn = DeepSeekMLA(cfg, ops, absorb_decode)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        if cfg.layer_mlp_types[layer_idx] == "dense":
            self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, ops)
        else:
            self.mlp = SparseMoE(cfg, ops)


class DeepSeekV32ForCausalLM(CausalLMBase):
    """DeepSeek-V3/V3.2 causal LM. ``forward(input_ids [T], positions [T], kv_caches, attn_meta) -> hidden [T, D]``.

    ``absorb_decode=False`` runs decode steps through the expanded path (the reference the
    absorbed path is tested against).
    """

    family_name = "deepseek-v3.2"  # registry name: ``.family``, ``from_pretrained`` refuses other families

    def __init__(self, config: DeepSeekV32Config, ops: ModuleType = raw_ops, absorb_decode: bool = True):
        layers = (DeepSeekDecoderLayer(config, i, ops, absorb_decode) for i in range(config.num_hidden_layers))
        super().__init__(config, ops, DecoderStack(config.vocab_size, config.hidden_size, config.rms_norm_eps, layers, ops))

    def make_cuda_decode_step(self, **options):
        """The batch-1 CUDA step of decode GEMVs chained by PDL (``cuda_decode.MlaCudaDecodeStep``) where it
        reproduces this model's module path, else None."""
        from torchinferno.models.deepseek_v32.cuda_decode import MlaCudaDecodeStep

        return MlaCudaDecodeStep(self, **options) if MlaCudaDecodeStep.supports(self) else None

    def rope_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [max_pos, rope_dim/2] fp32 for the rope part, YaRN attention factor folded in."""
        c = self.config
        return rope_cos_sin(c.qk_rope_head_dim, c.rope_theta, c.max_position_embeddings, c.rope_scaling)
