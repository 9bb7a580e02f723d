"""Fused one-row decode GEMVs (kernels/triton/decode_gemv.py) vs the unfused ops they replace, in torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

BF = torch.bfloat16
DT = BF  # activation/weight dtype of the checks (Triton's CPU interpreter rounds bf16 by truncation: debug in fp16)


def _norm_input(x, nw, eps):
    """What the unfused RMSNorm kernel hands the GEMM (fp32 math, one cast)."""
    if nw is None:
        return x
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean() + eps) * nw.float()).to(x.dtype)


def _exact_input(x, nw, eps):
    """float64 GEMV input of the exact math (normalized without rounding)."""
    xd = x.double()
    return xd if nw is None else xd * torch.rsqrt(xd.pow(2).mean() + eps) * nw.double()


def _tensors(dev, n, k, seed, norm=True):
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(k, generator=g, device=dev).to(DT)
    nw = (torch.rand(k, generator=g, device=dev) + 0.5).to(DT) if norm else None
    w = (torch.randn(n, k, generator=g, device=dev) * k**-0.5).to(DT)
    r = torch.randn(n, generator=g, device=dev).to(DT)
    return x, nw, w, r


def _close(out, ref, exact, scale=None):
    """Each element within the unfused reference's own error plus one ulp of ``scale`` (default: the exact
    value; a rounding landing on the other side) and an accumulation-order term."""
    err = (out.double() - exact).abs()
    ref_err = (ref.double() - exact).abs()
    slack = 2.0**-7 * (exact.abs() if scale is None else scale) + 1e-3 * exact.abs().max()
    bad = err > ref_err + slack
    assert not bool(bad.any()), (float(err.max()), float(ref_err.max()), int(bad.sum()))


def check_plain(dev, n, k, norm, add, config=None, pdl=False):
    from torchinferno.kernels.triton import decode_gemv

    x, nw, w, r = _tensors(dev, n, k, n + k, norm)
    y = decode_gemv.gemv(x, w, residual=r if add else None, norm_weight=nw, eps=1e-5, config=config, pdl=pdl)
    ref = F.linear(_norm_input(x, nw, 1e-5).float(), w.float()).to(DT)
    exact = _exact_input(x, nw, 1e-5) @ w.double().t()
    if add:  # the product rounded, then the sum (the unfused linear + add)
        ref, exact = (ref.float() + r.float()).to(DT), exact + r.double()
    _close(y, ref, exact)


def check_swiglu(dev, inter, k, config=None):
    from torchinferno.kernels.triton import decode_gemv

    x, nw, w, _ = _tensors(dev, 2 * inter, k, inter + k)
    y = decode_gemv.gemv_swiglu(x, w, norm_weight=nw, eps=1e-6, config=config)
    gu = F.linear(_norm_input(x, nw, 1e-6).float(), w.float()).to(DT).float()
    ref = (F.silu(gu[:inter]) * gu[inter:]).to(DT)
    g, u = (_exact_input(x, nw, 1e-6) @ w.double().t()).chunk(2)
    _close(y, ref, g * torch.sigmoid(g) * u)


def _rotate(x, cos, sin):
    """Neox rotary of [heads, hd] (fp32 math on the rounded values, tables as stored)."""
    half = x.shape[-1] // 2
    x1, x2 = x[:, :half].float(), x[:, half:].float()
    c, s = cos.float(), sin.float()
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)


def check_rope_kv(dev, nq, nkv, hd, k, slot, cache_dtype=None, norm=True, config=None, pdl=False):
    from torchinferno.kernels.triton import decode_gemv

    cache_dtype = cache_dtype or DT
    x, nw, w, _ = _tensors(dev, (nq + 2 * nkv) * hd, k, nq + hd + k, norm)
    g = torch.Generator(device=dev).manual_seed(7)
    ang = torch.rand(hd // 2, generator=g, device=dev) * 6.0
    cos, sin = ang.cos().to(DT), ang.sin().to(DT)
    blocks, page = 4, 16
    kc = torch.randn(blocks, page, nkv, hd, generator=g, device=dev).to(cache_dtype)
    vc = torch.randn(blocks, page, nkv, hd, generator=g, device=dev).to(cache_dtype)
    kc0, vc0 = kc.clone(), vc.clone()
    slot_t = torch.tensor([slot], dtype=torch.long, device=dev)
    q = decode_gemv.gemv_rope_kv(x, w, cos, sin, kc, vc, slot_t, nq, nkv, hd, norm_weight=nw, eps=1e-5, config=config,
                                 pdl=pdl)
    qkv = F.linear(_norm_input(x, nw, 1e-5).float(), w.float()).to(DT).view(nq + 2 * nkv, hd)
    rot = _rotate(qkv[: nq + nkv], cos, sin).to(DT)
    exact = (_exact_input(x, nw, 1e-5) @ w.double().t()).view(nq + 2 * nkv, hd)
    half = hd // 2
    e1, e2 = exact[:, :half], exact[:, half:]
    c, s = cos.double(), sin.double()
    exact_rot = torch.cat((torch.cat((e1 * c - e2 * s, e2 * c + e1 * s), -1)[: nq + nkv], exact[nq + nkv:]))
    # a rotated element mixes two rounded values: its ulp slack is that of |x1| + |x2|, not of the (maybe
    # cancelled) result
    pair = (e1.abs() + e2.abs()).repeat(1, 2)
    _close(q.view(nq, hd), rot[:nq], exact_rot[:nq], pair[:nq])
    fk, fv = kc.view(-1, nkv, hd), vc.view(-1, nkv, hd)
    fk0, fv0 = kc0.view(-1, nkv, hd), vc0.view(-1, nkv, hd)
    others = torch.arange(fk.shape[0], device=dev) != slot
    assert torch.equal(fk[others].float(), fk0[others].float()) and torch.equal(fv[others].float(), fv0[others].float())
    if slot < 0:
        assert torch.equal(fk.float(), fk0.float()) and torch.equal(fv.float(), fv0.float())
        return
    if cache_dtype == DT:
        _close(fk[slot], rot[nq:], exact_rot[nq:nq + nkv], pair[nq:nq + nkv])
        _close(fv[slot], qkv[nq + nkv:], exact_rot[nq + nkv:])
    else:  # the FP8 store of the same values: saturate, round (kernels.kv_dtype)
        from torchinferno.kernels.kv_dtype import kv_store_values

        for got, want in ((fk[slot], rot[nq:]), (fv[slot], qkv[nq + nkv:])):
            diff = (got.float() - kv_store_values(want, cache_dtype).float()).abs()
            assert float(diff.max()) <= 0.13 * float(want.float().abs().max()), float(diff.max())


@pytest.mark.cuda
@pytest.mark.parametrize("n,k,norm,add", [(256, 512, False, False), (300, 1000, True, False), (4096, 1024, True, True),
                                          (64, 4096, True, True)])
def test_decode_gemv_plain_and_norm_prologue(cuda_dev, n, k, norm, add):
    check_plain(cuda_dev, n, k, norm, add)


@pytest.mark.cuda
@pytest.mark.parametrize("cfg", [None, {"block_n": 8, "block_k": 256, "num_warps": 8, "num_stages": 4}])
@pytest.mark.parametrize("inter,k", [(384, 256), (1000, 768)])
def test_decode_gemv_swiglu_epilogue(cuda_dev, inter, k, cfg):
    check_swiglu(cuda_dev, inter, k, cfg)


@pytest.mark.cuda
@pytest.mark.parametrize("nq,nkv,hd,k,slot", [(4, 2, 64, 256, 5), (8, 2, 128, 512, 63), (4, 4, 32, 300, 0),
                                              (4, 2, 64, 256, -1)])
def test_decode_gemv_rope_kv_epilogue(cuda_dev, nq, nkv, hd, k, slot):
    check_rope_kv(cuda_dev, nq, nkv, hd, k, slot, config={"block_n": 16})


@pytest.mark.cuda
def test_decode_gemv_rope_kv_fp8_cache_and_pdl(cuda_dev):
    check_rope_kv(cuda_dev, 8, 2, 128, 512, 17, cache_dtype=torch.float8_e4m3fn)
    if torch.cuda.get_device_capability()[0] >= 9:  # programmatic dependent launch: Hopper and newer
        check_rope_kv(cuda_dev, 8, 2, 128, 512, 17, config={"block_n": 16}, pdl=True)
        check_plain(cuda_dev, 4096, 1024, True, True, pdl=True)
        check_plain(cuda_dev, 4096, 1024, True, True, config={"early_launch": True}, pdl=True)
