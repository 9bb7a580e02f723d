"""Numerics of every Triton kernel vs a float64 torch reference (CUDA + Triton only).

The ``check_*`` helpers take the device so the same checks also run under Triton's CPU
interpreter when debugging a kernel (fp16/fp32 there: the interpreter has no bf16).
Outputs are poisoned with NaN before each launch, so an unwritten element fails the check.
"""

from __future__ import annotations

import pytest
import torch

from torchinferno.kernels import api
from torchinferno.kernels.reference import ref_add_rms_norm, ref_rms_norm, ref_rotary_neox, ref_swiglu

TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 1.5e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    assert not torch.isnan(out).any(), "NaN in output (unwritten element?)"
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def paged_setup(lens, H, Hkv, D, DV, page, dtype, dev, gen, extra_blocks=3):
    """Random caches with shuffled block tables: rows own disjoint random blocks."""
    nblk = [-(-n // page) for n in lens]
    total = sum(nblk) + extra_blocks
    perm = torch.randperm(total, generator=gen)
    width = max(nblk)
    bt = torch.zeros(len(lens), width, dtype=torch.int32)
    i = 0
    for b, nb in enumerate(nblk):
        bt[b, :nb] = perm[i:i + nb].to(torch.int32)
        i += nb
    kc = torch.randn(total, page, Hkv, D, generator=gen).to(dtype).to(dev)
    vc = torch.randn(total, page, Hkv, DV, generator=gen).to(dtype).to(dev)
    return kc, vc, bt.to(dev)


def ref_attention64(q, kc, vc, qlens, slens, bt, scale):
    return api.paged_attention_reference(q.double().cpu(), kc.double().cpu(), vc.double().cpu(), qlens, slens,
                                         bt.cpu(), scale)


# ----------------------------------------------------------------------------------- checks
def check_rms_norm(dev, dtype, T=37, D=4096 + 64):
    from torchinferno.kernels.triton import norm

    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, D, generator=g).to(dtype).to(dev)
    r = torch.randn(T, D, generator=g).to(dtype).to(dev)
    w = (torch.rand(D, generator=g) + 0.5).to(dtype).to(dev)
    y = norm.rms_norm(x, w, 1e-5)
    assert rel_err(y, ref_rms_norm(x.cpu().double(), w.cpu().double(), 1e-5)) < TOL[dtype]
    y2, h = norm.add_rms_norm(x, r, w, 1e-5)
    ry, rh = ref_add_rms_norm(x.cpu(), r.cpu(), w.cpu(), 1e-5)  # h rounded to dtype like the kernel
    assert torch.equal(h.cpu(), rh)
    assert rel_err(y2, ref_rms_norm(rh.double(), w.cpu().double(), 1e-5)) < TOL[dtype]


def check_swiglu(dev, dtype, T=19, inter=1000):
    from torchinferno.kernels.triton import activation

    gu = torch.randn(T, 2 * inter, generator=torch.Generator().manual_seed(1)).to(dtype).to(dev)
    assert rel_err(activation.swiglu_activation(gu), ref_swiglu(gu.cpu().double())) < TOL[dtype]


def check_rotary(dev, dtype, T=23, H=5, D=128):
    from torchinferno.kernels.triton import rotary
    from torchinferno.models.common.rope import RopeScaling, rope_cos_sin

    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(T, (H + 4) * D, generator=g).to(dtype).to(dev)
    x = qkv[:, D:(H + 1) * D].view(T, H, D)  # a strided column slice, as in the model
    cos, sin = rope_cos_sin(D, 10000.0, 512, RopeScaling())
    pos = torch.randint(0, 512, (T,), generator=g)
    c, s = cos[pos].to(dev), sin[pos].to(dev)
    out = rotary.rotary_neox(x, c, s)
    assert rel_err(out, ref_rotary_neox(x.cpu().double(), c.cpu().double(), s.cpu().double())) < TOL[dtype]


def check_kv_append(dev, dtype, T=11, Hkv=3, D=64, DV=48, page=16):
    from torchinferno.kernels.triton import kv_cache

    g = torch.Generator().manual_seed(3)
    kc = torch.randn(8, page, Hkv, D, generator=g).to(dtype).to(dev)
    vc = torch.randn(8, page, Hkv, DV, generator=g).to(dtype).to(dev)
    kv = torch.randn(T, Hkv * (D + DV) + 7, generator=g).to(dtype).to(dev)
    k = kv[:, : Hkv * D].view(T, Hkv, D)
    v = kv[:, Hkv * D: Hkv * (D + DV)].view(T, Hkv, DV)
    slots = torch.randperm(8 * page, generator=g)[:T].clone()
    slots[[2, 7]] = -1  # padded rows write nothing
    kref, vref = kc.clone().cpu(), vc.clone().cpu()
    keep = slots >= 0
    kref.view(-1, Hkv, D)[slots[keep]] = k.cpu()[keep]
    vref.view(-1, Hkv, DV)[slots[keep]] = v.cpu()[keep]
    kv_cache.write_kv_cache(k, v, kc, vc, slots.to(dev))
    assert torch.equal(kc.cpu(), kref) and torch.equal(vc.cpu(), vref)


def check_decode(dev, dtype, lens=(1, 17, 300, 1029), H=8, Hkv=2, D=128, DV=128, page=16, num_splits=None, merge=False,
                 pdl=False, config=None):
    from torchinferno.kernels.triton import decode_attention

    g = torch.Generator().manual_seed(4)
    kc, vc, bt = paged_setup(lens, H, Hkv, D, DV, page, dtype, dev, g)
    q = torch.randn(len(lens), H, D, generator=g).to(dtype).to(dev)
    sl = torch.tensor(lens, dtype=torch.int32, device=dev)
    scale = D ** -0.5
    out = torch.full((len(lens), H, DV), float("nan"), dtype=dtype, device=dev)
    counters = torch.zeros(len(lens) * Hkv, dtype=torch.int32, device=dev) if merge else None
    decode_attention.batched_paged_decode_attention(q, kc, vc, bt, sl, scale, num_splits=num_splits, out=out,
                                                    merge_counters=counters, pdl=pdl, config=config)
    ref = ref_attention64(q, kc, vc, [1] * len(lens), list(lens), bt, scale)
    err = rel_err(out, ref)
    assert err < TOL[dtype], err
    if merge:  # the in-kernel merge leaves its counters at zero, so the next call merges again
        assert int(counters.abs().sum()) == 0
        again = torch.full_like(out, float("nan"))
        decode_attention.batched_paged_decode_attention(q, kc, vc, bt, sl, scale, num_splits=num_splits, out=again,
                                                        merge_counters=counters, pdl=pdl, config=config)
        assert torch.equal(again, out) or rel_err(again, ref) < TOL[dtype]


def check_prefill(dev, dtype, qlens=(1, 40, 1, 130, 7), ctxs=(50, 0, 0, 33, 200), H=8, Hkv=2, D=64, DV=64, page=16):
    from torchinferno.kernels.triton import prefill_attention

    g = torch.Generator().manual_seed(5)
    lens = [c + q for c, q in zip(ctxs, qlens)]
    kc, vc, bt = paged_setup(lens, H, Hkv, D, DV, page, dtype, dev, g)
    T = sum(qlens)
    q = torch.randn(T, H, D, generator=g).to(dtype).to(dev)
    qsl = torch.zeros(len(qlens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(qlens), 0)
    sl = torch.tensor(lens, dtype=torch.int32, device=dev)
    scale = D ** -0.5
    out = torch.full((T, H, DV), float("nan"), dtype=dtype, device=dev)
    prefill_attention.paged_prefill_attention(q, kc, vc, qsl.to(dev), sl, bt, scale, out=out)
    ref = ref_attention64(q, kc, vc, list(qlens), lens, bt, scale)
    err = rel_err(out, ref)
    assert err < TOL[dtype], err


# ----------------------------------------------------------------------------------- tests
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(cuda_dev, dtype):
    check_rms_norm(cuda_dev, dtype)
    check_rms_norm(cuda_dev, dtype, T=3, D=64)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu(cuda_dev, dtype):
    check_swiglu(cuda_dev, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary(cuda_dev, dtype):
    check_rotary(cuda_dev, dtype)
    check_rotary(cuda_dev, dtype, H=32, D=64)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_append(cuda_dev, dtype):
    check_kv_append(cuda_dev, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [None, 1, 4, 16])
def test_decode_attention(cuda_dev, dtype, num_splits):
    check_decode(cuda_dev, dtype, num_splits=num_splits)
    check_decode(cuda_dev, dtype, num_splits=num_splits, merge=True)  # splits merged by the last program
    # empty sequences and splits past a short sequence's end (skipped by the in-kernel merge)
    check_decode(cuda_dev, dtype, lens=(0, 1, 63, 64, 65), num_splits=num_splits, merge=True)
    if torch.cuda.get_device_capability()[0] >= 9:  # PDL launch: first tile read before the wait, newest row after
        check_decode(cuda_dev, dtype, num_splits=num_splits, merge=True, pdl=True)
        check_decode(cuda_dev, dtype, num_splits=num_splits, pdl=True)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(32, 8, 128, 128), (4, 4, 64, 64), (9, 3, 64, 64), (16, 1, 96, 80), (8, 1, 576, 512)])
def test_decode_attention_shapes(cuda_dev, shape):
    H, Hkv, D, DV = shape
    check_decode(cuda_dev, torch.bfloat16, lens=(5, 4096, 700), H=H, Hkv=Hkv, D=D, DV=DV)
    check_decode(cuda_dev, torch.bfloat16, lens=(5, 4096, 700), H=H, Hkv=Hkv, D=D, DV=DV, merge=True)
    check_decode(cuda_dev, torch.bfloat16, lens=(33,), H=H, Hkv=Hkv, D=D, DV=DV, page=1)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_attention(cuda_dev, dtype):
    check_prefill(cuda_dev, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(32, 8, 128, 128), (9, 3, 64, 64), (4, 4, 80, 64), (16, 1, 192, 128)])
def test_prefill_attention_shapes(cuda_dev, shape):
    H, Hkv, D, DV = shape
    check_prefill(cuda_dev, torch.bfloat16, qlens=(300, 1, 64), ctxs=(0, 500, 129), H=H, Hkv=Hkv, D=D, DV=DV)


@pytest.mark.cuda
def test_api_dispatch_matches_torch_path(cuda_dev):
    """The public entry points on CUDA equal their CPU (torch) paths within bf16 tolerance."""
    g = torch.Generator().manual_seed(7)
    lens, qlens = [20, 70, 5], [1, 70, 2]
    kc, vc, bt = paged_setup(lens, 8, 2, 64, 64, 16, torch.bfloat16, "cpu", g)
    T = sum(qlens)
    q = torch.randn(T, 8, 64, generator=g).to(torch.bfloat16)
    qsl = torch.tensor([0, 1, 71, 73], dtype=torch.int32)
    sl = torch.tensor(lens, dtype=torch.int32)
    cpu = api.paged_prefill_attention(q, kc, vc, qsl, sl, bt, 0.125, qlens, lens)
    gpu = api.paged_prefill_attention(q.cuda(), kc.cuda(), vc.cuda(), qsl.cuda(), sl.cuda(), bt.cuda(), 0.125, qlens, lens)
    assert rel_err(gpu, cpu) < 1.5e-2
    one = api.paged_decode_attention(q[0].cuda(), kc.cuda(), vc.cuda(), bt[1].cuda(), 70, 0.125)
    ref = api.paged_decode_attention(q[0], kc, vc, bt[1], 70, 0.125)
    assert rel_err(one, ref) < 1.5e-2
    x = torch.randn(5, 256, generator=g).to(torch.bfloat16)
    w = torch.rand(256, generator=g).to(torch.bfloat16)
    assert rel_err(api.rms_norm(x.cuda(), w.cuda(), 1e-6), api.rms_norm(x, w, 1e-6)) < 1.5e-2

