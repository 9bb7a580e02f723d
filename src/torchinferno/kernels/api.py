"""Dispatching kernel entry points: Triton on CUDA tensors (when Triton is installed), torch elsewhere.

The choice is made from the tensors' device on each call (never from environment variables).
The torch paths are the references the Triton kernels are tested against (``tests/kernels``);
the element-wise ones have float32 oracles in ``kernels.reference`` too.

Paged KV layout used by the attention entry points: caches ``[num_blocks, block_size, Hkv, D]``
(``Dv`` for values), ``block_tables [B, max_blocks]`` int32, ``seq_lens [B]`` int32; token ``p`` of
row ``b`` lives at block ``block_tables[b, p // block_size]``, row ``p % block_size``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torchinferno.kernels import triton as _tri
from torchinferno.kernels.kv_dtype import gather_blocks, store_rows
from torchinferno.models.common.attention_metadata import leading_decodes


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] -> [..., D] in x.dtype; fp32 accumulation."""
    if _tri.usable(x):
        from torchinferno.kernels.triton import norm

        return norm.rms_norm(x, weight, eps)
    D = x.shape[-1]
    out = torch.layer_norm(torch.cat((x, x.neg()), -1), (2 * D,), None, None, eps)[..., :D] * weight  # see add_rms_norm
    return out if out.dtype == x.dtype else out.to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """Returns (rms_norm(x + residual), x + residual).

    Torch path: ``[h, -h]`` has mean 0 and variance ``mean(h^2)``, so LayerNorm's single fused
    kernel (fp32 statistics) computes ``h * rsqrt(mean(h^2) + eps)`` on its first half. The usual
    eager chain (cast, square, mean, add, rsqrt, mul, mul, cast) costs about twice as much per
    call at decode sizes, where per-op overhead dominates. Rounding order as transformers'
    LlamaRMSNorm: the normalized value is rounded to x.dtype, then multiplied by the weight.
    """
    if _tri.usable(x):
        from torchinferno.kernels.triton import norm

        return norm.add_rms_norm(x, residual, weight, eps)
    h = x + residual
    D = h.shape[-1]
    out = torch.layer_norm(torch.cat((h, h.neg()), -1), (2 * D,), None, None, eps)[..., :D] * weight  # [..., D]
    return (out if out.dtype == h.dtype else out.to(h.dtype)), h


def swiglu_activation(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2I] -> silu(gate) * up [..., I]."""
    if _tri.usable(gate_up):
        from torchinferno.kernels.triton import activation

        return activation.swiglu_activation(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotary_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D], cos/sin [T, D/2] -> x rotated by halves, in x.dtype.

    The torch path also takes the full-width tables of :func:`rotary_tables_neox` (``[T, 1, D]``),
    which spare it the per-call table work.
    """
    if _tri.usable(x):
        from torchinferno.kernels.triton import rotary

        return rotary.rotary_neox(x, cos, sin)
    if cos.dim() == 2:
        cos, sin = rotary_tables_neox(cos, sin, x.dtype)
    # x * [cos, cos] + [x2, x1] * [-sin, sin] == cat(x1 c - x2 s, x2 c + x1 s): three ops instead of ~10.
    # Rounding (bf16): x * cos is rounded, then the sum once (before: each product and the sum).
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin)


def rotary_tables_neox(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[T, D/2]`` (fp32) -> the tables :func:`rotary_neox` consumes fastest, in dtype.

    Built once per forward and shared by every layer's call: the same tables cast for Triton; on
    the torch path the full-width ``([cos, cos], [-sin, sin])`` ``[T, 1, D]``.
    """
    if _tri.usable(cos):
        return cos.to(dtype), sin.to(dtype)
    c = cos.to(dtype)[:, None, :]
    s = sin.to(dtype)[:, None, :]
    return torch.cat((c, c), dim=-1), torch.cat((-s, s), dim=-1)


# --------------------------------------------------------------- one-row decode GEMVs with fused small ops
def decode_gemv(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None, *,
                residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
                second_weight: torch.Tensor | None = None, **launch) -> torch.Tensor:
    """``x [K] -> [N]``: ``rms_norm(x) @ weight.T + residual`` (norm and residual optional); with ``second_weight
    [N2, K]`` its rows follow in the same output (``[N + N2]``, one launch on CUDA; the tile's ``block_n`` must
    divide ``N``).

    CUDA: one Triton kernel (``kernels/triton/decode_gemv.py``; ``launch``: ``pdl``, ``config``). Elsewhere
    ``kernels.reference.ref_decode_gemv`` (written into ``out`` when given).
    """
    if _tri.usable(x):
        from torchinferno.kernels.triton import decode_gemv as dg

        return dg.gemv(x, weight, out, residual=residual, norm_weight=norm_weight, eps=eps,
                       second_weight=second_weight, **launch)
    from torchinferno.kernels.reference import ref_decode_gemv

    if second_weight is not None:
        weight = torch.cat([weight, second_weight])
    y = ref_decode_gemv(x, weight, residual, norm_weight, eps)
    return y if out is None else out.copy_(y)


def decode_gemv_swiglu(x: torch.Tensor, gate_up_weight: torch.Tensor, *, norm_weight: torch.Tensor | None = None,
                       eps: float = 1e-6, **launch) -> torch.Tensor:
    """``x [K] -> silu(g) * u [I]``, ``g, u`` the halves of ``rms_norm(x) @ gate_up_weight.T``."""
    if _tri.usable(x):
        from torchinferno.kernels.triton import decode_gemv as dg

        return dg.gemv_swiglu(x, gate_up_weight, norm_weight=norm_weight, eps=eps, **launch)
    from torchinferno.kernels.reference import ref_decode_gemv_swiglu

    return ref_decode_gemv_swiglu(x, gate_up_weight, norm_weight, eps)


def decode_gemv_rope_kv(x: torch.Tensor, qkv_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        k_cache: torch.Tensor, v_cache: torch.Tensor, slot: torch.Tensor, num_heads: int,
                        num_kv_heads: int, head_dim: int, *, norm_weight: torch.Tensor | None = None,
                        eps: float = 1e-6, **launch) -> torch.Tensor:
    """``x [K]`` -> rotated queries ``[num_heads * head_dim]``; rotated K and V stored at ``slot`` (< 0: none)."""
    if _tri.usable(x):
        from torchinferno.kernels.triton import decode_gemv as dg

        return dg.gemv_rope_kv(x, qkv_weight, cos, sin, k_cache, v_cache, slot, num_heads, num_kv_heads, head_dim,
                               norm_weight=norm_weight, eps=eps, **launch)
    from torchinferno.kernels.reference import ref_decode_gemv_rope_kv

    return ref_decode_gemv_rope_kv(x, qkv_weight, cos, sin, k_cache, v_cache, slot, num_heads, num_kv_heads,
                                   head_dim, norm_weight, eps)


# --------------------------------------------------------------------------- paged KV cache ops
def write_kv_cache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """KV append: ``k [T, Hkv, D]``, ``v [T, Hkv, Dv]`` into the caches at flat ``slot_mapping [T]``.

    A slot of ``-1`` writes nothing (padded rows). In place; no host sync on the CUDA path.
    """
    if _tri.usable(k):
        from torchinferno.kernels.triton import kv_cache

        return kv_cache.write_kv_cache(k, v, k_cache, v_cache, slot_mapping)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    store_rows(k_cache, slots, k[keep])
    store_rows(v_cache, slots, v[keep])


def _gather_rows(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """[length, Hkv, D]: the first ``length`` cached tokens of one block-table row."""
    bs = cache.shape[1]
    nb = -(-length // bs)
    return gather_blocks(cache, block_table[:nb].long()).reshape(nb * bs, *cache.shape[2:])[:length]


def paged_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              query_lens: list[int], seq_lens: list[int], block_tables: torch.Tensor,
                              scale: float) -> torch.Tensor:
    """Torch oracle for every paged attention path (decode, prefill, extend, mixed), fp32 math.

    ``q [T, H, D]`` holds ``query_lens[b]`` consecutive tokens of sequence ``b``; they sit at the
    last positions of its ``seq_lens[b]`` cached tokens and attend causally. -> ``[T, H, Dv]``.
    """
    H = q.shape[1]
    acc = torch.promote_types(q.dtype, torch.float32)  # fp32 math, fp64 when given fp64
    out = torch.empty(q.shape[0], H, v_cache.shape[-1], dtype=q.dtype, device=q.device)
    start = 0
    for b, (ql, sl) in enumerate(zip(query_lens, seq_lens)):
        k = _gather_rows(k_cache, block_tables[b], sl).to(acc)  # [S, Hkv, D]
        v = _gather_rows(v_cache, block_tables[b], sl).to(acc)
        rep = H // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)  # [S, H, D]
        qb = q[start:start + ql].to(acc)  # [ql, H, D]
        s = torch.einsum("qhd,shd->hqs", qb, k) * scale
        qpos = torch.arange(sl - ql, sl, device=q.device)
        mask = torch.arange(sl, device=q.device)[None, :] <= qpos[:, None]  # [ql, S]
        p = s.masked_fill(~mask[None], float("-inf")).softmax(-1)
        out[start:start + ql] = torch.einsum("hqs,shd->qhd", p, v).to(q.dtype)
        start += ql
    return out


def batched_paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                   block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                                   num_splits: int | None = None, seq_lens_list: list[int] | None = None,
                                   **launch) -> torch.Tensor:
    """One query per row: ``q [B, H, D]`` attends to ``seq_lens[b]`` cached tokens -> ``[B, H, Dv]``.

    GQA when ``H > Hkv``; rows may have any lengths. On CUDA this is the split-K Triton kernel
    (``num_splits`` defaults to a shape-only heuristic, so the call is CUDA-graph capturable;
    ``launch``: its ``pdl`` / ``merge_counters`` / ``config`` options).
    ``seq_lens_list`` (host copy) spares the torch path a device sync.
    """
    if _tri.usable(q):
        from torchinferno.kernels.triton import decode_attention

        return decode_attention.batched_paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale,
                                                               num_splits, **launch)
    lens = seq_lens_list if seq_lens_list is not None else [int(x) for x in seq_lens.tolist()]
    return paged_attention_reference(q, k_cache, v_cache, [1] * len(lens), lens, block_tables, scale)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_table: torch.Tensor, seq_len: int, scale: float) -> torch.Tensor:
    """One sequence: ``q [H, D]`` over its ``seq_len`` cached tokens (``block_table [max_blocks]``) -> ``[H, Dv]``."""
    seq_lens = torch.tensor([seq_len], dtype=torch.int32, device=q.device)
    return batched_paged_decode_attention(q[None], k_cache, v_cache, block_table[None], seq_lens, scale,
                                          seq_lens_list=[seq_len])[0]


def graph_padded_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                           scale: float, decode_rows: bool = True) -> torch.Tensor:
    """Causal attention of a graph-padded ragged batch (``AttentionMetadata.graph_padded``) over the paged cache,
    reading device tensors only: one launch of the varlen prefill kernel over a grid set by the shapes
    (``q [T, H, D]``, ``T`` sequences, the trailing ones empty), so it can be captured for any live step of up to
    ``T`` tokens. Decode rows are one-token sequences of the same kernel, computed on their query heads' rows alone
    (``decode_rows``; False: on a whole query tile, as a prompt's). Rows that belong to no live sequence come out
    zero. The caches must already hold the new tokens' K/V. Triton only (CUDA, or its interpreter)."""
    if not _tri.usable(q):
        raise RuntimeError("graph-padded attention needs the Triton kernels (a CUDA device)")
    from torchinferno.kernels.triton import prefill_attention

    out = torch.zeros(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype, device=q.device)
    return prefill_attention.paged_prefill_attention(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables,
                                                     scale, num_tokens=q.shape[0], out=out, decode_rows=decode_rows)


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                            scale: float, query_lens_list: list[int], seq_lens_list: list[int]) -> torch.Tensor:
    """Causal attention of a flattened ragged batch over the paged cache (prefill, chunked prefill,
    prefix-cache extend, mixed with decodes). The caches must already hold the new tokens' K/V.

    ``q [T, H, D]`` -> ``[T, H, Dv]``. On CUDA: decode rows (a leading run of one-token queries)
    go to the split-K decode kernel and the rest to the Triton varlen prefill kernel.
    """
    if _tri.usable(q):
        from torchinferno.kernels.triton import decode_attention, prefill_attention

        out = torch.empty(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype, device=q.device)
        nd = leading_decodes(query_lens_list)
        if nd:
            decode_attention.batched_paged_decode_attention(q[:nd], k_cache, v_cache, block_tables[:nd], seq_lens[:nd],
                                                            scale, out=out[:nd])
        if nd < len(query_lens_list):
            prefill_attention.paged_prefill_attention(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables,
                                                      scale, num_tokens=q.shape[0] - nd, first_seq=nd, q_base=nd, out=out)
        return out
    return paged_attention_reference(q, k_cache, v_cache, query_lens_list, seq_lens_list, block_tables, scale)
