"""V3.2 sparse DSA decode (``DeepSeekMLA._decode_sparse``: indexer top-k -> flat latent slots -> absorbed attention
over those rows only) against the dense path (every cached row, the indexer's keep-mask applied), on CPU with the
reference ops. The interpreter / CUDA kernel checks are in tests/kernels/test_dsa_sparse_decode.py."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest
import torch

from torchinferno.models.common import mla
from torchinferno.models.common.attention_metadata import build_attention_metadata, positions_for
from torchinferno.models.deepseek_v32 import model as v32_model
from torchinferno.models.deepseek_v32 import raw_ops
from torchinferno.models.deepseek_v32.config import tiny_deepseek_v32_config
from torchinferno.models.deepseek_v32.model import DeepSeekMLA
from torchinferno.models.registry import get_family
from torchinferno.testing import randomize_

FAM = get_family("deepseek-v3.2")
V = 320
BS = 4  # block size
TOPK8 = replace(tiny_deepseek_v32_config(), index_topk=8)
TIES = replace(tiny_deepseek_v32_config(), index_n_heads=4, index_topk=5)  # exact-zero (tied) scores happen


def set_sparse(m, sparse: bool):
    for a in m.modules():
        if isinstance(a, DeepSeekMLA):
            a.sparse_decode = sparse
    return m


def make(cfg, sparse: bool = True, variant: str = "v0", seed: int = 0):
    torch.manual_seed(seed)
    m = randomize_(FAM.build(cfg, device="cpu", variant=variant).eval(), correction_bias=0.3)
    return set_sparse(m, sparse)


def twin(m, variant: str = "v0", sparse: bool = True):
    other = FAM.build(m.config, device="cpu", variant=variant).eval()
    other.load_state_dict(m.state_dict())
    return set_sparse(other.to(next(m.parameters()).device), sparse)


def decode(m, prompt_lens: list[int], steps: int, device="cpu", seed: int = 7, capture_shaped: bool = False):
    """Prefill every row (one step, ragged), then ``steps`` batched decode steps over shuffled paged tables.
    -> the decode steps' logits [steps * B, V]. ``capture_shaped``: decode steps carry the host placeholder a CUDA
    graph capture gets (``seq_lens_list`` = the whole table width; only the device ``seq_lens`` are true)."""
    g = torch.Generator().manual_seed(seed)
    B = len(prompt_lens)
    per = -(-(max(prompt_lens) + steps) // BS)
    perm = torch.randperm(B * per, generator=g).view(B, per)
    caches = FAM.kv_spec(m.config).allocate(B * per, BS, torch.float32, device)
    ids = [torch.randint(0, V, (n + steps,), generator=g) for n in prompt_lens]
    done, out = [0] * B, []
    for step in range(steps + 1):
        qlens = list(prompt_lens) if step == 0 else [1] * B
        meta = build_attention_metadata(qlens, done, perm, BS, device=device)
        if step and capture_shaped:
            meta = dataclasses.replace(meta, seq_lens_list=[per * BS] * B)
        x = torch.cat([ids[b][done[b] : done[b] + q] for b, q in enumerate(qlens)]).to(device)
        with torch.no_grad():
            logits = m.compute_logits(m(x, positions_for(qlens, done, device), caches, meta))
        if step:
            out.append(logits)
        done = [d + q for d, q in zip(done, qlens)]
    return torch.cat(out)


@pytest.fixture
def sparse_calls(monkeypatch):
    calls = []
    real = raw_ops.mla_sparse_absorbed_attention
    monkeypatch.setattr(raw_ops, "mla_sparse_absorbed_attention", lambda *a, **kw: calls.append(a[-1]) or real(*a, **kw))
    return calls


@pytest.mark.parametrize("cfg", [TOPK8, TIES], ids=["topk8", "ties-topk5"])
def test_sparse_decode_equals_dense_masked(cfg, sparse_calls):
    """Rows of different lengths (2, 9, 20 prompt tokens; 20 decode steps: below, across and far past top-k)."""
    sparse = make(cfg, sparse=True)
    dense = twin(sparse, sparse=False)
    got = decode(sparse, [2, 9, 20], steps=20)
    n_sparse = len(sparse_calls)
    want = decode(dense, [2, 9, 20], steps=20)
    assert n_sparse > 0 and len(sparse_calls) == n_sparse, "the sparse path must run (and only in the sparse model)"
    slots = sparse_calls[-1]
    assert slots.shape == (3, cfg.index_topk) and bool((slots >= 0).all())
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_fewer_visible_than_topk_pads_with_minus_one(sparse_calls):
    """One row past top-k makes the batch sparse; the short row keeps all its keys (slots -1 past its length)."""
    sparse = make(TOPK8, sparse=True)
    got = decode(sparse, [2, 12], steps=3)
    want = decode(twin(sparse, sparse=False), [2, 12], steps=3)
    slots = sparse_calls[0]  # first decode step: lengths 3 and 13
    assert slots.shape == (2, 8)
    assert int((slots[0] >= 0).sum()) == 3 and int((slots[1] >= 0).sum()) == 8
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_capture_shaped_steps_equal_dense(sparse_calls):
    """Host lengths replaced by the table width (what a capture sees): the device lengths alone mask correctly."""
    sparse = make(TOPK8, sparse=True)
    got = decode(sparse, [2, 9, 20], steps=8, capture_shaped=True)
    want = decode(twin(sparse, sparse=False), [2, 9, 20], steps=8)
    assert len(sparse_calls) == 8 * TOPK8.num_hidden_layers
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_off_by_one_slot_is_caught(monkeypatch):
    """Sabotage: slots shifted by one row (the next token's latent) must change the logits."""
    sparse = make(TOPK8, sparse=True)
    want = decode(twin(sparse, sparse=False), [2, 9, 20], steps=6)
    real = mla.selected_slots

    def shifted(pos, lens, tables, bs):
        s = real(pos, lens, tables, bs)
        return torch.where(s >= 0, real((pos + 1).clamp(max=pos.max()), lens + 1, tables, bs), s)

    monkeypatch.setattr(v32_model, "selected_slots", shifted)
    got = decode(sparse, [2, 9, 20], steps=6)
    assert (got - want).abs().max() > 1e-3


def test_selected_slots():
    tables = torch.tensor([[5, 2, 7], [1, 0, 3]], dtype=torch.int32)
    pos = torch.tensor([[0, 4, 9, 11], [3, 5, 6, 2]])
    lens = torch.tensor([10, 6])
    want = torch.tensor([[20, 8, 29, -1], [7, 1, -1, 6]])  # bs 4: block tables[b, p // 4] * 4 + p % 4
    assert torch.equal(mla.selected_slots(pos, lens, tables, 4), want)


def test_cuda_graph_flag():
    """Fused ops (paged Triton decode): capturable with the sparse DSA decode, not with the dense one; raw ops never."""
    fused = FAM.build(TOPK8, device="meta", variant="v1")
    raw = FAM.build(TOPK8, device="meta", variant="v0")
    attn = [a for a in fused.modules() if isinstance(a, DeepSeekMLA)]
    assert attn and all(a.supports_cuda_graphs for a in attn)
    set_sparse(fused, False)
    assert not any(a.supports_cuda_graphs for a in attn)
    assert not any(a.supports_cuda_graphs for a in raw.modules() if isinstance(a, DeepSeekMLA))
