"""Triton attention backend over the paged KV layout (same ``forward`` as ``TorchAttention``).

Chosen at model construction (``family.build(..., attention_backend=TritonPagedAttention)``).
On CUDA tensors with Triton installed:

* KV append: one Triton launch writes K and V at ``slot_mapping`` (slot -1 skipped);
* decode batches (every sequence adds one token): the split-K paged decode kernel. It reads
  only device tensors (``slot_mapping``, ``block_tables``, ``seq_lens``) and picks its split
  count from static shapes, so a decode step can be captured in a CUDA graph
  (``supports_cuda_graphs``);
* a batch that is one fresh prompt (no cached context): SDPA (FlashAttention) on the new K/V; it reads no
  host value but the prompt length, so such a step can be captured per length bucket
  (``supports_prefill_graphs``, ``kernels.cuda_graphs_prefill``);
* anything else (several prompts, chunked prefill, prefix-cache hits, decodes mixed with
  prefill chunks): one varlen paged prefill launch plus one decode launch for the leading
  one-token rows (``kernels.api.paged_prefill_attention``);
* a whole-step graph's padded buffers (``meta.graph_padded``, ``kernels.cuda_graphs_mixed``): the same varlen
  kernel for every row, decodes included, over a grid fixed by the buffers' shapes, so any step of up to a
  bucket's token count can be captured (``supports_mixed_graphs``).

Every path attends to K/V as the cache stores them: with an FP8 cache the fresh-prompt path
rounds its new K/V the same way first (``kernels.kv_dtype``), so backends and paths agree.

Elsewhere (CPU tensors, no Triton) and in batch-invariant mode (``kernels.batch_invariant``) it behaves
exactly like ``TorchAttention``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torchinferno.kernels import api as kapi
from torchinferno.kernels import triton as tri
from torchinferno.kernels.kv_dtype import is_fp8, kv_store_values
from torchinferno.models.common.attention import TorchAttention
from torchinferno.models.common.attention_metadata import AttentionMetadata


class TritonPagedAttention(TorchAttention):
    """q [T, H, D], k [T, Hkv, D], v [T, Hkv, Dv] -> out [T, H, Dv] (see module docstring)."""

    supports_cuda_graphs = True
    supports_prefill_graphs = True  # the fresh-prompt path (SDPA) reads only shapes and device tensors
    # the attention call is a cut point of kernels.cuda_graphs_piecewise: it runs eagerly, every other op of the
    # families built on it (dense decoders) is row-wise
    supports_piecewise_graphs = True
    # graph-padded metadata (a whole mixed step in one graph, kernels.cuda_graphs_mixed) reads only device tensors
    supports_mixed_graphs = True
    # graph-padded steps compute a decode row on its query heads' rows, not on a prompt's whole query tile (False: the
    # tile, for comparing the two in benchmarks/probe_piecewise.py; read when the step runs or is captured)
    mixed_decode_rows = True

    def forward(self, q, k, v, kv_cache: tuple[torch.Tensor, torch.Tensor] | None, meta: AttentionMetadata | None):
        if kv_cache is None or meta is None or not tri.usable(q) or self.batch_invariant:
            # batch-invariant mode: the torch per-sequence path (the split-K decode tiles by batch)
            return super().forward(q, k, v, kv_cache, meta)
        k_cache, v_cache = kv_cache
        kapi.write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        if meta.graph_padded:
            return kapi.graph_padded_attention(q.contiguous(), k_cache, v_cache, meta.query_start_loc, meta.seq_lens,
                                               meta.block_tables, self.scale, self.mixed_decode_rows)
        if meta.is_decode:
            return kapi.batched_paged_decode_attention(q.contiguous(), k_cache, v_cache, meta.block_tables,
                                                       meta.seq_lens, self.scale)
        if meta.num_seqs == 1 and meta.seq_lens_list[0] == meta.query_lens_list[0]:
            if is_fp8(k_cache.dtype):  # attend to K/V as stored, as every other path does
                k, v = kv_store_values(k, k_cache.dtype).to(q.dtype), kv_store_values(v, v_cache.dtype).to(q.dtype)
            return self._fresh_prompt(q, k, v)
        return kapi.paged_prefill_attention(q.contiguous(), k_cache, v_cache, meta.query_start_loc, meta.seq_lens,
                                            meta.block_tables, self.scale, meta.query_lens_list, meta.seq_lens_list)

    def _fresh_prompt(self, q, k, v):
        # SDPA's FlashAttention backend takes grouped K/V heads directly (``enable_gqa``), so K/V
        # are never expanded to H heads; [T, H, D] transposed to [1, H, T, D] is FlashAttention's
        # native (B, S, H, D) memory layout, so neither the inputs nor the output are copied.
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                           is_causal=True, scale=self.scale,
                                           enable_gqa=self.num_heads != self.num_kv_heads)
        return o[0].transpose(0, 1)
