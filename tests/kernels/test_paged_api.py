"""CPU checks of the paged-attention entry points and the Triton backend's fallback path."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torchinferno.kernels import api
from torchinferno.models.common.attention import TorchAttention
from torchinferno.models.common.attention_metadata import build_attention_metadata, positions_for
from torchinferno.models.common.attention_triton import TritonPagedAttention
from torchinferno.models.registry import get_family


def _paged(lens, Hkv, D, page, gen):
    nblk = [-(-n // page) for n in lens]
    total = sum(nblk) + 2
    perm = torch.randperm(total, generator=gen)
    bt = torch.zeros(len(lens), max(nblk), dtype=torch.int32)
    i = 0
    for b, nb in enumerate(nblk):
        bt[b, :nb] = perm[i:i + nb].to(torch.int32)
        i += nb
    return (torch.randn(total, page, Hkv, D, generator=gen, dtype=torch.float64),
            torch.randn(total, page, Hkv, D, generator=gen, dtype=torch.float64), bt)


def test_reference_matches_dense_sdpa():
    g = torch.Generator().manual_seed(0)
    lens, qlens = [9, 33], [4, 33]
    kc, vc, bt = _paged(lens, 2, 8, 4, g)
    q = torch.randn(sum(qlens), 4, 8, generator=g, dtype=torch.float64)
    out = api.paged_attention_reference(q, kc, vc, qlens, lens, bt, 0.3)
    start = 0
    for b, (ql, sl) in enumerate(zip(qlens, lens)):
        k = api._gather_rows(kc, bt[b], sl).repeat_interleave(2, 1).transpose(0, 1)
        v = api._gather_rows(vc, bt[b], sl).repeat_interleave(2, 1).transpose(0, 1)
        mask = torch.arange(sl)[None, :] <= torch.arange(sl - ql, sl)[:, None]
        ref = F.scaled_dot_product_attention(q[start:start + ql].transpose(0, 1), k, v, attn_mask=mask, scale=0.3)
        torch.testing.assert_close(out[start:start + ql], ref.transpose(0, 1))
        start += ql


def test_decode_entry_points_cpu():
    g = torch.Generator().manual_seed(1)
    lens = [1, 7, 20]
    kc, vc, bt = _paged(lens, 2, 8, 4, g)
    q = torch.randn(3, 6, 8, generator=g, dtype=torch.float64)
    sl = torch.tensor(lens, dtype=torch.int32)
    out = api.batched_paged_decode_attention(q, kc, vc, bt, sl, 0.5)
    ref = api.paged_attention_reference(q, kc, vc, [1, 1, 1], lens, bt, 0.5)
    torch.testing.assert_close(out, ref)
    one = api.paged_decode_attention(q[2], kc, vc, bt[2], 20, 0.5)
    torch.testing.assert_close(one, ref[2])


def test_write_kv_cache_skips_padded_slots():
    kc = torch.zeros(3, 4, 2, 5)
    vc = torch.zeros(3, 4, 2, 5)
    k = torch.randn(4, 2, 5)
    v = torch.randn(4, 2, 5)
    slots = torch.tensor([5, -1, 0, 11])
    api.write_kv_cache(k, v, kc, vc, slots)
    flat = kc.view(-1, 2, 5)
    assert torch.equal(flat[5], k[0]) and torch.equal(flat[0], k[2]) and torch.equal(flat[11], k[3])
    assert int((flat.abs().sum((1, 2)) > 0).sum()) == 3
    assert torch.equal(vc.view(-1, 2, 5)[11], v[3])


def _pair(dtype=torch.float32, device="cpu"):
    from torchinferno.testing import tiny_model

    ref = tiny_model("llama3", dtype=dtype, device=device)
    fam = get_family("llama3")
    tri = fam.build(ref.config, device=device, variant="v1", attention_backend=TritonPagedAttention).to(dtype).eval()
    tri.load_state_dict(ref.state_dict())
    tri.family = fam
    return ref, tri


def run_prefill_then_mixed(model, device, dtype, block_size=4):
    """Prefill two prompts, then a mixed step (one decode + one chunk of a third prompt with context)."""
    spec = model.family.kv_spec(model.config)
    caches = spec.allocate(24, block_size, dtype, device)
    tables = [[3, 7, 1, 9], [0, 5, 2, 11], [4, 6, 8, 10, 12, 13]]
    g = torch.Generator().manual_seed(3)
    p = [torch.randint(0, 250, (n,), generator=g).tolist() for n in (6, 13, 17)]
    outs = []
    with torch.inference_mode():
        meta = build_attention_metadata([9], [0], [[14, 15, 16]], block_size, device)  # one fresh prompt
        outs.append(model(torch.arange(9, device=device) * 7, positions_for([9], [0], device), caches, meta))
        meta = build_attention_metadata([6, 13, 10], [0, 0, 0], tables, block_size, device)
        ids = torch.tensor(p[0] + p[1] + p[2][:10], device=device)
        outs.append(model(ids, positions_for([6, 13, 10], [0, 0, 0], device), caches, meta))
        meta = build_attention_metadata([1, 7], [6, 10], [tables[0], tables[2]], block_size, device)
        ids = torch.tensor([5] + p[2][10:], device=device)
        outs.append(model(ids, positions_for([1, 7], [6, 10], device), caches, meta))
        meta = build_attention_metadata([1, 1, 1], [7, 13, 17], tables, block_size, device)
        outs.append(model(torch.tensor([1, 2, 3], device=device), positions_for([1, 1, 1], [7, 13, 17], device), caches, meta))
    return outs


def test_triton_backend_falls_back_to_torch_on_cpu():
    ref, tri = _pair()
    for a, b in zip(run_prefill_then_mixed(ref, "cpu", torch.float32), run_prefill_then_mixed(tri, "cpu", torch.float32)):
        torch.testing.assert_close(a, b)
    assert isinstance(tri.model.layers[0].self_attn.attn, TorchAttention)


def _pair_size(size, dtype, device):
    from torchinferno.testing import tiny_model

    ref = tiny_model("llama3", size=size, dtype=dtype, device=device)
    fam = get_family("llama3")
    tri = fam.build(ref.config, device=device, variant="v1", attention_backend=TritonPagedAttention).to(dtype).eval()
    tri.load_state_dict(ref.state_dict())
    tri.init_buffers()
    tri.family = fam
    return ref, tri


import pytest  # noqa: E402


@pytest.mark.cuda
@pytest.mark.parametrize("size,dtype", [("debug", torch.float32), ("debug", torch.bfloat16), ("smollm2-135m", torch.bfloat16)])
def test_triton_backend_matches_torch_backend_cuda(cuda_dev, size, dtype):
    """Prefill of ragged prompts, a mixed decode + chunked-prefill step, then a decode step."""
    ref, tri = _pair_size(size, dtype, cuda_dev)
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    for a, b in zip(run_prefill_then_mixed(ref, cuda_dev, dtype), run_prefill_then_mixed(tri, cuda_dev, dtype)):
        rel = float((a.float() - b.float()).norm() / a.float().norm())
        assert rel < tol, rel


def test_perf_smoke_cli_cpu(capsys):
    from torchinferno.cli.main import main

    rc = main(["perf-smoke", "--device", "cpu", "--seq-len", "40", "--heads", "4", "--kv-heads", "2",
               "--head-dim", "16", "--iters", "1", "--dtype", "float32"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "specialized (api)" in out and "max err" in out
