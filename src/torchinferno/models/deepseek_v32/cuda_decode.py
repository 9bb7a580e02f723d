"""Batch-1 CUDA decode step of DeepSeek-V3-style models (MLA + MoE, no DSA indexer): decode GEMVs chained by PDL.

The module path of a one-token step runs every dense projection through cuBLAS, whose one-row GEMMs read the
V2-Lite-like model's 926 MB of dense weights at about 64% of the copy bandwidth on an H100 (run 51's 0.60 ms of
cuBLAS less ~0.11 ms of absorption bmms, their share in run 54), and each norm as its own launch; this step's
GEMVs read them at 76% (run 54: 0.43 of a 1.87 ms step's kernels). It runs the same math as
``DeepSeekV32ForCausalLM.forward`` with the ``fused`` ops, per layer:

    q + kv_a GEMV (prologue: input RMSNorm; both weights in one launch)  [H (dn + r) | R + r]
                (q_lora: q_a + kv_a, then a q_b GEMV with q_a_layernorm as its prologue)
    MLA prologue (latent norm, both ropes, latent cache append: kernels.triton.mla_prologue)
    W_UK head GEMV (kernels/triton/head_gemv.py: q_nope -> the absorbed query, next to the prologue's q_pe)
    absorbed paged MLA attention (kernels.mla_decode.latent_attention)
    W_UV head GEMV (the latent output -> [H, dv], the o GEMV's input)
    o GEMV      (epilogue: residual add: writes the next residual stream)
    dense layers: gate/up GEMV (prologue: RMSNorm; epilogue: SwiGLU), down GEMV (epilogue: residual add)
    MoE layers:   the layer's ``SparseMoE`` weights through its one-launch routing and per-token expert kernels
                  (models.common.moe.fused_decode_moe), the RMSNorm fused into both, the residual add into the down
                  kernel; where that does not apply: RMSNorm, the module as is, residual add

Every GEMV is ``kernels/triton/decode_gemv.py`` (the kernels of llama3's ``cuda_decode``), launched with
programmatic dependent launch on Hopper so it streams its first weight tile while the previous kernel drains. With
``pdl_chain`` the MLA prologue, the attention kernel and the MoE's three kernels are launched the same way (each waits
before its first access: they hide their launch gaps and let the next GEMV prefetch); on by default since session 25
(H100, V2-Lite-like batch 1: 1.551 ms device against 1.645 ms at context 128, 1.669 against 1.734 at 1024; == the
module path on CUDA in fp32 and bf16).
Roundings are the module path's (GEMV outputs, residual sums, the latent and rope outputs) except, as in llama3's
step, the normalized GEMV inputs, consumed in fp32 instead of rounded first (tested against the module path).

A step backend (``make_cuda_decode_step``; runners wrap the model with ``models/common/step_model``): it reads the
modules' tensors when built, so build it after weights are loaded and any linear swap. Anything but a one-sequence,
one-token CUDA decode returns ``None`` and the module path runs.
"""

from __future__ import annotations

import torch
from torch import nn

from torchinferno.kernels import api as kapi
from torchinferno.kernels import triton as tri  # dispatch only: importing it never imports Triton
from torchinferno.models.common.attention_metadata import AttentionMetadata
from torchinferno.models.common.decode_step import gemv_logits
from torchinferno.models.common.layers import GatedMLP, SparseMoE
from torchinferno.models.common.mla import split_kv_b
from torchinferno.models.common.mla_projections import LATENT_NORM_EPS
from torchinferno.models.common.moe import fused_decode_moe

# GEMV launch tiles per linear (llama3's sweep on an H200, benchmarks/probe_decode_gemv.py; K <= 2048 rows of one
# tile for the V2-Lite-like hidden 2048; larger K loops over tiles).
DEFAULT_CONFIGS: dict[str, dict] = {
    "proj": {"block_n": 4, "block_k": 2048, "num_warps": 4, "num_stages": 3, "early_launch": True},
    "gate_up": {"block_n": 8, "block_k": 1024, "num_warps": 4, "num_stages": 2, "early_launch": True},
    "down": {"block_n": 4, "block_k": 2048, "num_warps": 4, "num_stages": 3, "early_launch": True},
    "head": {"block_n": 4, "block_k": 2048, "num_warps": 4, "num_stages": 3, "early_launch": False},
    # The absorption GEMVs (kernels/triton/head_gemv.py), 16 KB of weights a program: W_UK [dn, R] per head read
    # with R contiguous (dn = 128 in one tile), W_UV [dv, R] per head in rows of R.
    "absorb_q": {"block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 2, "early_launch": True},
    "absorb_o": {"block_n": 16, "block_k": 512, "num_warps": 4, "num_stages": 2, "early_launch": True},
}


class _Layer:
    """The tensors and modules one layer of the step reads (weights as ``[N, K]``, norms as ``[D]``)."""

    __slots__ = ("attn", "in_norm", "post_norm", "q", "q_a", "q_a_norm", "q_b", "kv_a", "kv_norm", "w_uk_t", "w_uv",
                 "o", "gate_up", "down", "moe")

    def __init__(self, layer: nn.Module):
        a = self.attn = layer.self_attn
        self.in_norm: torch.Tensor = layer.input_layernorm.weight  # [D]
        self.post_norm: torch.Tensor = layer.post_attention_layernorm.weight  # [D]
        lora = a.q_lora_rank is not None
        self.q = None if lora else a.q_proj.weight  # [H (dn + r), D]
        self.q_a = a.q_a_proj.weight if lora else None  # [q_lora, D]
        self.q_a_norm = a.q_a_layernorm.weight if lora else None  # [q_lora]
        self.q_b = a.q_b_proj.weight if lora else None  # [H (dn + r), q_lora]
        self.kv_a: torch.Tensor = a.kv_a_proj_with_mqa.weight  # [R + r, D]
        self.kv_norm: torch.Tensor = a.kv_a_layernorm.weight  # [R]
        w_uk, self.w_uv = split_kv_b(a.kv_b_proj.weight, a.num_heads, a.nope_dim, a.v_dim)  # views [H, dn | dv, R]
        self.w_uk_t = w_uk.transpose(1, 2)  # [H, R, dn]: the head GEMV's [H, N, K] (strided view)
        self.o: torch.Tensor = a.o_proj.weight  # [D, H dv]
        dense = isinstance(layer.mlp, GatedMLP)
        self.gate_up = layer.mlp.gate_up_proj.weight if dense else None  # [2 I, D]
        self.down = layer.mlp.down_proj.weight if dense else None  # [D, I]
        self.moe = None if dense else layer.mlp  # SparseMoE: x [1, D] -> [1, D]


def _plain_linears(layer: nn.Module) -> list[nn.Module]:
    a, mlp = layer.self_attn, layer.mlp
    names = ("q_a_proj", "q_b_proj") if a.q_lora_rank is not None else ("q_proj",)
    out = [getattr(a, n) for n in names] + [a.kv_a_proj_with_mqa, a.o_proj]
    if isinstance(mlp, GatedMLP):
        out += [mlp.gate_up_proj, mlp.down_proj]
    return out


class MlaCudaDecodeStep:
    """``(input_ids [1], positions [1], kv_caches, meta) -> hidden [1, D]`` (pre-head) or ``None``.

    ``pdl``: launch the GEMVs with programmatic dependent launch (default: on Hopper or newer). ``configs``: GEMV
    tiles (``proj``: q / q_a / q_b / kv_a / o; ``gate_up``, ``down``: dense layers; ``head``), each merged over
    ``DEFAULT_CONFIGS``. ``fuse_q_kv``: q (or q_a) and kv_a in one launch (``decode_gemv``'s ``second_weight``;
    needs the proj tile's ``block_n`` to divide the q rows), else two (the A/B of benchmarks/probe_ds_prefill.py).
    ``absorb_gemv``: MLA's W_UK / W_UV products as PDL head GEMVs (``absorb_q`` / ``absorb_o`` tiles), else the
    module path's bmms. ``fuse_moe_ends``: a MoE layer's norm and residual add inside its routing / expert kernels
    (``models.common.moe.fused_decode_moe``), else their own launches around the module. ``pdl_chain`` (with
    ``pdl``): the MLA prologue, the attention and the MoE's kernels under PDL as well.
    Invariant: one call at a time, stream-ordered (the attention's split-merge counters are shared by every layer, as
    in the module path).
    """

    device_type = "cuda"

    def __init__(self, model: nn.Module, pdl: bool | None = None, configs: dict[str, dict] | None = None,
                 fuse_q_kv: bool = True, absorb_gemv: bool = True, fuse_moe_ends: bool = True,
                 pdl_chain: bool = True):
        cfg = model.config
        self.hidden, self.eps = cfg.hidden_size, cfg.rms_norm_eps
        a0 = model.model.layers[0].self_attn
        self.num_heads, self.nope_dim, self.rope_dim = a0.num_heads, a0.nope_dim, a0.rope_dim
        self.kv_lora_rank, self.rope_interleave, self.scale = a0.kv_lora_rank, a0.rope_interleave, a0.scale
        self.embed = model.model.embed_tokens.weight  # [V, D]
        self.final_norm = model.model.norm.weight  # [D]
        self.rope_cos, self.rope_sin = model.rope_cos, model.rope_sin  # fp32 [max_pos, r / 2], as the module path
        self.layers = [_Layer(layer) for layer in model.model.layers]
        self.head = model.head_weight()  # [V, D]
        self.pdl = torch.cuda.get_device_capability(self.embed.device)[0] >= 9 if pdl is None else pdl
        self.pdl_chain = self.pdl and pdl_chain  # the non-GEMV kernels under PDL too (module docstring)
        self.configs = {k: {**v, **((configs or {}).get(k) or {})} for k, v in DEFAULT_CONFIGS.items()}
        first = self.layers[0].q if self.layers[0].q is not None else self.layers[0].q_a
        self.fuse_q_kv = fuse_q_kv and first.shape[0] % self.configs["proj"]["block_n"] == 0
        self.absorb_gemv = absorb_gemv
        self.fuse_moe_ends = fuse_moe_ends

    @staticmethod
    def supports(model: nn.Module) -> bool:
        """The module path this step reproduces: fused ops on CUDA, absorbed paged MLA decode without an indexer,
        bias-free plain linears of the activation dtype, SparseMoE or dense SwiGLU MLPs."""
        from torchinferno.models.deepseek_v32 import fused_ops

        layers = getattr(getattr(model, "model", None), "layers", None)
        if not layers or model.ops is not fused_ops or getattr(model, "batch_invariant", False):
            return False
        w = model.model.embed_tokens.weight
        if not (w.is_cuda and tri.available() and w.dtype in (torch.bfloat16, torch.float16, torch.float32)):
            return False
        for layer in layers:
            a = layer.self_attn
            if a.indexer is not None or not a.absorb_decode or a.batch_invariant:
                return False
            if not isinstance(layer.mlp, (GatedMLP, SparseMoE)):
                return False
            if any(type(m) is not nn.Linear or m.bias is not None or m.weight.dtype != w.dtype
                   for m in _plain_linears(layer)):
                return False
        return True

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """``hidden [1, D]`` -> fp32 logits ``[1, V]`` through the decode GEMV, or None (the model's head runs)."""
        return gemv_logits(hidden, self.head, self.pdl, self.configs["head"])

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 kv_caches: list[tuple[torch.Tensor, ...]] | None, meta: AttentionMetadata | None) -> torch.Tensor | None:
        if (kv_caches is None or meta is None or input_ids.shape[0] != 1 or not tri.usable(input_ids)
                or not meta.query_lens_list or not meta.is_decode):
            return None
        from torchinferno.kernels import mla_decode
        from torchinferno.kernels.triton.head_gemv import head_gemv
        from torchinferno.kernels.triton.mla_prologue import mla_prologue

        H, dn, r, R, D, eps = self.num_heads, self.nope_dim, self.rope_dim, self.kv_lora_rank, self.hidden, self.eps
        pdl, chain, cfg = self.pdl, self.pdl_chain, self.configs
        proj = cfg["proj"]
        # The residual stream alternates between two vectors (llama3's step): the o and down GEMVs (and the MoE
        # layers' add) read one and write the other.
        res = self.embed[input_ids].view(D)  # [D] (a fresh tensor: the step may overwrite it)
        other = torch.empty_like(res)
        o_buf = res.new_empty(H, self.layers[0].w_uv.shape[1])  # [H, dv]: every layer's W_UV output (o GEMV's input)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # [1, r / 2] fp32
        for layer, cache in zip(self.layers, kv_caches):
            first = layer.q if layer.q is not None else layer.q_a  # [Nq, D]: q, or q_a under q LoRA
            nq = first.shape[0]
            if self.fuse_q_kv:  # [Nq + R + r]: both projections of the normalized input in one launch
                qkv = kapi.decode_gemv(res, first, second_weight=layer.kv_a, norm_weight=layer.in_norm, eps=eps,
                                       pdl=pdl, config=proj)
                q, kv = qkv[:nq], qkv[nq:]
            else:
                q = kapi.decode_gemv(res, first, norm_weight=layer.in_norm, eps=eps, pdl=pdl, config=proj)
                kv = kapi.decode_gemv(res, layer.kv_a, norm_weight=layer.in_norm, eps=eps, pdl=pdl, config=proj)
            if layer.q is None:  # q LoRA: q_b over q_a_layernorm(q_a x)
                q = kapi.decode_gemv(q, layer.q_b, norm_weight=layer.q_a_norm, eps=LATENT_NORM_EPS, pdl=pdl,
                                     config=proj)
            q = q.view(1, H, dn + r)
            qbuf = mla_decode.query_buffer(1, H, R, r, q.dtype, q.device)  # [H, 1, R + r]
            q_pe = qbuf[:, :, R:].transpose(0, 1)  # [1, H, r]: the rope dims of the absorbed query
            mla_prologue(kv.view(1, R + r), q, cos, sin, layer.kv_norm, layer.attn.kv_a_layernorm.eps, r,
                         self.rope_interleave, q_pe, cache[0], meta.slot_mapping, pdl=chain)  # latent row -> cache
            if self.absorb_gemv:  # W_UK and W_UV as PDL head GEMVs around the attention kernel
                head_gemv(q[0, :, :dn], layer.w_uk_t, qbuf[:, 0, :R], pdl=pdl, config=cfg["absorb_q"])  # [H, R]
                o_lat = mla_decode.latent_attention(qbuf.transpose(0, 1), cache[0], meta.block_tables, meta.seq_lens,
                                                    self.scale, r, pdl=chain)  # [1, H, R], head-major
                o = head_gemv(o_lat[0], layer.w_uv, o_buf, pdl=pdl, config=cfg["absorb_o"])  # [H, dv]
            else:  # the module path's two bmms
                o = mla_decode.paged_absorbed_decode(q[:, :, :dn], q_pe, cache[0], layer.attn.kv_b_proj.weight,
                                                     self.scale, meta.block_tables, meta.seq_lens)  # [1, H, dv]
            h = kapi.decode_gemv(o.view(-1), layer.o, other, residual=res, pdl=pdl, config=proj)  # res + attention
            if layer.moe is None:
                act = kapi.decode_gemv_swiglu(h, layer.gate_up, norm_weight=layer.post_norm, eps=eps, pdl=pdl,
                                              config=cfg["gate_up"])  # [I]
                res, other = kapi.decode_gemv(act, layer.down, res, residual=h, pdl=pdl, config=cfg["down"]), h
            else:  # res <- h + moe(norm(h)): three launches (norm and add fused), else five
                fused = self.fuse_moe_ends and fused_decode_moe(layer.moe, h.view(1, D), layer.post_norm, eps,
                                                                res.view(1, D), pdl=chain) is not None
                if not fused:
                    m = layer.moe(kapi.rms_norm(h.view(1, D), layer.post_norm, eps))  # [1, D]
                    torch.add(h, m.view(D), out=res)  # h + mlp (rounded once, as the module path)
                other = h
        return kapi.rms_norm(res.view(1, D), self.final_norm, eps)
