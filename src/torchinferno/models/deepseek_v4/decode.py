"""Static-shape decode attention of DeepSeek-V4: one new token per sequence, no host syncs (CUDA-graph capturable).

The eager path (``V4Attention.forward`` -> ``_SeqView``) walks sequences on the host and slices by their lengths.
A decode step here sees only device tensors and shapes fixed by the batch (``B`` rows, the block-table width
``Wb``), so a captured graph replays it for any lengths:

* every per-token row (``kv``, compressor / indexer ``ckv, cgate, ikv, igate``) is appended at ``slot_mapping``
  (slot -1, a padded row, writes nothing: a Triton append on CUDA, ``write_kv`` elsewhere);
* sliding window: the ``sliding_window`` positions ``t - W + 1 .. t`` as flat cache slots, ``-1`` where negative;
* compressed layers: each row pools the window(s) *ending at its token* (``rate`` slots, ``2 * rate`` with
  overlap) from the cache; the entry is written at the token's row of the entry tensor (``meta.entry_block_tables``,
  ``protocol.packed_slot``) only where a window closes there (``(t + 1) % rate == 0``, else slot -1), exactly the
  entry the eager path writes;
* entries: all ``N = Wb * block_size // rate`` closing slots of the table, valid iff ``w < (t + 1) // rate``; HCA
  attends every valid one, CSA the indexer's top ``min(index_topk, N)`` (a stable descending sort: the earliest
  among ties, invalid ones last and masked), as the eager selection.

Attention itself is :func:`torchinferno.kernels.sparse_sink_decode.sparse_sink_decode` over the two slot sets
(the Triton kernel on CUDA where ``attn.sparse_kernel``, with ``attn.kernel_config`` tiles when prepared artifacts
were loaded; its torch reference elsewhere). Invariant: the outputs
equal the eager decode up to summation order (tests/models/test_deepseek_v4_decode.py).
"""

from __future__ import annotations

import torch

from torchinferno.kernels import sparse_sink_decode as ssd
from torchinferno.models.common.attention import write_kv
from torchinferno.models.deepseek_v4.compressor import rope_tail
from torchinferno.models.protocol import packed_slot


def write_rows(cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, has_padding: bool = True) -> None:
    """cache [N, bs, S] <- rows [T, S] at flat slots; slot -1 writes nothing. No host sync on CUDA (Triton append)."""
    from torchinferno.kernels import triton as tri

    if tri.usable(rows) and cache.is_contiguous():
        from torchinferno.kernels.triton.kv_cache import write_kv_cache

        r = rows[:, None, :]
        c = cache.unsqueeze(2)  # [N, bs, 1, S]
        write_kv_cache(r, r, c, c, slots)  # K and V are the same rows: written twice, same values
    else:
        write_kv(cache, rows, slots, has_padding)


def slots_of(block_tables: torch.Tensor, block_size: int, pos: torch.Tensor) -> torch.Tensor:
    """block_tables [B, Wb], pos [B, K] (may be negative) -> flat cache slots [B, K] int64, -1 where pos < 0."""
    bt = block_tables.long()
    p = pos.clamp(min=0)
    blk = bt.gather(1, (p // block_size).clamp(max=bt.shape[1] - 1))
    return torch.where(pos >= 0, blk * block_size + p % block_size, -1)


def entry_slots_of(block_tables: torch.Tensor, block_size: int, pos: torch.Tensor, rows: int) -> torch.Tensor:
    """``slots_of`` for an entry tensor of ``rows`` rows per block (packed: fewer than ``block_size``; the row of the
    closing token ``pos``) -> flat rows [B, K] int64, -1 where pos < 0."""
    bt = block_tables.long()
    p = pos.clamp(min=0)
    blk = bt.gather(1, (p // block_size).clamp(max=bt.shape[1] - 1))
    return torch.where(pos >= 0, packed_slot(blk, p, block_size, rows), -1)


def gather_rows(cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """cache [N, bs, S], slots [B, K] (-1 allowed: reads slot 0) -> rows [B, K, S] in ``dtype``."""
    return cache.flatten(0, 1)[slots.clamp(min=0)].to(dtype)


def closing_entry(pooler, kv_cache: torch.Tensor, gate_cache: torch.Tensor, t: torch.Tensor, bt: torch.Tensor,
                  bs: int, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per row b, the entry of the window ending at ``t[b]`` (valid only where ``(t + 1) % rate == 0``), pooled as
    ``compressor.pool_windows`` from the cached raw rows -> [B, d]. ``cos/sin``: the full ``compress`` tables."""
    m, d = pooler.rate, pooler.dim
    span = 2 * m if pooler.overlap else m
    pos = t[:, None] - span + 1 + torch.arange(span, device=t.device)  # [B, span]
    slots = slots_of(bt, bs, pos)
    kv = gather_rows(kv_cache, slots, dtype)  # [B, span, c*d]
    gate = gather_rows(gate_cache, slots, torch.float32)
    bias = pooler.position_bias.float()  # [m, c*d]
    if pooler.overlap:  # the previous window's Ca half, then this window's Cb half
        kv = torch.cat([kv[:, :m, :d], kv[:, m:, d:]], dim=1)  # [B, 2m, d]
        gate = torch.cat([gate[:, :m, :d] + bias[:, :d], gate[:, m:, d:] + bias[:, d:]], dim=1)
    else:
        gate = gate + bias
    gate = gate.masked_fill((pos < 0)[:, :, None], float("-inf"))
    w = gate.softmax(dim=1, dtype=torch.float32).to(kv.dtype)
    pooled = pooler.kv_norm((kv * w).sum(dim=1))  # [B, d]
    start = (t // m) * m  # the window's first position: where its entry is rope'd
    return rope_tail(pooled[:, None], cos[start], sin[start])[:, 0]


def decode_attention(attn, q: torch.Tensor, q_res: torch.Tensor, h: torch.Tensor, raw: dict, positions: torch.Tensor,
                     rope: dict, caches: dict, meta) -> torch.Tensor:
    """One decode step of a ``V4Attention`` layer: q [B, H, hd] rope'd, q_res [B, q_lora], h [B, D] (the layer's
    normed input), raw: the new rows by cache name, caches: cache tensors by name -> attention out [B, H, hd]
    (before the output de-rotation). Writes the new rows and any closing entries into ``caches``."""
    cfg, comp = attn.cfg, attn.compressor
    bs, bt, t = meta.block_size, meta.block_tables, positions.long()
    for name, r in raw.items():
        write_rows(caches[name], r, meta.slot_mapping, meta.has_padding)
    W = cfg.sliding_window
    win = slots_of(bt, bs, t[:, None] - W + 1 + torch.arange(W, device=t.device))  # [B, W]
    ent_cache = ent = None
    if comp is not None:
        cos_c, sin_c = rope["compress"]
        m = comp.rate
        closes = (t + 1) % m == 0
        ebt = meta.entry_block_tables  # entries: the whole-sequence table (the same as bt unless hybrid)
        R = caches["centry"].shape[1]  # entry rows per block (packed: fewer than bs)
        # through the whole-sequence table; a padded row (slot -1) writes nothing
        entry_slots = torch.where(closes & (meta.slot_mapping >= 0), entry_slots_of(ebt, bs, t[:, None], R)[:, 0], -1)
        new = closing_entry(comp, caches["ckv"], caches["cgate"], t, bt, bs, cos_c, sin_c, q.dtype)
        write_rows(caches["centry"], new, entry_slots)
        n = ebt.shape[1] * bs // m  # every window the table can hold
        w = torch.arange(n, device=t.device)
        visible = w[None, :] < ((t + 1) // m)[:, None]  # [B, n]
        ent = torch.where(visible, entry_slots_of(ebt, bs, ((w + 1) * m - 1)[None, :].expand(t.shape[0], -1), R), -1)
        ent_cache = caches["centry"]
        idx = comp.indexer
        if idx is not None and n > 0:
            inew = closing_entry(idx, caches["ikv"], caches["igate"], t, bt, bs, cos_c, sin_c, q.dtype)
            write_rows(caches["ientry"], inew, entry_slots)
            ent = select_entries(idx, h, q_res, cos_c[t], sin_c[t], gather_rows(caches["ientry"], ent, q.dtype),
                                 visible, ent, limits=(t + 1) // m)
    return ssd.sparse_sink_decode(q, caches["kv"], win, ent_cache, ent, attn.sinks, attn.scale,
                                  use_triton=attn.sparse_kernel, config=attn.kernel_config)


def select_entries(idx, h: torch.Tensor, q_res: torch.Tensor, cos_q: torch.Tensor, sin_q: torch.Tensor,
                   keys: torch.Tensor, visible: torch.Tensor, slots: torch.Tensor,
                   limits: torch.Tensor | None = None) -> torch.Tensor:
    """The CSA indexer's choice with a fixed width: h [B, D], q_res [B, q_lora], cos/sin_q [B, r/2], keys [B, n, Di],
    visible [B, n], slots [B, n] -> selected slots [B, min(topk, n)] (-1: not visible). Same scores (``Indexer.scores``,
    the Triton kernel where ``idx.score_kernel``: one query row per batch row) and tie rule as ``Indexer.select``.
    ``limits`` [B] (optional): ``visible == arange(n) < limits[:, None]`` (the kernel then masks by position)."""
    B, n = visible.shape
    qi = rope_tail(idx.q_b_proj(q_res).view(B, idx.n_heads, idx.dim), cos_q, sin_q)
    wts = idx.scorer.weights_proj(h).float() * idx.n_heads**-0.5  # [B, Hi]
    lim = None if limits is None else limits[:, None]
    scores = idx.scores(qi[:, None], keys, wts[:, None], visible[:, None], lim)[:, 0]  # [B, n]
    k = min(idx.topk, n)
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]
    return torch.where(visible.gather(1, order), slots.gather(1, order), -1)
