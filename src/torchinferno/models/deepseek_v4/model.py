"""DeepSeek-V4 on the family contract (see ``models/protocol.py``), equal to transformers' DeepseekV4ForCausalLM.

Per layer, around mHC hyper-connections (``hyper.py``): attention with q-LoRA, a weightless per-head q norm, one
shared K=V head (``kv_proj`` + ``kv_norm``), interleaved rope on the trailing ``qk_rope_head_dim`` dims (``main``
table for sliding layers, ``compress`` for CSA/HCA), a sliding window, the compressed entries of CSA/HCA layers
(``compressor.py``; CSA keeps only its indexer's top-k), a per-head sink logit, de-rotation of the output's rope
dims and the grouped low-rank output (``o_a_proj`` block-diagonal, ``o_b_proj``); then the MoE (hash- or
top-k-routed sqrt-softplus experts with clamped SwiGLU, one shared expert). Module names are transformers'.

Cache per layer (``family.kv_spec``), one row per token: ``kv [hd]`` (normed, rope'd K=V); compressed layers add
their compressor's raw projections ``ckv, cgate [c*hd]`` and ``centry [hd]`` (window w's entry, at the slot of its
last token (w+1)*m-1); CSA adds the indexer's ``ikv, igate [2*Di]``, ``ientry [Di]``. A forward reads the last
``sliding_window - 1`` kv rows, the stored entries, and pools only the windows closing in it, so any chunking /
prefix hit / preemption equals the full pass. In the engine the per-token rows are a sliding cache group
(``family.kv_spec``: blocks behind the window are freed, ``meta.block_tables`` / ``slot_mapping`` address them)
and the entries a whole-sequence group (``meta.entry_block_tables``; packed at one row per window where the block
size allows, addressed by ``protocol.packed_slot``). Decode-only batches of an ops module with ``STATIC_DECODE``
(v1) take ``decode.py`` instead: the same numbers from batch-fixed shapes and device tensors only (CUDA-graph
capturable), attention through ``kernels.sparse_sink_decode`` (Triton on CUDA). Prefill (and any eager step)
attends per sequence through ``kernels.sparse_sink_prefill``: the same Triton kernel, one row per query, where
``sparse_kernel`` is on; ``_attend`` (logits [H, Q, K] materialized) elsewhere and as its oracle.
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from torchinferno.kernels import sparse_sink_prefill as spp
from torchinferno.models.common.attention import write_kv
from torchinferno.models.common.attention_metadata import AttentionMetadata
from torchinferno.models.common.causal_lm import CausalLMBase, DecoderStack
from torchinferno.models.common.module_utils import KeepFP32Tensors
from torchinferno.models.common.rope import (
    RopeScaling,
    default_inv_freq,
    rope_cos_sin,
    yarn_inv_freq,
)
from torchinferno.models.deepseek_v4 import decode, raw_ops
from torchinferno.models.deepseek_v4.compressor import (
    Compressor,
    V4RMSNorm,
    rope_tail,
    visible_entries,
)
from torchinferno.models.deepseek_v4.config import CSA, SLIDING, DeepSeekV4Config
from torchinferno.models.deepseek_v4.hyper import (
    HyperConnection,
    HyperHead,
    unweighted_rms_norm,
)
from torchinferno.models.protocol import packed_slot


def cache_layout(cfg: DeepSeekV4Config, layer_type: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Per-token cache tensors of one layer (names and shapes), in the order the layer reads them."""
    out: tuple[tuple[str, tuple[int, ...]], ...] = (("kv", (cfg.head_dim,)),)
    if layer_type == SLIDING:
        return out
    c = 2 if layer_type == CSA else 1
    out += (("ckv", (c * cfg.head_dim,)), ("cgate", (c * cfg.head_dim,)), ("centry", (cfg.head_dim,)))
    if c == 2:
        out += (("ikv", (2 * cfg.index_head_dim,)), ("igate", (2 * cfg.index_head_dim,)), ("ientry", (cfg.index_head_dim,)))
    return out


def gather_positions(cache: torch.Tensor, block_row: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """cache [blocks, bs, *S], one sequence's block table row, positions [N] -> rows [N, *S]."""
    bs = cache.shape[1]
    return cache[block_row[positions // bs].long(), positions % bs]


class GroupedLinear(nn.Linear):
    """Block-diagonal linear: x [N, G, K] -> [N, G, M] with weight [G*M, K] (group g uses rows g*M..g*M+M-1)."""

    def __init__(self, in_per_group: int, out_features: int, groups: int):
        super().__init__(in_per_group, out_features, bias=False)
        self.groups = groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.view(self.groups, -1, x.shape[-1])  # [G, M, K]
        return torch.einsum("ngk,gmk->ngm", x, w)


class V4Attention(KeepFP32Tensors, nn.Module):
    fp32_tensors = ("sinks",)  # fp32 in a bf16 model, as transformers keeps it

    def __init__(self, cfg: DeepSeekV4Config, layer_type: str, ops: ModuleType = raw_ops):
        super().__init__()
        H, hd = cfg.num_attention_heads, cfg.head_dim
        self.ops = ops
        # decode-only batches through decode.py (static shapes, no host sync) where the ops module opts in
        self.static_decode = bool(getattr(ops, "STATIC_DECODE", False))
        # ... with the Triton sparse-sink kernel on CUDA (kernels.v4_artifacts.apply may turn it off / give configs)
        self.sparse_kernel = bool(getattr(ops, "SPARSE_SINK_DECODE", False))
        self.kernel_config: dict | None = None
        self.batch_invariant = False  # set by kernels.batch_invariant: decode stays per sequence (the eager path)
        self.cfg, self.layer_type, self.num_heads, self.head_dim = cfg, layer_type, H, hd
        self.rope_kind = "main" if layer_type == SLIDING else "compress"
        self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=False)
        self.q_a_norm = V4RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, H * hd, bias=False)
        self.kv_proj = nn.Linear(cfg.hidden_size, hd, bias=False)
        self.kv_norm = V4RMSNorm(hd, cfg.rms_norm_eps)
        self.o_a_proj = GroupedLinear(H * hd // cfg.o_groups, cfg.o_groups * cfg.o_lora_rank, cfg.o_groups)
        self.o_b_proj = nn.Linear(cfg.o_groups * cfg.o_lora_rank, cfg.hidden_size, bias=False)
        self.sinks = nn.Parameter(torch.zeros(H, dtype=torch.float32))
        self.compressor = None if layer_type == SLIDING else Compressor(cfg, layer_type)
        if self.compressor is not None and self.compressor.indexer is not None:
            # CSA indexer scores through kernels.indexer_scores (Triton on CUDA) where the ops module opts in
            self.compressor.indexer.score_kernel = bool(getattr(ops, "INDEXER_SCORES_KERNEL", False))
        self.scale = hd**-0.5

    @property
    def supports_cuda_graphs(self) -> bool:
        """A decode step reads only device tensors with batch-fixed shapes (``decode.py``): capturable."""
        return self.static_decode and not self.batch_invariant

    def forward(self, h, positions, rope, kv_cache, meta: AttentionMetadata | None):
        """h [T, D]; rope: dict kind -> (cos, sin) full tables [max_pos, r/2]; -> [T, D]."""
        T, H, hd = h.shape[0], self.num_heads, self.head_dim
        cos_t, sin_t = rope[self.rope_kind]
        cos, sin = cos_t[positions], sin_t[positions]  # [T, r/2]
        q_res = self.q_a_norm(self.q_a_proj(h))  # [T, q_lora]
        q = rope_tail(unweighted_rms_norm(self.q_b_proj(q_res).view(T, H, hd), self.cfg.rms_norm_eps), cos, sin)
        kv = rope_tail(self.kv_norm(self.kv_proj(h))[:, None], cos, sin)[:, 0]  # [T, hd]
        raw = {"kv": kv}
        comp = self.compressor
        if comp is not None:
            raw["ckv"], raw["cgate"] = comp.project(h)
            if comp.indexer is not None:
                raw["ikv"], raw["igate"] = comp.indexer.project(h)
        caches = None
        if kv_cache is not None and meta is not None:
            caches = {name: t for (name, _), t in zip(cache_layout(self.cfg, self.layer_type), kv_cache)}
            if self.static_decode and not self.batch_invariant and meta.is_decode and T == len(meta.query_lens_list):
                out = decode.decode_attention(self, q, q_res, h, raw, positions, rope, caches, meta)
                return self._output(out, cos, sin)
            for name, r in raw.items():
                write_kv(caches[name], r, meta.slot_mapping, meta.has_padding)
        out = q.new_empty(T, H, hd)
        for b, (s, qlen, ctx) in enumerate(AttentionMetadata.spans_of(meta, T)):
            if ctx and caches is None:
                raise ValueError(f"sequence {b} has {ctx} context tokens but no KV cache was passed")
            seq = _SeqView(raw, caches, meta, b, s, qlen, ctx)
            lo = max(0, ctx - self.cfg.sliding_window + 1)  # oldest key any of these queries sees in the window
            keys = seq.rows("kv", lo, ctx + qlen)
            ent = vis = None
            if comp is not None:
                cos_c, sin_c = rope["compress"]
                pos = positions[s : s + qlen]
                ent = seq.entries(comp, "ckv", "cgate", "centry", cos_c, sin_c)
                vis = visible_entries(pos, ent.shape[0], comp.rate)
                if comp.indexer is not None:
                    ikeys = seq.entries(comp.indexer, "ikv", "igate", "ientry", cos_c, sin_c)
                    vis = comp.indexer.select(h[s : s + qlen], q_res[s : s + qlen], cos_c[pos], sin_c[pos], ikeys, vis,
                                              limits=(pos + 1) // comp.rate)  # visible_entries' rule, by position
            out[s : s + qlen] = self._attend_sparse(q[s : s + qlen], positions[s : s + qlen], keys, lo, ent, vis)
        return self._output(out, cos, sin)

    def _output(self, out, cos, sin):
        """out [T, H, hd] -> [T, D]: undo the rope V picked up (K = V) at the query position, grouped low-rank out."""
        out = rope_tail(out, cos, -sin)
        grouped = self.o_a_proj(out.reshape(out.shape[0], self.cfg.o_groups, -1)).flatten(1)
        return self.o_b_proj(grouped)

    def _attend(self, q, pos, keys, lo: int, ent, vis):
        """One sequence: q [Q, H, hd] at positions pos [Q]; keys [S - lo, hd] = K=V rows of positions lo..S-1;
        ent [n, hd] compressed entries with their visibility/selection vis [Q, n] (None: sliding only) -> [Q, H, hd].
        Materializes the logits [H, Q, K]: the torch path and the oracle (``kernels.sparse_sink_prefill.reference``)."""
        return spp.reference(q, pos, keys, lo, ent, vis, self.sinks, self.scale, self.cfg.sliding_window)

    def _attend_sparse(self, q, pos, keys, lo: int, ent, vis):
        """``_attend`` through ``kernels.sparse_sink_prefill``: the Triton kernel on CUDA where the decode kernel is
        used (``sparse_kernel``, not batch-invariant), no [H, Q, K] logits; ``_attend`` itself elsewhere."""
        comp = self.compressor
        width = None
        if ent is not None and comp is not None and comp.indexer is not None:
            width = min(comp.indexer.topk, ent.shape[0])  # CSA: at most top-k true columns per row
        return spp.sparse_sink_prefill(q, pos, keys, lo, ent, vis, self.sinks, self.scale, self.cfg.sliding_window,
                                       use_triton=self.sparse_kernel and not self.batch_invariant, width=width)


class _SeqView:
    """One sequence's rows of this forward: fresh ones for its new tokens, cached ones before them.

    ``rows(name, a, b)`` -> rows of positions a..b-1; ``entries(...)`` -> every closed window's compressed entry:
    the ones closed before this forward read from the cache (slot of each window's last token), the ones closing
    now pooled from raw rows and written there.
    """

    def __init__(self, raw, caches, meta, b, s, qlen, ctx):
        self.raw, self.caches, self.meta, self.s, self.qlen, self.ctx = raw, caches, meta, s, qlen, ctx
        # per-token rows: the (sliding-group) table; entries: the whole-sequence table (the same one unless hybrid)
        self.block_row = None if caches is None else meta.block_tables[b]
        self.entry_row = None if caches is None else meta.entry_block_tables[b]

    def rows(self, name: str, a: int, b: int) -> torch.Tensor:
        fresh = self.raw[name]
        if a >= self.ctx:
            return fresh[self.s + a - self.ctx : self.s + b - self.ctx]
        pos = torch.arange(a, b, device=fresh.device)
        return gather_positions(self.caches[name], self.block_row, pos).to(fresh.dtype)

    def _entry_slots(self, name: str, closing: torch.Tensor) -> torch.Tensor:
        """Flat rows of the entries closing at positions ``closing`` (a packed tensor keeps fewer rows per block)."""
        bs = self.meta.block_size
        return packed_slot(self.entry_row[closing // bs], closing, bs, self.caches[name].shape[1])

    def _entry_rows(self, name: str, closing: torch.Tensor) -> torch.Tensor:
        return self.caches[name].flatten(0, 1)[self._entry_slots(name, closing)]

    def entries(self, pooler, kv_name: str, gate_name: str, entry_name: str, cos, sin) -> torch.Tensor:
        m, S = pooler.rate, self.ctx + self.qlen
        n_old, n_all = self.ctx // m, S // m
        dev = self.raw[kv_name].device
        parts = []
        if n_old:
            closing = (torch.arange(n_old, device=dev) + 1) * m - 1
            parts.append(self._entry_rows(entry_name, closing).to(self.raw[kv_name].dtype))
        if n_all > n_old:
            start = n_old - 1 if (pooler.overlap and n_old > 0) else n_old
            new = pooler.entries(self.rows(kv_name, start * m, n_all * m), self.rows(gate_name, start * m, n_all * m),
                                 cos, sin, first=start)[n_old - start :]
            if self.caches is not None:
                closing = (torch.arange(n_old, n_all, device=dev) + 1) * m - 1  # positions
                write_kv(self.caches[entry_name], new, self._entry_slots(entry_name, closing))
                new = new.to(self.caches[entry_name].dtype).to(new.dtype)  # as later forwards will read it
            parts.append(new)
        if not parts:
            return self.raw[kv_name].new_zeros((0, pooler.dim))
        return torch.cat(parts) if len(parts) > 1 else parts[0]


class SharedExpert(nn.Module):
    def __init__(self, hidden: int, inter: int, limit: float):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.limit = limit

    def forward(self, x):
        g = self.gate_proj(x).clamp(max=self.limit)
        u = self.up_proj(x).clamp(min=-self.limit, max=self.limit)
        return self.down_proj(F.silu(g) * u)


class Router(KeepFP32Tensors, nn.Module):
    """sqrt(softplus) scores; top-k on scores + ``e_score_correction_bias`` (kept fp32) or, hash-routed, ``tid2eid[token]``."""

    fp32_tensors = ("e_score_correction_bias",)

    def __init__(self, cfg: DeepSeekV4Config, hashed: bool):
        super().__init__()
        self.hashed, self.top_k, self.scaling = hashed, cfg.num_experts_per_tok, cfg.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(cfg.n_routed_experts, cfg.hidden_size))
        nn.init.normal_(self.weight, std=0.02)
        self.row_tile: int | None = None  # set by kernels.batch_invariant: the gate GEMM on fixed row tiles
        if hashed:
            self.register_buffer("tid2eid", torch.zeros(cfg.vocab_size, cfg.num_experts_per_tok, dtype=torch.long))
        else:
            self.register_buffer("e_score_correction_bias", torch.zeros(cfg.n_routed_experts, dtype=torch.float32))

    def forward(self, x, input_ids):
        """x [T, D], input_ids [T] -> (weights [T, k], expert ids [T, k])."""
        from torchinferno.kernels.batch_invariant import tiled_linear

        scores = F.softplus(tiled_linear(x, self.weight, self.row_tile)).sqrt()
        if self.hashed:
            ids = self.tid2eid[input_ids].long()
        else:
            ids = torch.topk(scores + self.e_score_correction_bias, self.top_k, dim=-1, sorted=False).indices
        w = scores.gather(1, ids)
        return w / (w.sum(dim=-1, keepdim=True) + 1e-20) * self.scaling, ids


class Experts(nn.Module):
    """gate_up_proj [E, 2I, D] (gate rows first), down_proj [E, D, I]; clamped SwiGLU; loop over hit experts."""

    def __init__(self, cfg: DeepSeekV4Config, ops: ModuleType):
        super().__init__()
        E, D, I = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, D))
        self.down_proj = nn.Parameter(torch.empty(E, D, I))
        nn.init.normal_(self.gate_up_proj, std=0.02)
        nn.init.normal_(self.down_proj, std=0.02)
        self.limit, self.ops = cfg.swiglu_limit, ops
        self.moe_backend = "auto"  # "torch": the reference loop even where the ops module fuses (moe.set_moe_backend)

    def forward(self, x, ids, weights):
        if self.moe_backend == "torch":
            from torchinferno.models.deepseek_v4 import raw_ops

            return raw_ops.clamped_experts(x, ids, weights, self.gate_up_proj, self.down_proj, self.limit)
        return self.ops.clamped_experts(x, ids, weights, self.gate_up_proj, self.down_proj, self.limit)


class V4MoE(nn.Module):
    def __init__(self, cfg: DeepSeekV4Config, hashed: bool, ops: ModuleType):
        super().__init__()
        self.gate = Router(cfg, hashed)
        self.experts = Experts(cfg, ops)
        self.shared_experts = SharedExpert(cfg.hidden_size, cfg.moe_intermediate_size, cfg.swiglu_limit)

    def forward(self, x, input_ids):
        w, ids = self.gate(x, input_ids)
        return self.experts(x, ids, w) + self.shared_experts(x)


class V4DecoderLayer(nn.Module):
    def __init__(self, cfg: DeepSeekV4Config, i: int, ops: ModuleType):
        super().__init__()
        args = (cfg.hc_mult, cfg.hidden_size, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_norm_eps)
        self.attn_hc, self.ffn_hc = HyperConnection(*args), HyperConnection(*args)
        self.input_layernorm = V4RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = V4Attention(cfg, cfg.layer_types[i], ops)
        self.post_attention_layernorm = V4RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = V4MoE(cfg, cfg.mlp_layer_types[i] == "hash_moe", ops)

    def forward(self, x, input_ids, positions, rope, kv_cache, meta):
        """x [T, n, D] streams -> [T, n, D]."""
        post, comb, h = self.attn_hc(x)
        a = self.self_attn(self.input_layernorm(h), positions, rope, kv_cache, meta)
        x = HyperConnection.expand(x, a, post, comb)
        post, comb, h = self.ffn_hc(x)
        m = self.mlp(self.post_attention_layernorm(h), input_ids)
        return HyperConnection.expand(x, m, post, comb)


class DeepSeekV4ForCausalLM(CausalLMBase):
    """DeepSeek-V4 causal LM. ``forward(input_ids [T], positions [T], kv_caches, attn_meta) -> hidden [T, D]``."""

    family_name = "deepseek-v4"

    def __init__(self, config: DeepSeekV4Config, ops: ModuleType = raw_ops):
        layers = (V4DecoderLayer(config, i, ops) for i in range(config.num_hidden_layers))
        stack = DecoderStack(config.vocab_size, config.hidden_size, config.rms_norm_eps, layers, ops)
        stack.norm = V4RMSNorm(config.hidden_size, config.rms_norm_eps)
        stack.hc_head = HyperHead(config.hc_mult, config.hidden_size, config.hc_eps, config.rms_norm_eps)
        super().__init__(config, ops, stack)

    def rope_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [max_pos, r] fp32: the ``main`` table's r/2 columns, then the ``compress`` table's."""
        c = self.config
        r = c.qk_rope_head_dim
        main_cos, main_sin = rope_cos_sin(r, c.rope_theta, c.max_position_embeddings, RopeScaling())
        s = c.compress_scaling
        if s.rope_type == "yarn":  # transformers forces attention_factor=1.0 for V4's compress rope
            inv, _ = yarn_inv_freq(r, c.compress_rope_theta, s)
        else:
            inv = default_inv_freq(r, c.compress_rope_theta)
        freqs = torch.outer(torch.arange(c.max_position_embeddings, dtype=torch.float32), inv.float())
        return torch.cat([main_cos, freqs.cos()], dim=-1), torch.cat([main_sin, freqs.sin()], dim=-1)

    def forward(self, input_ids, positions, kv_caches=None, attn_meta: AttentionMetadata | None = None):
        stages = self.pipeline_stages()  # the whole stack is one stage
        carry, ctx = stages.begin(input_ids, positions)
        for i, layer in enumerate(self.model.layers):
            carry = stages.layer(i, layer, carry, ctx, None if kv_caches is None else kv_caches[i], attn_meta)
        return stages.end(carry)

    def pipeline_stages(self) -> "HyperStreamStages":
        """How this forward splits at layer boundaries (parallel/pipeline.py): the mHC streams cross them."""
        return HyperStreamStages(self)


class HyperStreamStages:
    """deepseek-v4's forward in pieces (the protocol of ``parallel.pipeline.PreNormStages``): the carry is the mHC
    streams ``(x [T, n, D],)``; the context is the token ids (hash routing), positions and both rope tables."""

    def __init__(self, model: DeepSeekV4ForCausalLM):
        self.model = model

    def begin(self, input_ids, positions):
        m = self.model
        half = m.config.qk_rope_head_dim // 2
        rope = {"main": (m.rope_cos[:, :half], m.rope_sin[:, :half]),
                "compress": (m.rope_cos[:, half:], m.rope_sin[:, half:])}
        h = m.model.embed_tokens(input_ids)  # [T, D]
        x = h[:, None, :].expand(-1, m.config.hc_mult, -1).contiguous()  # [T, n, D]
        return (x,), (input_ids, positions, rope)

    def select(self, carry, ctx, t0, t1):
        return (carry[0][t0:t1],), (ctx[0][t0:t1], ctx[1][t0:t1], ctx[2])

    def empty_carry(self, carry):
        return (torch.empty_like(carry[0]),)

    def layer(self, i, module, carry, ctx, kv_cache, meta):
        return (module(carry[0], ctx[0], ctx[1], ctx[2], kv_cache, meta),)

    def end(self, carry):
        return self.model.model.norm(self.model.model.hc_head(carry[0]))


@torch.no_grad()
def randomize_untrained_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every tensor transformers initializes to a constant (sinks, hc bases/scales, position biases, norm
    weights, router bias, ``tid2eid``) random values, so an oracle comparison exercises them. In place."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("sinks", "base", "hc_base", "position_bias") or ("norm" in name and leaf == "weight"):
            offset = 1.0 if "norm" in name else 0.0
            p.copy_((torch.randn(p.shape, generator=g) * 0.5 + offset).to(p.dtype))
        elif leaf in ("scale", "hc_scale"):
            p.copy_((torch.rand(p.shape, generator=g) + 0.5).to(p.dtype))
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_((torch.randn(b.shape, generator=g) * 0.1).to(b.dtype))
        elif name.endswith("tid2eid"):
            E = model.config.n_routed_experts
            rows = [torch.randperm(E, generator=g)[: b.shape[1]] for _ in range(b.shape[0])]
            b.copy_(torch.stack(rows))
    return model
