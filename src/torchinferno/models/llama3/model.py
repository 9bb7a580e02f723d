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
from torchinferno.models.common.causal_lm import CausalLMBase, DecoderStack, PreNormDecoderLayer
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


class Llama3DecoderLayer(PreNormDecoderLayer):
    def __init__(self, cfg: Llama3Config, ops: ModuleType, backend: type[nn.Module]):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.self_attn = Llama3Attention(cfg, ops, backend)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, ops, bias=cfg.mlp_bias)


class Llama3ForCausalLM(CausalLMBase):
    """Llama-3 causal LM. ``forward(input_ids [T], positions [T], kv_caches, attn_meta) -> hidden [T, D]``."""

    family_name = "llama3"  # registry name: ``.family``, ``from_pretrained`` refuses other families

    def __init__(self, config: Llama3Config, ops: ModuleType = raw_ops, attention_backend: type[nn.Module] = TorchAttention):
        layers = (Llama3DecoderLayer(config, ops, attention_backend) for _ in range(config.num_hidden_layers))
        super().__init__(config, ops, DecoderStack(config.vocab_size, config.hidden_size, config.rms_norm_eps, layers, ops))

    def rope_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        return rope_cos_sin(c.head_dim_, c.rope_theta, c.max_position_embeddings, c.rope_scaling)

    def prepare_rope(self, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype):
        return self.ops.prepare_rope(cos, sin, dtype)

    def make_cpu_decode_step(self):
        from torchinferno.models.llama3.cpu_decode import CpuDecodeStep

        return CpuDecodeStep(self) if CpuDecodeStep.supports(self) else None

    def make_cuda_decode_step(self, **options):
        from torchinferno.models.llama3.cuda_decode import CudaDecodeStep

        return CudaDecodeStep(self, **options) if CudaDecodeStep.supports(self) else None
