"""The projections of multi-head latent attention (MLA), shared by the DeepSeek-style families.

A family's attention module subclasses :class:`MLAProjections` and keeps HF's parameter names
(``q_proj`` or ``q_a_proj`` / ``q_a_layernorm`` / ``q_b_proj``, ``kv_a_proj_with_mqa``,
``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``); it adds how the latent is attended (expanded /
absorbed, an indexer) on top of :meth:`project`.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from torchinferno.models.common.layers import DirectWeightLinear, RMSNorm


def capturing(t: torch.Tensor) -> bool:
    """A CUDA graph is being captured on ``t``'s device: host metadata (``seq_lens_list``) is then a placeholder
    (``kernels.cuda_graphs``: the full block-table width), so decode must mask from the device lengths."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


# q_a_layernorm / kv_a_layernorm: transformers and DeepSeek's release build them with the RMSNorm
# default eps, not config.rms_norm_eps (dsv4 follows, so converted DeepSeek weights match).
LATENT_NORM_EPS = 1e-6


def mla_projection_params(cfg) -> int:
    """Parameters of :class:`MLAProjections` without biases (q, latent kv_a + norm, kv_b, o)."""
    d, h = cfg.hidden_size, cfg.num_attention_heads
    if cfg.q_lora_rank is None:
        q = d * h * cfg.qk_head_dim
    else:
        q = d * cfg.q_lora_rank + cfg.q_lora_rank + cfg.q_lora_rank * h * cfg.qk_head_dim
    kv = d * cfg.latent_dim + cfg.kv_lora_rank + cfg.kv_lora_rank * h * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    return q + kv + h * cfg.v_head_dim * d


class MLAProjections(nn.Module):
    """``cfg`` needs the MLA fields (heads, ranks, head dims, ``latent_dim``, ``rope_interleave``,
    ``softmax_scale``). ``bias``: whether q_a / kv_a / o projections carry biases."""

    def __init__(self, cfg, ops: ModuleType, absorb_decode: bool, bias: bool = False):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.q_lora_rank, self.kv_lora_rank = cfg.q_lora_rank, cfg.kv_lora_rank
        self.nope_dim, self.rope_dim, self.v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.rope_interleave = cfg.rope_interleave
        self.scale = cfg.softmax_scale
        self.batch_invariant = False  # set by kernels.batch_invariant: decode one sequence at a time
        qk = self.num_heads * cfg.qk_head_dim
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(cfg.hidden_size, qk, bias=False)
        else:
            self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS, ops)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, cfg.latent_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, LATENT_NORM_EPS, ops)
        # read as a weight by the expanded / absorbed attention, never called: runtime swaps keep it
        self.kv_b_proj = DirectWeightLinear(cfg.kv_lora_rank, self.num_heads * (self.nope_dim + self.v_dim), bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.v_dim, cfg.hidden_size, bias=bias)
        self.absorb_decode = absorb_decode
        self.ops = ops

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [T, D] -> (q_latent [T, q_lora_rank] or None, q_nope [T, H, dn], q_pe [T, H, r] rotated,
        latent [T, R + r]: ``[kv_a_layernorm(c_kv) | rotated k_pe]``, all this layer caches for MLA)."""
        T, H = x.shape[0], self.num_heads
        if self.q_lora_rank is None:
            q_latent, q = None, self.q_proj(x)
        else:
            q_latent = self.q_a_layernorm(self.q_a_proj(x))
            q = self.q_b_proj(q_latent)
        q_nope, q_pe = q.view(T, H, -1).split([self.nope_dim, self.rope_dim], dim=-1)
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        c_kv = self.kv_a_layernorm(c_kv)
        q_pe = self.ops.rope(q_pe, cos, sin, self.rope_interleave)
        k_pe = self.ops.rope(k_pe[:, None], cos, sin, self.rope_interleave)[:, 0]
        return q_latent, q_nope, q_pe, torch.cat([c_kv, k_pe], dim=-1)

    def project_and_write(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: torch.Tensor | None,
                          meta, decode_query: bool = False):
        """:meth:`project` and, with ``cache`` and ``meta``, :meth:`write_latent` of the latent rows. On CUDA with an
        ops module that opts in (``FUSED_MLA_PROLOGUE``) the latent RMSNorm, both ropes and the cache append are one
        Triton launch (``kernels.triton.mla_prologue``). ``decode_query``: place ``q_pe`` in the absorbed decode's
        query buffer (``kernels.mla_decode.query_buffer``: ``[H, T, R + r]``, rope dims last) so that decode step
        needs no concatenation; ``q_pe`` is then a strided view. Same contract as :meth:`project` otherwise."""
        from torchinferno.kernels import triton as tri

        if not (getattr(self.ops, "FUSED_MLA_PROLOGUE", False) and not self.batch_invariant
                and self.kv_a_layernorm.row_tile is None and tri.usable(x)):
            out = self.project(x, cos, sin)
            if cache is not None and meta is not None:
                self.write_latent(cache, out[3], meta)
            return out
        from torchinferno.kernels.mla_decode import query_buffer
        from torchinferno.kernels.triton.mla_prologue import mla_prologue

        T, H, r = x.shape[0], self.num_heads, self.rope_dim
        if self.q_lora_rank is None:
            q_latent, q = None, self.q_proj(x)
        else:
            q_latent = self.q_a_layernorm(self.q_a_proj(x))
            q = self.q_b_proj(q_latent)
        q = q.view(T, H, self.nope_dim + r)
        if decode_query:
            q_pe = query_buffer(T, H, self.kv_lora_rank, r, q.dtype, q.device)[:, :, self.kv_lora_rank :].transpose(0, 1)
        else:
            q_pe = torch.empty((T, H, r), dtype=q.dtype, device=q.device)
        write = cache is not None and meta is not None
        latent = mla_prologue(self.kv_a_proj_with_mqa(x), q, cos, sin, self.kv_a_layernorm.weight,
                              self.kv_a_layernorm.eps, r, self.rope_interleave, q_pe, cache if write else None,
                              meta.slot_mapping if write else None)
        return q_latent, q[..., : self.nope_dim], q_pe, latent

    # ---------------------------------------------------------------- paged decode on CUDA (kernels.mla_decode)
    def _paged_ops(self) -> bool:
        """The ops module opts into the Triton paged path (``PAGED_MLA_DECODE``) and decode is not batch-invariant."""
        return bool(getattr(self.ops, "PAGED_MLA_DECODE", False)) and not self.batch_invariant

    @staticmethod
    def capturing(t: torch.Tensor) -> bool:
        """Module-level :func:`capturing` (looked up at call time, so a test can emulate a capture on CPU)."""
        return capturing(t)

    @property
    def supports_cuda_graphs(self) -> bool:
        """A decode step reads only device tensors and only the live rows (``kernels.cuda_graphs``): the paged
        absorbed decode, so not with an indexer here (a family with one overrides this: V3.2's sparse DSA decode;
        the gathered path is capture-correct but would read the whole block-table width every step)."""
        return self._paged_ops() and self.absorb_decode and getattr(self, "indexer", None) is None

    def paged_decode(self, q_nope, q_pe, cache: torch.Tensor, meta) -> torch.Tensor | None:
        """``[B, H, dv]`` from the Triton absorbed decode over the paged latent cache (CUDA), or None where it does
        not apply (the caller then gathers the latent and runs the ops module's reference)."""
        from torchinferno.kernels import mla_decode

        if not (self._paged_ops() and mla_decode.usable(q_nope)):
            return None
        return mla_decode.paged_absorbed_decode(q_nope, q_pe, cache, self.kv_b_proj.weight, self.scale,
                                                meta.block_tables, meta.seq_lens)

    def write_latent(self, cache: torch.Tensor, latent: torch.Tensor, meta) -> None:
        """The new tokens' rows (latent ``[T, R + r]``, or any per-token rows such as index keys) into a
        ``[N, bs, width]`` cache: a Triton append on CUDA (skips slot -1 without a host sync), ``write_kv``
        elsewhere (padded rows skipped when ``meta.has_padding``)."""
        from torchinferno.kernels import mla_decode
        from torchinferno.models.common.attention import write_kv

        if self._paged_ops() and mla_decode.usable(latent):
            mla_decode.write_latent(cache, latent, meta.slot_mapping)
        else:
            write_kv(cache, latent, meta.slot_mapping, meta.has_padding)

    def each_decode_row(self, fn, meta, *rows):
        """Batch-invariant decode: ``fn(*row_slices, row_meta)`` for each sequence alone, concatenated (a row
        entry may be None or a NamedTuple of tensors, sliced field by field)."""
        def one(t, b):
            if t is None:
                return None
            if isinstance(t, tuple):
                return type(t)(*(one(f, b) for f in t))
            return t[b : b + 1]

        return torch.cat([fn(*(one(t, b) for t in rows), meta.decode_row(b)) for b in range(meta.num_seqs)])

    def decode_rows_of_mixed(self, o, fn, meta, *rows):
        """Batch-invariant mixed batch (decodes and prompts in one step): ``o`` [T, ...] (the expanded result)
        gets, for each one-token row with cached context, ``fn(*row_slices, row_meta)``: the numbers that row
        gets in a decode-only step (``each_decode_row``). Returns ``o``."""
        def one(t, s):
            if t is None:
                return None
            if isinstance(t, tuple):
                return type(t)(*(one(f, s) for f in t))
            return t[s : s + 1]

        for b, (s, qlen, ctx) in enumerate(meta.query_spans()):
            if qlen == 1 and ctx > 0:
                o[s : s + 1] = fn(*(one(t, s) for t in rows), meta.decode_row(b, token=s))
        return o
