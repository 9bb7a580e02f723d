"""MLA decode over the paged latent cache on CUDA: absorbed attention with device-only inputs (CUDA-graph safe).

The latent cache of a layer is ``[num_blocks, block_size, R + r]`` (``c_kv`` then the rotated ``k_pe``: 576 values
at DeepSeek's shape). With W_UK folded into the query, every head of a request attends over the same latent rows:
576-dim keys and 512-dim values (``c_kv`` itself, the first ``R`` of the same rows).
``kernels.triton.mla_decode_attention`` reads each row once as a ``c_kv`` and a ``k_pe`` tile and reuses ``c_kv`` as
the value tile; its lengths and block tables are device tensors, so nothing here reads a host value.
(``DECODE_KERNEL = "gqa"`` runs the GQA kernel, ``kernels.triton.decode_attention``, with all heads on one 576-wide
key head instead: the A/B baseline.)

* :func:`paged_absorbed_decode` — ``q_nope [B, H, dn], q_pe [B, H, r]`` -> ``[B, H, dv]`` (W_UV folded in after).
  Reference: ``models.common.mla.mla_absorbed_attention`` over the gathered latent (tests/kernels/test_mla_decode.py).
* :func:`sparse_absorbed_decode` — V3.2 DSA decode: the same absorbed attention over only the rows at given flat
  cache slots ``[B, k]`` (the indexer's top-k, -1 = none), through ``kernels.sparse_sink_decode`` (keys the
  576-wide rows, values their first ``R``, no sink): the Triton kernel on CUDA, its torch reference elsewhere.
* :func:`write_latent` — the new tokens' latent rows into the cache; ``slot_mapping = -1`` (a padded row of a
  CUDA-graph bucket) writes nothing, without the boolean indexing (a host sync) the torch path needs for that.

Both are Triton launches (CUDA tensors; the interpreter runs them on CPU in tests). FP8 latent caches work as in
the GQA kernel (values stored unscaled, saturated; tiles upcast for the dot).
"""

from __future__ import annotations

import torch

from torchinferno.kernels import triton as _tri
from torchinferno.models.common.mla import split_kv_b

# sparse_absorbed_decode's tiles: 512 value dims per row (+ the 64-wide rope tail), so 16 rows a tile as the paged
# kernel takes for 576-wide rows (benchmarks/bench_dsa_sparse_decode.py sweeps them)
SPARSE_CONFIG = {"BLOCK_H": 16, "BLOCK_N": 16, "num_warps": 4, "SPLITS": "auto"}
MAX_HEADS_PER_LAUNCH = 16  # heads per GQA-kernel launch (DECODE_KERNEL "gqa"; V3: 8 launches, each re-reading the rows)
# paged_absorbed_decode's split plan (H100 sweeps, benchmarks/probe_ds_prefill.py mla: 16 heads, 576 / 512): up to
# 16 splits of at least 128 rows while the batch leaves SMs idle, aiming at two waves of programs. Run 51: batch 64,
# ctx 4096, 4 splits 123.8 us against 2 splits 145.6 us; run 52: batch 1 / 8, ctx 1024, 8 splits 14.8 / 16.1 us against
# 16 splits (64 rows each) 18.0 / 20.2 us, and one split at ctx 128. The kernel rounds a split up to whole tiles of
# the actual length, so a short context uses fewer. MLA_BLOCK_N: the GQA baseline's tiles (session 18's plan for it).
MLA_MIN_SPLIT_ROWS = 128
MLA_MAX_SPLITS = 16
MLA_BLOCK_N = 32
# "mla": kernels.triton.mla_decode_attention (each latent row read once as c_kv + k_pe tiles, c_kv reused as the
# values, all heads in one launch); "gqa": the GQA kernel above with one 576-wide key head (the A/B baseline)
DECODE_KERNEL = "mla"
MERGE_COUNTERS = 4096  # per device: int32 zeros, one per (sequence, launch): the split-K merge inside stage 1
_counters: dict[torch.device, torch.Tensor] = {}


def merge_counters(device: torch.device, n: int) -> torch.Tensor | None:
    """The device's split-merge counters (``decode_attention``'s ``merge_counters``: zeros, left zero by every
    launch, so one buffer serves every layer, step and CUDA graph), or None (then the decode runs its separate
    merge kernel) when more than :data:`MERGE_COUNTERS` are needed or the first request comes inside a capture."""
    buf = _counters.get(device)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = _counters[device] = torch.zeros(MERGE_COUNTERS, dtype=torch.int32, device=device)
    return buf if n <= buf.numel() else None


def mla_num_splits(batch: int, table_rows: int, device: torch.device) -> int:
    """Splits of each sequence's latent rows: about two waves of programs (``batch x splits`` ~ twice the SM count;
    pass ``batch x head blocks`` when a sequence's heads take several programs), at most :data:`MLA_MAX_SPLITS` and
    one per :data:`MLA_MIN_SPLIT_ROWS` rows of the block table's width ``table_rows``; a power of two. Shapes only,
    so a captured CUDA graph keeps its plan."""
    from torchinferno.kernels.triton import device_sms

    n = max(1, min(MLA_MAX_SPLITS, table_rows // MLA_MIN_SPLIT_ROWS, 2 * device_sms(device) // max(batch, 1)))
    return 1 << (n.bit_length() - 1)


def usable(q: torch.Tensor) -> bool:
    return _tri.usable(q)


def query_buffer(T: int, H: int, R: int, r: int, dtype: torch.dtype, device) -> torch.Tensor:
    """A new ``[H, T, R + r]`` absorbed-decode query buffer: the rope dims ``[..., R:]`` are written first (the MLA
    prologue's ``q_pe``), then :func:`paged_absorbed_decode` writes ``W_UK^T q_nope`` into ``[..., :R]`` with one
    bmm (``out=``, head-major as the bmm produces it), so the query is never concatenated."""
    return torch.empty((H, T, R + r), dtype=dtype, device=device)


def _query_buffer_of(q_pe: torch.Tensor, R: int) -> torch.Tensor | None:
    """The :func:`query_buffer` ``q_pe [B, H, r]`` is a view of (its rope dims), else None."""
    base = q_pe._base
    B, H, r = q_pe.shape
    if base is None or base.shape != (H, B, R + r) or not base.is_contiguous():
        return None
    if q_pe.stride() != (R + r, B * (R + r), 1) or q_pe.data_ptr() != base.data_ptr() + R * base.element_size():
        return None
    return base


def latent_attention(q: torch.Tensor, latent_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float, r: int, pdl: bool = False) -> torch.Tensor:
    """The attention of absorbed MLA decode: q [B, H, R + r] (absorbed queries, any strides with the last dim
    contiguous), latent_cache [N, bs, R + r] -> o_lat [B, H, R] in q.dtype, stored head-major (``[H, B, R]``
    contiguous, so ``o_lat.transpose(0, 1)`` is the ``W_UV`` bmm's operand). Keys are the latent rows, values their
    first R dims; one launch of ``DECODE_KERNEL`` (plus its split merge). ``pdl``: the MLA kernel's launch with
    programmatic dependent launch (the GQA baseline ignores it)."""
    B, H = q.shape[0], q.shape[1]
    R = latent_cache.shape[-1] - r
    lens = seq_lens.to(torch.int32)
    o_lat = torch.empty(H, B, R, dtype=q.dtype, device=q.device).transpose(0, 1)  # [B, H, R], head-major storage
    table_rows = block_tables.shape[1] * latent_cache.shape[1]
    if DECODE_KERNEL == "mla":
        from torchinferno.kernels.triton.mla_decode_attention import BLOCK_H, mla_paged_decode_attention

        hblocks = -(-H // BLOCK_H)
        counters = merge_counters(q.device, B * hblocks)
        mla_paged_decode_attention(q, latent_cache, block_tables, lens, scale, r,
                                   mla_num_splits(B * hblocks, table_rows, q.device), out=o_lat,
                                   merge_counters=counters, pdl=pdl)
    else:  # the GQA kernel with one 576-wide key head (the A/B baseline of benchmarks/probe_ds_prefill.py)
        from torchinferno.kernels.triton.decode_attention import batched_paged_decode_attention

        kc = latent_cache.unsqueeze(2)  # [N, bs, 1, R + r]: one KV head
        counters = merge_counters(q.device, B)  # launches run in stream order: one buffer serves them all
        splits = mla_num_splits(B, table_rows, q.device)
        gqa_tiles = {"block_n": 16 if q.dtype == torch.float32 else MLA_BLOCK_N}  # fp32: 32 rows exceed shared memory
        for h0 in range(0, H, MAX_HEADS_PER_LAUNCH):  # a program holds all its heads' [576-wide] query rows
            h1 = min(H, h0 + MAX_HEADS_PER_LAUNCH)
            batched_paged_decode_attention(q[:, h0:h1], kc, kc[..., :R], block_tables, lens, scale,
                                           num_splits=splits, out=o_lat[:, h0:h1], config=gqa_tiles,
                                           merge_counters=counters)
    return o_lat


def paged_absorbed_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, latent_cache: torch.Tensor,
                          w_kv_b: torch.Tensor, scale: float, block_tables: torch.Tensor,
                          seq_lens: torch.Tensor) -> torch.Tensor:
    """q_nope [B, H, dn], q_pe [B, H, r], latent_cache [N, bs, R + r], w_kv_b [H*(dn+dv), R],
    block_tables [B, max_blocks] int32, seq_lens [B] int32 (>= 1) -> [B, H, dv] in q_nope.dtype (contiguous).

    When ``q_pe`` lives in a :func:`query_buffer` (the fused MLA prologue put it there), ``W_UK^T q_nope`` is
    written next to it by one bmm; else the query is concatenated. The output is produced by one bmm writing
    ``[B, H, dv]`` rows directly (``o_proj`` reads them as ``[B, H * dv]`` without a copy)."""
    B, H, dn = q_nope.shape
    r = q_pe.shape[-1]
    R = latent_cache.shape[-1] - r
    w_uk, w_uv = split_kv_b(w_kv_b, H, dn, w_kv_b.shape[0] // H - dn)
    buf = _query_buffer_of(q_pe, R) if q_pe.dtype == q_nope.dtype else None
    if buf is not None:
        torch.bmm(q_nope.transpose(0, 1), w_uk, out=buf[:, :, :R])  # [H, B, dn] @ [H, dn, R] next to q_pe
        q = buf.transpose(0, 1)  # [B, H, R + r] (strided)
    else:
        q_lat = torch.einsum("bhd,hdr->bhr", q_nope, w_uk)  # [B, H, R]
        q = torch.cat([q_lat, q_pe.to(q_lat.dtype)], dim=-1)  # [B, H, R + r]
    o_lat = latent_attention(q, latent_cache, block_tables, seq_lens, scale, r)
    out = torch.empty(B, H, w_uv.shape[1], dtype=q.dtype, device=q.device)
    torch.bmm(o_lat.transpose(0, 1), w_uv.transpose(1, 2), out=out.transpose(0, 1))  # [H, B, R] @ [H, R, dv]
    return out


def sparse_absorbed_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, latent_cache: torch.Tensor, w_kv_b: torch.Tensor,
                           scale: float, slots: torch.Tensor, use_triton: bool = True,
                           config: dict | None = None) -> torch.Tensor:
    """q_nope [B, H, dn], q_pe [B, H, r], latent_cache [N, bs, R + r], w_kv_b [H*(dn+dv), R], slots [B, k] int
    (flat cache slots ``block * bs + offset``; -1 = not attended) -> [B, H, dv] in q_nope.dtype.

    Equals ``mla.mla_absorbed_attention`` over the latent rows at the valid slots (a row with none gives 0). Reads
    only device tensors whose shapes are fixed by the batch and ``k`` (CUDA-graph capturable). ``use_triton=False``
    (the reference ops) runs ``kernels.sparse_sink_decode.reference``."""
    from torchinferno.kernels import sparse_sink_decode as ssd

    H, dn = q_nope.shape[1], q_nope.shape[2]
    R = latent_cache.shape[-1] - q_pe.shape[-1]
    w_uk, w_uv = split_kv_b(w_kv_b, H, dn, w_kv_b.shape[0] // H - dn)
    q_lat = torch.einsum("bhd,hdr->bhr", q_nope, w_uk)  # fold W_UK into the query: [B, H, R]
    q = torch.cat([q_lat, q_pe.to(q_lat.dtype)], dim=-1)  # [B, H, R + r]
    o_lat = ssd.sparse_sink_decode(q, latent_cache, slots, None, None, None, scale, use_triton=use_triton,
                                   config={**SPARSE_CONFIG, **(config or {})}, dv=R)  # [B, H, R]
    return torch.einsum("bhr,hvr->bhv", o_lat, w_uv)  # fold W_UV into the output


def write_latent(latent_cache: torch.Tensor, latent: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """latent_cache [N, bs, R + r] <- latent [T, R + r] at flat slots; slot -1 writes nothing. In place."""
    from torchinferno.kernels.triton.kv_cache import write_kv_cache

    rows = latent[:, None, :]  # [T, 1, R + r]
    cache = latent_cache.unsqueeze(2)  # [N, bs, 1, R + r]
    write_kv_cache(rows, rows, cache, cache, slot_mapping)  # K and V are the same rows: written twice, same values
