"""Llama-3 model on the family contract (see ``models/protocol.py``).

Projections are merged (``qkv_proj``, ``gate_up_proj``) so one GEMM feeds attention and one
feeds the MLP; ``weights.py`` maps HF's separate tensors into the slices. The ops module and
the attention backend are chosen at construction and never patched afterwards.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from torchinferno.models.common.attention import TorchAttention
from torchinferno.models.common.attention_metadata import AttentionMetadata
from torchinferno.models.common.layers import GatedMLP, RMSNorm
from torchinferno.models.common.rope import rope_cos_sin
from torchinferno.models.llama3 import raw_ops
from torchinferno.models.llama3.config import Llama3Config


class Llama3Attention(nn.Module):
    def __init__(self, cfg: Llama3Config, ops: ModuleType, backend: type[nn.Module]):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim_
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.attention_bias)
        self.attn = backend(self.num_heads, self.num_kv_heads, self.head_dim**-0.5)
        self.ops = ops

    def forward(self, x, cos, sin, kv_cache, meta: AttentionMetadata | None):
        T = x.shape[0]
        qkv = self.qkv_proj(x)  # [T, (H + 2 Hkv) * hd]
        # Rotate queries and keys in one call: they are adjacent in the merged projection.
        qk = self.ops.rope(qkv[:, : self.q_size + self.kv_size].view(T, self.num_heads + self.num_kv_heads, self.head_dim), cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, self.q_size + self.kv_size :].view(T, self.num_kv_heads, self.head_dim)
        o = self.attn(q, k, v, kv_cache, meta)  # [T, H, hd]
        return self.o_proj(o.reshape(T, self.q_size))




class Llama3DecoderLayer(nn.Module):
    def __init__(self, cfg: Llama3Config, ops: ModuleType, backend: type[nn.Module]):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.self_attn = Llama3Attention(cfg, ops, backend)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, ops, bias=cfg.mlp_bias)

    def forward(self, x, residual, cos, sin, kv_cache, meta):
        # Residual stream carried un-normalized; each norm also performs the pending residual add.
        if residual is None:  # first layer: the residual stream starts as the embedding
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, cos, sin, kv_cache, meta)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class Llama3Model(nn.Module):
    def __init__(self, cfg: Llama3Config, ops: ModuleType, backend: type[nn.Module]):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Llama3DecoderLayer(cfg, ops, backend) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)


class Llama3ForCausalLM(nn.Module):
    """Llama-3 causal LM. ``forward(input_ids [T], positions [T], kv_caches, attn_meta) -> hidden [T, D]``."""

    def __init__(self, config: Llama3Config, ops: ModuleType = raw_ops, attention_backend: type[nn.Module] = TorchAttention):
        super().__init__()
        self.config = config
        self.ops = ops
        self.model = Llama3Model(config, ops, attention_backend)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # Optional runtime replacement of the logits projection (e.g. a pre-packed CPU linear);
        # set by kernels.cpu_linear.prepack_linears, never by the model itself.
        self.packed_head: nn.Module | None = None
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        self.init_buffers()

    def init_buffers(self) -> None:
        """(Re)compute non-persistent buffers (after ``to_empty`` from meta, or a device move)."""
        device = self.model.embed_tokens.weight.device
        if device.type == "meta":
            self.rope_cos = torch.empty(0, device="meta")
            self.rope_sin = torch.empty(0, device="meta")
            return
        c = self.config
        cos, sin = rope_cos_sin(c.head_dim_, c.rope_theta, c.max_position_embeddings, c.rope_scaling)
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)

    def head_weight(self) -> torch.Tensor:
        """[V, D] weight of the logits projection (the embedding when tied)."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @property
    def kv_layer_count(self) -> int:
        return len(self.model.layers)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, ...]] | None = None,
        attn_meta: AttentionMetadata | None = None,
    ) -> torch.Tensor:  # [T, D]
        h = self.model.embed_tokens(input_ids)
        cos, sin = self.ops.prepare_rope(self.rope_cos[positions], self.rope_sin[positions], h.dtype)  # [T, hd/2]
        residual = None
        for i, layer in enumerate(self.model.layers):
            h, residual = layer(h, residual, cos, sin, None if kv_caches is None else kv_caches[i], attn_meta)
        h, _ = self.model.norm(h, residual)
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, D] -> logits [N, V] in fp32."""
        if self.packed_head is not None:
            return self.packed_head(hidden).float()
        return torch.nn.functional.linear(hidden, self.head_weight()).float()
