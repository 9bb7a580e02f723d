"""Fused batch-1 CUDA decode step of llama3: five kernels per layer instead of ~14, chained by PDL.

The module path of a one-token step launches, per layer: add+RMSNorm, qkv GEMV, rotary, KV
append, two attention kernels, o GEMV, add+RMSNorm, gate/up GEMV, SwiGLU, down GEMV (plus
cuBLAS split-K reductions). At batch 1 every GEMV is a pure weight stream, so the gaps and tails
between those launches are a fifth of the step. This step runs the same math as
``Llama3ForCausalLM.forward`` with the ``fused`` ops and ``TritonPagedAttention`` in:

    qkv GEMV  (prologue: RMSNorm; epilogue: rotary, K/V stored in the paged cache)
    paged decode attention (split-K; the last split program of each kv head merges)
    o GEMV  (epilogue: residual add: it writes the next residual stream)
    gate/up GEMV (prologue: RMSNorm; epilogue: SwiGLU)
    down GEMV  (epilogue: residual add)

(``kernels/triton/decode_gemv.py``), each launched with programmatic dependent launch on Hopper
so a kernel streams its first weight tile while the previous one drains. The unfused path's
roundings are kept (residual sums, GEMV outputs, rotated q/k, SwiGLU output) except one: the
normalized GEMV input is consumed in fp32 instead of being rounded to bf16 first; with the GEMVs'
summation order (vs cuBLAS) that is the whole difference (tested against the module path).

Like ``cpu_decode`` it is a step backend (``make_cuda_decode_step``; the engine's runner and bench-gpu wrap the
model with it once, ``models/common/step_model``): it reads
the modules' tensors when built, so build it after weights are loaded and after any linear swap.
Anything but a one-sequence, one-token CUDA step returns ``None`` and the module path runs.
"""

from __future__ import annotations

import torch
from torch import nn

from torchinferno.kernels import api as kapi
from torchinferno.kernels import triton as tri  # dispatch only: importing it never imports Triton
from torchinferno.models.common.attention_metadata import AttentionMetadata
from torchinferno.models.common.decode_step import LeanDecodeStepBase, gemv_logits
from torchinferno.models.llama3 import fused_ops

# GEMV launch tiles per linear (a sweep on an H200: benchmarks/probe_decode_gemv.py).
DEFAULT_CONFIGS: dict[str, dict] = {
    "qkv": {"block_n": 4, "block_k": 2048, "num_warps": 4, "num_stages": 3, "early_launch": True},
    "o": {"block_n": 4, "block_k": 2048, "num_warps": 4, "num_stages": 3, "early_launch": True},
    "gate_up": {"block_n": 8, "block_k": 1024, "num_warps": 4, "num_stages": 2, "early_launch": True},
    "down": {"block_n": 4, "block_k": 2048, "num_warps": 4, "num_stages": 3, "early_launch": True},
    "head": {"block_n": 4, "block_k": 2048, "num_warps": 4, "num_stages": 3, "early_launch": False},
    # decode attention: splits of at least this many tokens, about `waves` waves of programs, and kernel tiling
    # overrides (block_n, num_warps, ...)
    "attention": {"min_split_tokens": 64, "waves": 2},
}


class _Layer:
    __slots__ = ("in_norm", "post_norm", "qkv", "o", "gate_up", "down")

    def __init__(self, layer: nn.Module):
        a = layer.self_attn
        self.in_norm: torch.Tensor = layer.input_layernorm.weight  # [D]
        self.post_norm: torch.Tensor = layer.post_attention_layernorm.weight  # [D]
        self.qkv: torch.Tensor = a.qkv_proj.weight  # [(H + 2 Hkv) hd, D]
        self.o: torch.Tensor = a.o_proj.weight  # [D, H hd]
        self.gate_up: torch.Tensor = layer.mlp.gate_up_proj.weight  # [2 I, D]
        self.down: torch.Tensor = layer.mlp.down_proj.weight  # [D, I]


class CudaDecodeStep(LeanDecodeStepBase):
    """``(input_ids [1], positions [1], kv_caches, meta) -> hidden [1, D]`` (pre-head) or ``None``.

    ``pdl``: launch with programmatic dependent launch (default: on Hopper or newer).
    ``configs``: GEMV tiles per linear (``qkv``, ``o``, ``gate_up``, ``down``, ``head``) and the attention's
    split floor and tiling (``attention``), each merged over ``DEFAULT_CONFIGS``.
    Invariant: one call at a time, stream-ordered (calls share the attention's merge counters, as all of a
    model's decode steps share its KV cache).
    """

    device_type = "cuda"

    def __init__(self, model: nn.Module, pdl: bool | None = None, configs: dict[str, dict] | None = None):
        super().__init__(model)
        dtype, dev = self.embed.dtype, self.embed.device
        # The fused ops' rope tables (prepare_rope casts the gathered fp32 rows to the activation dtype;
        # casting the whole table once gives the same values); each step gathers its position's row.
        self.cos = model.rope_cos.to(dtype).contiguous()  # [max_pos, hd / 2]
        self.sin = model.rope_sin.to(dtype).contiguous()
        self.layers = [_Layer(layer) for layer in model.model.layers]
        self.head = model.head_weight()  # [V, D]
        self.pdl = torch.cuda.get_device_capability(dev)[0] >= 9 if pdl is None else pdl
        # The attention's split-K partials are merged by the last program of each kv head (one kernel, not
        # two); its arrival counters live here, zero between calls, shared by every layer (they run in order).
        self.merge_counters = torch.zeros(self.num_kv_heads, dtype=torch.int32, device=dev)
        self.configs = {k: {**v, **((configs or {}).get(k) or {})} for k, v in DEFAULT_CONFIGS.items()}
        self.configs["qkv"]["block_n"] = min(self.configs["qkv"]["block_n"], self.head_dim // 2)
        attn = dict(self.configs["attention"])  # split choice vs the kernel's tiling overrides, separated once
        self.split_floor, self.split_waves = attn.pop("min_split_tokens"), attn.pop("waves")
        self.attention_launch = attn

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """``hidden [1, D]`` -> fp32 logits ``[1, V]`` through the decode GEMV, or None (the model's head runs)."""
        return gemv_logits(hidden, self.head, self.pdl, self.configs["head"])

    @staticmethod
    def supports(model: nn.Module) -> bool:
        """The module path this step reproduces: fused ops, Triton paged attention, CUDA, bias-free plain linears."""
        from torchinferno.models.common.attention_triton import TritonPagedAttention

        layers = getattr(getattr(model, "model", None), "layers", None)
        if not layers or model.ops is not fused_ops:
            return False
        w = model.model.embed_tokens.weight
        if not (w.is_cuda and tri.available() and w.dtype in (torch.bfloat16, torch.float16, torch.float32)):
            return False
        half = layers[0].self_attn.head_dim // 2
        if half < 2 or half & (half - 1):  # the qkv kernel tiles half a head in a power of two of rows
            return False
        for layer in layers:
            a, mlp = layer.self_attn, layer.mlp
            linears = (a.qkv_proj, a.o_proj, mlp.gate_up_proj, mlp.down_proj)
            if type(a.attn) is not TritonPagedAttention or any(type(m) is not nn.Linear or m.bias is not None
                                                                for m in linears):
                return False
            if any(t.dtype != w.dtype for t in (layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                                                 *(m.weight for m in linears))):
                return False
        return True

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 kv_caches: list[tuple[torch.Tensor, ...]] | None, meta: AttentionMetadata | None) -> torch.Tensor | None:
        # tri.usable: CUDA + Triton, and not while make_fx records (traces capture the module path)
        if (kv_caches is None or meta is None or input_ids.shape[0] != 1 or not tri.usable(input_ids)
                or not meta.query_lens_list or not meta.is_decode):
            return None
        from torchinferno.kernels.triton.decode_attention import choose_num_splits  # imports Triton

        H, Hkv, hd, D, eps = self.num_heads, self.num_kv_heads, self.head_dim, self.hidden, self.eps
        pdl, cfg = self.pdl, self.configs
        # The residual stream alternates between two vectors: the o and down GEMVs read one and write
        # the other (their epilogue adds the residual), the norms of the next GEMVs read what was written.
        res = self.embed[input_ids].view(D)  # [D] (a fresh tensor: the step may overwrite it)
        other = torch.empty_like(res)
        cos, sin = self.cos[positions].view(-1), self.sin[positions].view(-1)  # [hd / 2]
        slot, bt, seq_lens = meta.slot_mapping, meta.block_tables, meta.seq_lens
        # One sequence has only Hkv programs per split: splits as short as 64 tokens keep the SMs busy at long
        # context (the in-kernel merge makes many splits cheap). From static shapes: graph-capturable.
        splits = choose_num_splits(1, Hkv, bt.shape[1] * kv_caches[0][0].shape[1], bt.device,
                                   min_split_tokens=self.split_floor, waves=self.split_waves)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            q = kapi.decode_gemv_rope_kv(res, layer.qkv, cos, sin, k_cache, v_cache, slot, H, Hkv, hd,
                                         norm_weight=layer.in_norm, eps=eps, pdl=pdl,
                                         config=cfg["qkv"])  # [H hd]; K/V stored at slot
            o = kapi.batched_paged_decode_attention(q.view(1, H, hd), k_cache, v_cache, bt, seq_lens, self.scale,
                                                    splits, pdl=pdl, merge_counters=self.merge_counters,
                                                    config=self.attention_launch)  # [1, H, hd]
            h = kapi.decode_gemv(o.view(H * hd), layer.o, other, residual=res, pdl=pdl,
                                 config=cfg["o"])  # [D]: res + attention
            act = kapi.decode_gemv_swiglu(h, layer.gate_up, norm_weight=layer.post_norm, eps=eps, pdl=pdl,
                                          config=cfg["gate_up"])  # [I]
            res, other = kapi.decode_gemv(act, layer.down, res, residual=h, pdl=pdl,
                                          config=cfg["down"]), h  # [D]: h + mlp
        return kapi.rms_norm(res.view(1, D), self.final_norm, eps)
