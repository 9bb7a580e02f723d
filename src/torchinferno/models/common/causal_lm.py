"""The causal-LM skeleton every family shares: pre-norm decoder layers, the decoder stack, the head.

A family supplies its attention and MLP modules and its rope tables; everything else — the
residual stream, the layer loop, tied/untied/packed logits, fp32 rope buffers (moved with the
model, never cast, computed after a ``meta`` build), and the user API (``family``, ``generate``,
``save_pretrained`` / ``from_pretrained``: ``common/pretrained.py``) — lives here once, so a
runtime transformation (e.g. ``kernels.cpu_linear``'s packed head) works for every family.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable, Iterable

import torch
from torch import nn

from torchinferno.models.common.attention_metadata import AttentionMetadata
from torchinferno.models.common.layers import RMSNorm
from torchinferno.models.common.pretrained import PretrainedMixin


class PreNormDecoderLayer(nn.Module):
    """Subclasses set ``input_layernorm``, ``self_attn``, ``post_attention_layernorm`` and ``mlp``.

    The residual stream is carried un-normalized; each norm also performs the pending residual
    add: ``(x, residual) -> (mlp_out, residual)``, ``residual=None`` on the first layer.
    """

    def forward(self, x, residual, cos, sin, kv_cache, meta):
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, cos, sin, kv_cache, meta)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class DecoderStack(nn.Module):
    """``embed_tokens``, ``layers``, final ``norm`` (HF's ``model.*`` names)."""

    def __init__(self, vocab_size: int, hidden: int, eps: float, layers: Iterable[nn.Module], ops: ModuleType):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, hidden)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(hidden, eps, ops)


class CausalLMBase(PretrainedMixin, nn.Module):
    """``forward(input_ids [T], positions [T], kv_caches, attn_meta) -> hidden [T, D]``;
    ``compute_logits(hidden [N, D]) -> [N, V]`` fp32.

    Subclasses call ``__init__`` with their ``DecoderStack``, set ``family_name`` (their registry
    name) and implement ``rope_tables()`` -> ``(cos, sin)`` fp32 ``[max_pos, rope_dim / 2]``; they may
    override ``prepare_rope``. ``Model(config)`` is a usable randomly initialized model on the
    current default device; the rope buffers are fp32 tables on the model's device after every
    ``.to()`` / ``to_empty`` (never cast to the weights' dtype).
    """

    def __init__(self, config, ops: ModuleType, stack: DecoderStack):
        super().__init__()
        self.config = config
        self.ops = ops
        self.model = stack
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # Optional runtime replacement of the logits projection (e.g. a pre-packed CPU linear);
        # set by kernels.cpu_linear.prepack_linears, never by the model itself.
        self.packed_head: nn.Module | None = None
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        self.init_buffers()

    def rope_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _apply(self, fn, recurse=True):
        """Every ``.to()`` / ``.cuda()`` / ``to_empty``: the rope tables move with the model but are never
        cast (they stay fp32); tables still empty from a ``meta`` build are computed on the real device."""
        rope = (self.rope_cos, self.rope_sin)

        def keep_rope_fp32(t: torch.Tensor) -> torch.Tensor:
            out = fn(t)
            if (t is rope[0] or t is rope[1]) and out.dtype != t.dtype:
                return t.to(device=out.device)
            return out

        super()._apply(keep_rope_fp32, recurse)
        if self.rope_cos.numel() == 0 and self.rope_cos.device.type != "meta":
            self.init_buffers()
        return self

    def prepare_rope(self, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype):
        """Once per forward: turn the gathered fp32 tables into what every layer consumes."""
        return cos, sin

    def init_buffers(self) -> None:
        """(Re)compute non-persistent buffers (after ``to_empty`` from meta, or a device move)."""
        device = self.model.embed_tokens.weight.device
        if device.type == "meta":
            self.rope_cos = torch.empty(0, device="meta")
            self.rope_sin = torch.empty(0, device="meta")
            return
        cos, sin = self.rope_tables()
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)

    def make_cpu_decode_step(self) -> Callable[..., torch.Tensor | None] | None:
        """A family's lean CPU decode step for this model as built and loaded, or None (the default).

        A step is called as ``step(input_ids, positions, kv_caches, attn_meta)`` and returns the hidden states, or
        None for a batch it does not handle; it may offer ``compute_logits(hidden)`` (None: not handled). The model
        never installs it: runners wrap the model with ``models.common.step_model.step_model`` once."""
        return None

    def make_cuda_decode_step(self, **options) -> Callable[..., torch.Tensor | None] | None:
        """A family's fused CUDA decode step for this model as built and loaded, or None (the default); see
        :meth:`make_cpu_decode_step`."""
        return None

    def head_weight(self) -> torch.Tensor:
        """[V, D] weight of the logits projection (the embedding when tied); needs an unswapped head."""
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
        cos, sin = self.prepare_rope(self.rope_cos[positions], self.rope_sin[positions], h.dtype)  # [T, r/2]
        residual = None
        for i, layer in enumerate(self.model.layers):
            h, residual = layer(h, residual, cos, sin, None if kv_caches is None else kv_caches[i], attn_meta)
        h, _ = self.model.norm(h, residual)
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, D] -> logits [N, V] in fp32."""
        if self.packed_head is not None:
            return self.packed_head(hidden).float()
        if self.lm_head is not None:  # a module call, so a runtime-swapped head (FP8, NVFP4) works too
            return self.lm_head(hidden).float()
        return torch.nn.functional.linear(hidden, self.model.embed_tokens.weight).float()
