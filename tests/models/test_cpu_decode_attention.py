"""TorchAttention's decode step (one query per sequence) vs ``paged_attention_reference``.

Covers the strided-view path (each sequence's context at the head of its own block, rows
consecutive: the static generator's layout), with equal lengths (one strided K/V write) and
ragged ones (masked), and the gather path (rows in any order, paged blocks). The cache
contents after the write are checked against ``write_kv`` too.
"""

from __future__ import annotations

import pytest
import torch

from torchinferno.kernels.api import paged_attention_reference
from torchinferno.models.common.attention import TorchAttention, write_kv
from torchinferno.models.common.attention_metadata import (
    AttentionMetadata,
    build_attention_metadata,
)


def _decode_meta(rows: list[int], lens: list[int], block_size: int) -> AttentionMetadata:
    """One new token per row at position lens[b] - 1, row b's context in cache block rows[b]."""
    meta = build_attention_metadata([1] * len(rows), [n - 1 for n in lens], [[r] for r in rows], block_size)
    meta.block_tables_host = [[r] for r in rows]
    return meta


def _case(rows, lens, H=6, Hkv=2, D=16, Dv=None, block_size=12, num_blocks=7, q_dtype=torch.float32,
          cache_dtype=torch.float32, meta=None, seed=0):
    Dv = Dv or D
    g = torch.Generator().manual_seed(seed)
    kc = torch.randn(num_blocks, block_size, Hkv, D, generator=g).to(cache_dtype)
    vc = torch.randn(num_blocks, block_size, Hkv, Dv, generator=g).to(cache_dtype)
    B = len(rows)
    q = torch.randn(B, H, D, generator=g).to(q_dtype)
    k = torch.randn(B, Hkv, D, generator=g).to(q_dtype)
    v = torch.randn(B, Hkv, Dv, generator=g).to(q_dtype)
    meta = meta or _decode_meta(rows, lens, block_size)
    want_k, want_v = kc.clone(), vc.clone()
    write_kv(want_k, k, meta.slot_mapping)
    write_kv(want_v, v, meta.slot_mapping)
    attn = TorchAttention(H, Hkv, D**-0.5)
    with torch.inference_mode():
        out = attn(q, k, v, (kc, vc), meta)
    want = paged_attention_reference(q.float(), want_k.float(), want_v.float(), [1] * B, meta.seq_lens_list,
                                     meta.block_tables, D**-0.5)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    return out, want


@pytest.mark.parametrize("rows,lens", [
    ([0], [1]),  # first decode token: context of one
    ([3], [12]),  # context fills the block
    ([2, 3, 4], [9, 9, 9]),  # consecutive rows, equal lengths: strided write
    ([1, 2, 3, 4], [5, 12, 1, 7]),  # consecutive rows, ragged: masked
    ([4, 0, 2], [6, 6, 6]),  # rows out of order: gather path
])
@pytest.mark.parametrize("H,Hkv", [(6, 2), (4, 4)])
def test_decode_matches_reference(rows, lens, H, Hkv):
    out, want = _case(rows, lens, H=H, Hkv=Hkv)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_decode_value_head_dim_differs():
    out, want = _case([1, 2], [4, 8], D=16, Dv=24)
    assert out.shape == (2, 6, 24)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_decode_bf16_activations_fp32_cache():
    # the CPU generator's configuration: bf16 model, fp32 cache (attention computes in fp32)
    out, want = _case([0, 1], [10, 10], q_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


def test_decode_bf16_cache():
    out, want = _case([0, 1, 2], [3, 10, 10], q_dtype=torch.bfloat16, cache_dtype=torch.bfloat16)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


def test_decode_paged_multiblock_uses_gather():
    # contexts longer than a block: paged tables (no strided-view path)
    tables = [[5, 1], [0, 6]]
    meta = build_attention_metadata([1, 1], [6, 3], tables, 4)
    meta.block_tables_host = tables
    out, want = _case([5, 0], [7, 4], block_size=4, meta=meta)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_decode_on_cache_views():
    # caches that are views into a larger buffer (non-zero storage offset): strided views must honour it
    g = torch.Generator().manual_seed(5)
    buf_k = torch.randn(2, 6, 12, 2, 16, generator=g)
    buf_v = torch.randn(2, 6, 12, 2, 16, generator=g)
    kc, vc = buf_k[1], buf_v[1]  # contiguous views with storage offset
    other = buf_k[0].clone()
    q, k, v = torch.randn(2, 6, 16, generator=g), torch.randn(2, 2, 16, generator=g), torch.randn(2, 2, 16, generator=g)
    meta = _decode_meta([3, 4], [7, 7], 12)
    want_k, want_v = kc.clone(), vc.clone()
    write_kv(want_k, k, meta.slot_mapping)
    write_kv(want_v, v, meta.slot_mapping)
    with torch.inference_mode():
        out = TorchAttention(6, 2, 0.25)(q, k, v, (kc, vc), meta)
    want = paged_attention_reference(q, want_k, want_v, [1, 1], [7, 7], meta.block_tables, 0.25)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v) and torch.equal(buf_k[0], other)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shapes,dense", [
    ([(6, 1), (11, 1), (2, 1), (0, 9)], True),     # three decodes (dense rows, ragged) + a fresh prompt
    ([(6, 1), (11, 1), (3, 5), (0, 4)], False),    # two decodes (paged) + a chunk over cached context + a prompt
    ([(5, 1), (0, 1), (4, 3)], False),             # a one-token fresh prompt among the leading one-token queries
    ([(0, 7), (6, 1), (9, 1)], False),             # decodes after a prompt: not leading, per-row path
])
def test_mixed_step_leading_decodes_batched(shapes, dense):
    """A mixed step's leading one-token queries go through one batched decode call (session 30): the output and
    the cache writes == paged_attention_reference on the whole step, dense-row and paged layouts."""
    g = torch.Generator().manual_seed(7)
    H, Hkv, D, bs = 6, 2, 16, 4
    nb = [-(-(c + q) // bs) for c, q in shapes]
    if dense:  # sequence b's context at the head of its own big block r0 + b (the strided-view path)
        bs = max(c + q for c, q in shapes)
        tables = [[2 + b] for b in range(len(shapes))]
    else:
        perm = (torch.randperm(40, generator=g) + 1).tolist()
        tables = [[perm.pop() for _ in range(n)] for n in nb]
    width = max(len(t) for t in tables)
    meta = build_attention_metadata([q for _, q in shapes], [c for c, _ in shapes],
                                    [t + [0] * (width - len(t)) for t in tables], bs)
    meta.block_tables_host = tables
    kc, vc = torch.randn(42, bs, Hkv, D, generator=g), torch.randn(42, bs, Hkv, D, generator=g)
    T = sum(q for _, q in shapes)
    q, k, v = (torch.randn(T, h, D, generator=g) for h in (H, Hkv, Hkv))
    want_k, want_v = kc.clone(), vc.clone()
    write_kv(want_k, k, meta.slot_mapping)
    write_kv(want_v, v, meta.slot_mapping)
    with torch.inference_mode():
        out = TorchAttention(H, Hkv, D**-0.5)(q, k, v, (kc, vc), meta)
    want = paged_attention_reference(q, want_k, want_v, meta.query_lens_list, meta.seq_lens_list, meta.block_tables,
                                     D**-0.5)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
