"""Lean CPU decode step of llama3: the module path's ops for one new token per sequence, without the module tree.

A small model's CPU decode step is dominated by host cost between ops (module calls, ops-module
and kernel dispatch indirections, per-layer attention bookkeeping) beside its GEMVs. This step
runs the same ATen ops in the same order as ``Llama3ForCausalLM.forward`` with the ``fused`` ops
and :class:`TorchAttention` (so its hidden states are bitwise those of the module path) from
weights extracted once, with the decode attention's cache views planned once per step instead
of once per layer.

It is a step backend (``make_cpu_decode_step``; a runner wraps the model with it once,
``models/common/step_model``): it reads the modules' tensors when built, so build it after
weights are loaded and linears packed. Anything but a CPU decode batch returns ``None`` and the
caller runs the module path.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from torchinferno.kernels import api, cpu_decode_step
from torchinferno.kernels.cpu_linear import PackedLinear
from torchinferno.models.common.attention import DenseRowViews, TorchAttention, _dense_first_row
from torchinferno.models.common.attention_metadata import AttentionMetadata
from torchinferno.models.common.decode_step import LeanDecodeStepBase
from torchinferno.models.llama3 import fused_ops

Linear = Callable[[torch.Tensor], torch.Tensor]  # x [T, K] -> [T, N]


def _linear(mod: nn.Module) -> Linear:
    """The GEMV of an ``nn.Linear`` or :class:`PackedLinear` as a plain call on a 2-D input."""
    if isinstance(mod, PackedLinear):
        return mod.gemv  # its kernel's call, without forward's padding (the step pads once, to min_rows)
    if isinstance(mod, nn.Linear):
        w, b = mod.weight, mod.bias
        return lambda x: F.linear(x, w, b)
    raise TypeError(f"not a linear: {type(mod).__name__}")


class _Layer:
    """One decoder layer's tensors and GEMVs (attention + MLP), extracted from the modules."""

    __slots__ = ("in_norm", "post_norm", "qkv", "o", "gate_up", "down", "attn")

    def __init__(self, layer: nn.Module):
        a = layer.self_attn
        self.in_norm: torch.Tensor = layer.input_layernorm.weight  # [D]
        self.post_norm: torch.Tensor = layer.post_attention_layernorm.weight  # [D]
        self.qkv, self.o = _linear(a.qkv_proj), _linear(a.o_proj)
        self.gate_up, self.down = _linear(layer.mlp.gate_up_proj), _linear(layer.mlp.down_proj)
        self.attn: TorchAttention = a.attn


class CpuDecodeStep(LeanDecodeStepBase):
    """``(input_ids [B], positions [B], kv_caches, meta) -> hidden [B, D]`` (pre-head) or ``None``.

    ``None`` unless every sequence adds exactly one token on CPU with a cache; the attention of
    each layer reads strided views of the dense cache rows when sequence b's context is the head
    of block ``r0 + b``, all of one length and the cache is in the attention's compute dtype, and
    otherwise runs :meth:`TorchAttention._decode` itself.
    """

    device_type = "cpu"
    # LeanStepModel runs a mixed step's leading decode rows here and only the other rows through the modules
    splits_mixed = True

    def __init__(self, model: nn.Module, native: bool | None = None):
        super().__init__(model)
        self.model = model
        self.layers = [_Layer(layer) for layer in model.model.layers]
        linears = [m for m in model.modules() if isinstance(m, (nn.Linear, PackedLinear))]
        # PackedLinear's padding (oneDNN: MIN_ROWS, ours: 1), as this step's GEMVs skip its forward; a
        # kernel whose rows do not depend on M gives the same rows at any larger padding.
        packed = all(isinstance(m, PackedLinear) for m in linears)
        self.min_rows = max((m.min_rows for m in linears), default=1) if packed else 1
        # the whole step in one C call when every linear is ours (``native=False``: always the ops below; None:
        # kernels.cpu_decode_step.default_step())
        native = cpu_decode_step.default_step() == "native" if native is None else native
        self.native = self._native_step(model) if native else None
        # the native step reads a cache of the activation dtype directly (models/common/step_model.cpu_kv_cache_dtype)
        self.kv_cache_dtype = torch.bfloat16 if self.native is not None else None

    def _native_step(self, model: nn.Module) -> cpu_decode_step.NativeDecodeStep | None:
        """The C step (kernels/cpu_decode_step.c) over this model's packed weights, or None: a linear not on our
        bf16 / GGUF-block kernels, activations not bf16, an activation other than SiLU, or the kernel unavailable."""
        if self.embed.dtype != torch.bfloat16 or getattr(model.config, "hidden_act", "silu") != "silu":
            return None
        if not cpu_decode_step.NativeDecodeStep.supported(torch.float32, self.head_dim):
            return None
        layers = []
        for layer in model.model.layers:
            a, mlp = layer.self_attn, layer.mlp
            specs = [cpu_decode_step.linear_spec(m) for m in (a.qkv_proj, a.o_proj, mlp.gate_up_proj, mlp.down_proj)]
            if any(s is None for s in specs):
                return None
            norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
            if any(w.dtype != torch.bfloat16 or not w.is_contiguous() for w in norms):
                return None
            layers.append(cpu_decode_step.LayerTensors(*norms, *specs))
        fn = cpu_decode_step.load()
        if fn is None or not self.final_norm.is_contiguous():
            return None
        return cpu_decode_step.NativeDecodeStep(
            fn, layers, self.final_norm, heads=self.num_heads, kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            inter=layers[0].down[4], eps=self.eps, scale=self.scale)

    @staticmethod
    def supports(model: nn.Module) -> bool:
        """The module path this step reproduces: fused ops, torch attention, CPU, one dtype for all norms."""
        layers = getattr(getattr(model, "model", None), "layers", None)
        if not layers or model.ops is not fused_ops or model.model.embed_tokens.weight.device.type != "cpu":
            return False
        dtype = model.model.embed_tokens.weight.dtype
        norms = [model.model.norm.weight] + [w for layer in layers for w in
                                            (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)]
        return (all(type(layer.self_attn.attn) is TorchAttention for layer in layers)
                and all(w.dtype == dtype for w in norms))

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 kv_caches: list[tuple[torch.Tensor, ...]] | None, meta: AttentionMetadata | None) -> torch.Tensor | None:
        if kv_caches is None or meta is None or not meta.query_lens_list or not meta.is_decode or input_ids.device.type != "cpu":
            return None
        B, H, Hkv, hd, D = input_ids.shape[0], self.num_heads, self.num_kv_heads, self.head_dim, self.hidden
        x = F.embedding(input_ids, self.embed)  # [B, D]
        cos, sin = api.rotary_tables_neox(self.model.rope_cos[positions], self.model.rope_sin[positions], x.dtype)
        k0 = kv_caches[0][0]
        if (self.native is not None and not meta.has_padding and k0.is_contiguous() and kv_caches[0][1].is_contiguous()
                and self.native.supported(k0.dtype, hd) and k0.dtype == kv_caches[0][1].dtype):
            # one C call for every layer (cos/sin [B, 1, hd] contiguous; tables and lengths int32 on the host)
            return self.native(x, cos, sin, meta.block_tables, meta.seq_lens, kv_caches)
        cdt = TorchAttention.compute_dtype(x)
        gqa = H != Hkv
        lens = meta.seq_lens_list
        length = max(lens)
        k0, v0 = kv_caches[0]
        r0 = None
        if min(lens) == length and not meta.has_padding and k0.dtype == cdt and v0.dtype == cdt:
            r0 = _dense_first_row(meta.block_tables_host, length, k0, v0, meta.contiguous)
        views = DenseRowViews.plan(k0, v0, r0, B, length) if r0 is not None else None  # planned once for every layer
        eps, norm_shape, nqk, qk_cols = self.eps, (2 * D,), H + Hkv, (H + Hkv) * hd
        layer_norm, cat, addcmul, sdpa, scale = torch.layer_norm, torch.cat, torch.addcmul, F.scaled_dot_product_attention, self.scale
        # The residual stream and every GEMV input carry at least min_rows rows, zero rows padding
        # a smaller batch once per step instead of once per GEMV (PackedLinear pads to the same M,
        # so the products are the module path's; every other op is row-wise).
        rows = max(B, self.min_rows)
        if rows > B:
            x = cat((x, x.new_zeros(rows - B, D)))  # [rows, D]
        o_pad = x.new_zeros(rows, H * hd)  # attention output rows -> o_proj
        o_in = o_pad[:B].view(B, H, hd)
        # The residual stream h is kept as LayerNorm's input [h, -h] (kernels.add_rms_norm's CPU
        # form): one in-place addcmul with [1, -1] adds a sublayer's output x to both halves (the
        # same roundings as h + x and its negation), replacing an add, a neg and a cat per norm.
        hh = cat((x, x.neg()), -1)  # [rows, 2D]
        hh2 = hh.view(rows, 2, D)
        signs = torch.tensor([[1.0], [-1.0]], dtype=x.dtype)  # [2, 1]
        x = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            if x is not None:
                addcmul(hh2, x.unsqueeze(1), signs, out=hh2)  # residual += mlp output
            h = layer_norm(hh, norm_shape, None, None, eps)[:, :D] * layer.in_norm
            qkv = layer.qkv(h)  # [rows, (H + 2 Hkv) hd]
            qk = qkv[:B, :qk_cols].view(B, nqk, hd)
            # kernels.rotary_neox with full-width tables; swapping the halves by flip == roll by hd / 2
            qk = addcmul(qk * cos, qk.view(B, nqk, 2, hd // 2).flip(2).view(B, nqk, hd), sin)
            q, k = qk[:, :H], qk[:, H:]
            v = qkv[:B, qk_cols:].view(B, Hkv, hd)
            if views is None:
                o_in.copy_(layer.attn._decode(q, k, v, (k_cache, v_cache), meta, gqa, cdt))
            else:
                views.write(k_cache, v_cache, k, v)
                kb, vb = views.read(k_cache, v_cache)  # [B, Hkv, L, hd]
                o = sdpa(q.view(B, H, 1, hd).to(cdt), kb, vb, attn_mask=None, scale=scale, enable_gqa=gqa)
                o_in.copy_(o.view(B, H, hd))  # cast to the activation dtype
            addcmul(hh2, layer.o(o_pad).unsqueeze(1), signs, out=hh2)  # residual += attention output
            # post-attention norm, then the SwiGLU MLP
            h = layer_norm(hh, norm_shape, None, None, eps)[:, :D] * layer.post_norm
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = layer.down(F.silu(gate) * up)
        addcmul(hh2, x.unsqueeze(1), signs, out=hh2)
        return layer_norm(hh[:B], norm_shape, None, None, eps)[:, :D] * self.final_norm
