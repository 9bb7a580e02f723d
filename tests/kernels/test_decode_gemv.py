"""One-row decode GEMVs with fused small ops: ``kernels.api.decode_gemv*`` vs the unfused torch oracles
(``kernels.reference.ref_decode_gemv*``) and float64 math.

On CUDA the API runs the Triton kernels (kernels/triton/decode_gemv.py); on CPU it runs the oracle itself,
so the CPU cases check the oracle against float64 (and the dispatch).
"""

from __future__ import annotations

import pytest
import torch

from torchinferno.kernels import api as kapi
from torchinferno.kernels.reference import ref_decode_gemv, ref_decode_gemv_rope_kv, ref_decode_gemv_swiglu

BF = torch.bfloat16
DT = BF  # activation/weight dtype of the checks (Triton's CPU interpreter rounds bf16 by truncation: debug in fp16)


def _exact_input(x, nw, eps):
    """float64 GEMV input of the exact math (normalized without rounding)."""
    xd = x.double()
    return xd if nw is None else xd * torch.rsqrt(xd.pow(2).mean() + eps) * nw.double()


def _abs_sum(x, nw, w, eps):
    """``|input| @ |W|^T`` in float64: what the rounding of the [K] input (u = 2^-8 in bf16, relative) can move a
    dot product by, beside its own rounding; divided by 4 it is added to the ulp scale of a GEMV output."""
    return _exact_input(x, nw, eps).abs() @ w.double().abs().t()


def _tensors(dev, n, k, seed, norm=True):
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(k, generator=g, device=dev).to(DT)
    nw = (torch.rand(k, generator=g, device=dev) + 0.5).to(DT) if norm else None
    w = (torch.randn(n, k, generator=g, device=dev) * k**-0.5).to(DT)
    r = torch.randn(n, generator=g, device=dev).to(DT)
    return x, nw, w, r


def _close(out, ref, exact, scale=None):
    """The oracle within two ulps of ``scale`` (default: the exact value) plus an accumulation-order term of the
    float64 result; ``out`` within the oracle's own error plus one ulp (a rounding landing on the other side)."""
    scale = exact.abs() if scale is None else scale
    err = (out.double() - exact).abs()
    ref_err = (ref.double() - exact).abs()
    tol = 1e-3 * exact.abs().max()
    assert float((ref_err - 2.0**-6 * scale).max()) <= float(tol), "the torch oracle is off the exact math"
    bad = err > ref_err + 2.0**-7 * scale + tol
    assert not bool(bad.any()), (float(err.max()), float(ref_err.max()), int(bad.sum()))


def check_plain(dev, n, k, norm, add, config=None, pdl=False):
    x, nw, w, r = _tensors(dev, n, k, n + k, norm)
    res = r if add else None
    y = kapi.decode_gemv(x, w, residual=res, norm_weight=nw, eps=1e-5, config=config, pdl=pdl)
    prod = _exact_input(x, nw, 1e-5) @ w.double().t()
    exact = prod + (r.double() if add else 0.0)
    # with the residual the product is rounded before the add: its ulp counts, not the (maybe cancelled) sum's
    scale = prod.abs() + _abs_sum(x, nw, w, 1e-5) / 4 + (r.double().abs() if add else 0.0)
    _close(y, ref_decode_gemv(x, w, res, nw, 1e-5), exact, scale)


def check_two_weights(dev, n1, n2, k, config=None, pdl=False):
    """``second_weight``: one output [n1 + n2] whose rows are those of ``rms_norm(x) @ [w1; w2].T`` (MLA's q and
    kv_a from one launch); the kernel's answer equals its own single-weight GEMV on the stacked weight bitwise."""
    x, nw, w, _ = _tensors(dev, n1 + n2, k, n1 + 3 * k)
    w1, w2 = w[:n1].clone(), w[n1:].clone()  # two allocations, as two modules' weights
    y = kapi.decode_gemv(x, w1, second_weight=w2, norm_weight=nw, eps=1e-5, config=config, pdl=pdl)
    assert y.shape == (n1 + n2,)
    assert torch.equal(y, kapi.decode_gemv(x, w, norm_weight=nw, eps=1e-5, config=config, pdl=pdl))
    _close(y, ref_decode_gemv(x, w, None, nw, 1e-5), _exact_input(x, nw, 1e-5) @ w.double().t(),
           (_exact_input(x, nw, 1e-5) @ w.double().t()).abs() + _abs_sum(x, nw, w, 1e-5) / 4)


def check_swiglu(dev, inter, k, config=None):
    x, nw, w, _ = _tensors(dev, 2 * inter, k, inter + k)
    y = kapi.decode_gemv_swiglu(x, w, norm_weight=nw, eps=1e-6, config=config)
    g, u = (_exact_input(x, nw, 1e-6) @ w.double().t()).chunk(2)
    sg, su = _abs_sum(x, nw, w, 1e-6).chunk(2)
    act = g * torch.sigmoid(g) * u
    # g and u each carry their GEMV's error; silu(g) * u moves by about |u| per unit of g and |silu(g)| per unit of u
    scale = act.abs() + u.abs() * (g.abs() + sg / 4) + (g * torch.sigmoid(g)).abs() * (u.abs() + su / 4)
    _close(y, ref_decode_gemv_swiglu(x, w, nw, 1e-6), act, scale)


def check_rope_kv(dev, nq, nkv, hd, k, slot, cache_dtype=None, norm=True, config=None, pdl=False):
    cache_dtype = cache_dtype or DT
    x, nw, w, _ = _tensors(dev, (nq + 2 * nkv) * hd, k, nq + hd + k, norm)
    g = torch.Generator(device=dev).manual_seed(7)
    ang = torch.rand(hd // 2, generator=g, device=dev) * 6.0
    cos, sin = ang.cos().to(DT), ang.sin().to(DT)
    kc = torch.randn(4, 16, nkv, hd, generator=g, device=dev).to(cache_dtype)
    vc = torch.randn(4, 16, nkv, hd, generator=g, device=dev).to(cache_dtype)
    kc0, vc0 = kc.clone(), vc.clone()
    kr, vr = kc.clone(), vc.clone()
    slot_t = torch.tensor([slot], dtype=torch.long, device=dev)
    q = kapi.decode_gemv_rope_kv(x, w, cos, sin, kc, vc, slot_t, nq, nkv, hd, norm_weight=nw, eps=1e-5, config=config,
                                 pdl=pdl)
    q_ref = ref_decode_gemv_rope_kv(x, w, cos, sin, kr, vr, slot_t, nq, nkv, hd, nw, 1e-5)
    exact = (_exact_input(x, nw, 1e-5) @ w.double().t()).view(nq + 2 * nkv, hd)
    e1, e2 = exact[:, : hd // 2], exact[:, hd // 2:]
    c, s = cos.double(), sin.double()
    exact_rot = torch.cat((torch.cat((e1 * c - e2 * s, e2 * c + e1 * s), -1)[: nq + nkv], exact[nq + nkv:]))
    # a rotated element mixes two rounded values: its ulp slack is that of |x1| + |x2|, not of the (maybe
    # cancelled) result
    sa = (_abs_sum(x, nw, w, 1e-5) / 4).view(nq + 2 * nkv, hd)
    pair = (e1.abs() + e2.abs() + sa[:, : hd // 2] + sa[:, hd // 2:]).repeat(1, 2)
    _close(q.view(nq, hd), q_ref.view(nq, hd), exact_rot[:nq], pair[:nq])
    fk, fv, fk0, fv0 = (t.view(-1, nkv, hd).float() for t in (kc, vc, kc0, vc0))
    others = torch.arange(fk.shape[0], device=dev) != slot
    assert torch.equal(fk[others], fk0[others]) and torch.equal(fv[others], fv0[others])
    if slot < 0:
        assert torch.equal(fk, fk0) and torch.equal(fv, fv0)
        return
    fkr, fvr = kr.view(-1, nkv, hd).float(), vr.view(-1, nkv, hd).float()
    if cache_dtype == DT:
        _close(fk[slot], fkr[slot], exact_rot[nq:nq + nkv], pair[nq:nq + nkv])
        _close(fv[slot], fvr[slot], exact_rot[nq + nkv:], exact_rot[nq + nkv:].abs() + sa[nq + nkv:])
    else:  # the FP8 store of nearly the same values: at most one FP8 rounding step apart
        for got, want in ((fk[slot], fkr[slot]), (fv[slot], fvr[slot])):
            assert float((got - want).abs().max()) <= 0.13 * float(want.abs().max())


CASES_PLAIN = [(256, 512, False, False), (300, 1000, True, False), (4096, 1024, True, True), (64, 4096, True, True)]
CASES_ROPE = [(4, 2, 64, 256, 5), (8, 2, 128, 512, 63), (4, 4, 32, 300, 0), (4, 2, 64, 256, -1)]


@pytest.mark.parametrize("n,k,norm,add", CASES_PLAIN[:3])
def test_reference_decode_gemv_on_cpu(n, k, norm, add):
    check_plain("cpu", n, k, norm, add)
    check_swiglu("cpu", n // 2, k)


def test_reference_two_weight_gemv_on_cpu():
    check_two_weights("cpu", 96, 36, 320)


@pytest.mark.cuda
def test_decode_gemv_two_weights(cuda_dev):
    check_two_weights(cuda_dev, 3072, 576, 2048)  # V2-Lite's q_proj and kv_a_proj_with_mqa
    check_two_weights(cuda_dev, 96, 36, 320, config={"block_n": 8, "block_k": 128}, pdl=True)


@pytest.mark.parametrize("nq,nkv,hd,k,slot", CASES_ROPE)
def test_reference_decode_gemv_rope_kv_on_cpu(nq, nkv, hd, k, slot):
    check_rope_kv("cpu", nq, nkv, hd, k, slot)


@pytest.mark.cuda
@pytest.mark.parametrize("n,k,norm,add", CASES_PLAIN)
def test_decode_gemv_plain_and_norm_prologue(cuda_dev, n, k, norm, add):
    check_plain(cuda_dev, n, k, norm, add)


@pytest.mark.cuda
@pytest.mark.parametrize("cfg", [None, {"block_n": 8, "block_k": 256, "num_warps": 8, "num_stages": 4}])
@pytest.mark.parametrize("inter,k", [(384, 256), (1000, 768)])
def test_decode_gemv_swiglu_epilogue(cuda_dev, inter, k, cfg):
    check_swiglu(cuda_dev, inter, k, cfg)


@pytest.mark.cuda
@pytest.mark.parametrize("nq,nkv,hd,k,slot", CASES_ROPE)
def test_decode_gemv_rope_kv_epilogue(cuda_dev, nq, nkv, hd, k, slot):
    check_rope_kv(cuda_dev, nq, nkv, hd, k, slot, config={"block_n": 16})


@pytest.mark.cuda
def test_decode_gemv_rope_kv_fp8_cache_and_pdl(cuda_dev):
    check_rope_kv(cuda_dev, 8, 2, 128, 512, 17, cache_dtype=torch.float8_e4m3fn)
    if torch.cuda.get_device_capability()[0] >= 9:  # programmatic dependent launch: Hopper and newer
        check_rope_kv(cuda_dev, 8, 2, 128, 512, 17, config={"block_n": 16}, pdl=True)
        check_plain(cuda_dev, 4096, 1024, True, True, pdl=True)
        check_plain(cuda_dev, 4096, 1024, True, True, config={"early_launch": True}, pdl=True)
