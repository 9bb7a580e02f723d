"""Attention backends over the paged KV layout (a dense cache is the one-block-per-row case).

A backend is chosen at model construction. It writes the new tokens' K/V into the cache at
``slot_mapping`` and attends each sequence's queries to its whole context. The torch reference
here is the correctness baseline; GPU kernels plug in behind the same ``forward`` signature.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torchinferno.kernels.kv_dtype import FP8_KV_DTYPES, gather_blocks, kv_store_values, store_rows
from torchinferno.models.common.attention_metadata import AttentionMetadata


def write_kv(cache: torch.Tensor, values: torch.Tensor, slot_mapping: torch.Tensor, has_padding: bool = False) -> None:
    """cache [num_blocks, block_size, *S] <- values [T, *S] at flat slots (cast as :func:`kv_store_values`).

    Slots of -1 (padded tokens) are allowed only with ``has_padding=True``; they are skipped.
    """
    if has_padding:
        keep = slot_mapping >= 0
        slot_mapping, values = slot_mapping[keep], values[keep]
    store_rows(cache, slot_mapping, values)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, length: int) -> torch.Tensor:
    """[B, length, *S]: the first ``length`` cached tokens of each row of ``block_tables``."""
    bs = cache.shape[1]
    nblocks = (length + bs - 1) // bs
    if nblocks == 1:
        # One block per row (dense cache): slice first so only ``length`` tokens are copied.
        return gather_blocks(cache[:, :length], block_tables[:, 0].long())
    g = gather_blocks(cache, block_tables[:, :nblocks].long())  # [B, nblocks, bs, *S]
    return g.reshape(g.shape[0], nblocks * bs, *g.shape[3:])[:, :length]


class TorchAttention(torch.nn.Module):
    """Reference causal GQA attention over a (paged) KV cache, in plain torch.

    q [T, H, D], k [T, Hkv, D], v [T, Hkv, Dv] -> out [T, H, Dv]. With ``kv_cache=None`` it
    is a plain causal attention of each sequence over its own new tokens.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, scale: float):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.scale = scale
        # Set by kernels.batch_invariant: decode one sequence at a time (prefill is per sequence already).
        self.batch_invariant = False

    @staticmethod
    def compute_dtype(q: torch.Tensor) -> torch.dtype:
        """CPU SDPA is several times faster in fp32 than in bf16/fp16 (and more accurate); upcast there."""
        return torch.float32 if q.device.type == "cpu" else q.dtype

    def forward(self, q, k, v, kv_cache: tuple[torch.Tensor, torch.Tensor] | None, meta: AttentionMetadata | None):
        gqa = self.num_heads != self.num_kv_heads
        cdt = self.compute_dtype(q)
        if meta is None:  # one sequence, no cache
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1).to(cdt), k.transpose(0, 1).to(cdt), v.transpose(0, 1).to(cdt), is_causal=True,
                scale=self.scale, enable_gqa=gqa,
            )
            return o.transpose(0, 1).to(q.dtype)
        # an empty batch has no decode; a graph-padded batch has rows past its live sequences (the general path)
        if kv_cache is not None and meta.query_lens_list and meta.is_decode and not meta.graph_padded:
            if self.batch_invariant:
                return self._decode_each(q, k, v, kv_cache, meta, gqa, cdt)
            return self._decode(q, k, v, kv_cache, meta, gqa, cdt)
        if kv_cache is not None:
            k_cache, v_cache = kv_cache
            write_kv(k_cache, k, meta.slot_mapping, meta.has_padding)
            write_kv(v_cache, v, meta.slot_mapping, meta.has_padding)
        alloc = torch.zeros if meta.graph_padded else torch.empty  # padded rows: finite values
        out = alloc(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype, device=q.device)
        # The leading one-token queries (the decodes a mixed step starts with): one batched decode call over their
        # contexts instead of one gather + SDPA each (SmolLM2 on CPU, module path, 15 decodes + a 54-token prompt:
        # 155-161 -> 133-140 ms a step, session 30). Batch-invariant mode keeps the per-row path below.
        first = meta.num_leading_decodes if kv_cache is not None and not self.batch_invariant else 0
        if first > 1:
            out[:first] = self._decode(q[:first], None, None, kv_cache, meta.sub_batch(0, first), gqa, cdt,
                                       write=False)
        else:
            first = 0
        spans = meta.query_spans()
        for b in range(first, len(spans)):
            s, qlen, ctx = spans[b]
            e, slen = s + qlen, ctx + qlen
            if self.batch_invariant and qlen == 1 and ctx > 0 and kv_cache is not None:
                out[s] = self._decode_one(q[s], meta.block_tables[b : b + 1], slen, kv_cache, gqa, cdt)
                continue  # a decode row mixed with prompts: the numbers it gets in a decode-only step
            qb = q[s:e].transpose(0, 1).unsqueeze(0)  # [1, H, qlen, D]
            if ctx == 0 or kv_cache is None:
                kb, vb = k[s:e], v[s:e]
                if kv_cache is not None and kv_cache[0].dtype in FP8_KV_DTYPES:  # attend to K/V as stored
                    kb, vb = kv_store_values(kb, kv_cache[0].dtype), kv_store_values(vb, kv_cache[1].dtype)
                mask, causal = None, True
            else:
                bt = meta.block_tables[b : b + 1]
                kb, vb = gather_kv(k_cache, bt, slen)[0], gather_kv(v_cache, bt, slen)[0]
                # query j (absolute position ctx + j) sees keys 0..ctx+j
                mask = torch.arange(slen, device=q.device)[None, :] <= (ctx + torch.arange(qlen, device=q.device))[:, None]
                causal = False
            o = F.scaled_dot_product_attention(
                qb.to(cdt),
                kb.transpose(0, 1).unsqueeze(0).to(cdt),
                vb.transpose(0, 1).unsqueeze(0).to(cdt),
                attn_mask=mask,
                is_causal=causal,
                scale=self.scale,
                enable_gqa=gqa,
            )
            out[s:e] = o[0].transpose(0, 1).to(q.dtype)
        return out

    def _decode_each(self, q, k, v, kv_cache, meta: AttentionMetadata, gqa: bool, cdt: torch.dtype):
        """Batch-invariant decode: write every new K/V, then attend each sequence alone (no padding mask)."""
        k_cache, v_cache = kv_cache
        write_kv(k_cache, k, meta.slot_mapping, meta.has_padding)
        write_kv(v_cache, v, meta.slot_mapping, meta.has_padding)
        out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
        for b, length in enumerate(meta.seq_lens_list):
            out[b] = self._decode_one(q[b], meta.block_tables[b : b + 1], length, kv_cache, gqa, cdt)
        return out

    def _decode_one(self, q1, bt, length: int, kv_cache, gqa: bool, cdt: torch.dtype):
        """One sequence's one query q1 [H, D] over its ``length`` cached tokens (block table bt [1, nb]) -> [H, Dv].

        The same fixed-shape SDPA call whatever else is in the step (q1 is copied to a fresh buffer so the call
        also sees the same alignment)."""
        k_cache, v_cache = kv_cache
        H, D = q1.shape
        kb = gather_kv(k_cache, bt, length).transpose(1, 2).to(cdt)  # [1, Hkv, L, D]
        vb = gather_kv(v_cache, bt, length).transpose(1, 2).to(cdt)
        qb = q1.reshape(1, H, 1, D).to(cdt, copy=True)
        o = F.scaled_dot_product_attention(qb, kb, vb, scale=self.scale, enable_gqa=gqa)
        return o.view(H, -1).to(q1.dtype)

    def _decode(self, q, k, v, kv_cache, meta: AttentionMetadata, gqa: bool, cdt: torch.dtype, write: bool = True):
        # q [B, H, D], k [B, Hkv, D], v [B, Hkv, Dv]: one new token per sequence; write its K/V (``write``; False:
        # already written, k / v unused), then attend to the seq_lens[b] cached tokens. This runs per layer per
        # decode step, where host overhead is a large part of a CPU step: the views are built directly with as_strided.
        B, H, D = q.shape
        k_cache, v_cache = kv_cache
        lens = meta.seq_lens_list
        length = max(lens)
        ragged = min(lens) != length
        r0 = _dense_first_row(meta.block_tables_host, length, k_cache, v_cache, meta.contiguous)
        if r0 is None:
            if write:
                write_kv(k_cache, k, meta.slot_mapping, meta.has_padding)
                write_kv(v_cache, v, meta.slot_mapping, meta.has_padding)
            kb = gather_kv(k_cache, meta.block_tables, length).transpose(1, 2)  # [B, Hkv, L, D]
            vb = gather_kv(v_cache, meta.block_tables, length).transpose(1, 2)
        else:
            # Sequence b's context is the head of cache block r0 + b: write and read through views.
            views = DenseRowViews.plan(k_cache, v_cache, r0, B, length)
            if write and (ragged or meta.has_padding):
                write_kv(k_cache, k, meta.slot_mapping, meta.has_padding)
                write_kv(v_cache, v, meta.slot_mapping, meta.has_padding)
            elif write:  # every row writes position length - 1 of its block: one strided copy (and cast) each
                if k_cache.dtype in FP8_KV_DTYPES:
                    k, v = kv_store_values(k, k_cache.dtype), kv_store_values(v, v_cache.dtype)
                views.write(k_cache, v_cache, k, v)
            kb, vb = views.read(k_cache, v_cache)  # [B, Hkv, L, D], [B, Hkv, L, Dv]
        mask = None
        if ragged:
            mask = (torch.arange(length, device=q.device)[None, :] < meta.seq_lens[:, None])[:, None, None, :]
        if kb.dtype != cdt:
            kb, vb = kb.to(cdt), vb.to(cdt)
        # CPU: the flash kernel reads the strided views directly; it beat explicit matmul/softmax
        # formulations (grouped bmm, cross-head masked bmm) at B = 1 and 8 in-model.
        o = F.scaled_dot_product_attention(q.view(B, H, 1, D).to(cdt), kb, vb, attn_mask=mask, scale=self.scale,
                                           enable_gqa=gqa)
        return o.view(B, H, -1).to(q.dtype)  # [B, H, Dv]


class DenseRowViews:
    """Strided views of dense cache rows: sequence b's first ``length`` tokens are the head of
    block ``r0 + b`` of contiguous caches ``[num_blocks, block_size, Hkv, D]``.

    Each spec is ``(size, stride, offset)`` relative to the cache's storage offset, so one plan
    serves every layer's caches of the same shape. ``write`` stores position ``length - 1`` of
    every row (the decode token); ``read`` gives ``[B, Hkv, length, D]`` K and V views.
    """

    __slots__ = ("k_write", "v_write", "k_read", "v_read")

    def __init__(self, k_write, v_write, k_read, v_read):
        self.k_write, self.v_write, self.k_read, self.v_read = k_write, v_write, k_read, v_read

    @staticmethod
    def plan(k_cache: torch.Tensor, v_cache: torch.Tensor, r0: int, batch: int, length: int) -> "DenseRowViews":
        _, bs, hkv, d = k_cache.shape
        dv = v_cache.shape[3]
        k0, v0 = r0 * bs * hkv * d, r0 * bs * hkv * dv
        return DenseRowViews(((batch, hkv, d), (bs * hkv * d, d, 1), k0 + (length - 1) * hkv * d),
                             ((batch, hkv, dv), (bs * hkv * dv, dv, 1), v0 + (length - 1) * hkv * dv),
                             ((batch, hkv, length, d), (bs * hkv * d, d, hkv * d, 1), k0),
                             ((batch, hkv, length, dv), (bs * hkv * dv, dv, hkv * dv, 1), v0))

    @staticmethod
    def _view(cache: torch.Tensor, spec) -> torch.Tensor:
        size, stride, offset = spec
        return cache.as_strided(size, stride, cache.storage_offset() + offset)

    def write(self, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k [B, Hkv, D], v [B, Hkv, Dv] -> position ``length - 1`` of each row (copy_ casts)."""
        self._view(k_cache, self.k_write).copy_(k)
        self._view(v_cache, self.v_write).copy_(v)

    def read(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._view(k_cache, self.k_read), self._view(v_cache, self.v_read)


def _dense_first_row(block_tables_host: list[list[int]] | None, length: int, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, contiguous: bool = False) -> int | None:
    """``r0`` when sequence b's first ``length`` tokens sit in block ``r0 + b`` of contiguous caches
    ``[num_blocks, block_size, Hkv, D]`` (checked on the host), else None. ``contiguous``: one sequence whose
    blocks are consecutive from ``r0``, so its ``length`` tokens are one run however many blocks they span."""
    if block_tables_host is None or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        return None
    if length > k_cache.shape[1] and not (contiguous and len(block_tables_host) == 1):
        return None
    r0 = block_tables_host[0][0]
    for b in range(1, len(block_tables_host)):
        if block_tables_host[b][0] != r0 + b:
            return None
    return r0
