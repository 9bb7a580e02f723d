"""MoE routing checks (used by fused_moe_checks.py: the Triton interpreter run and the CUDA run): the one-launch
Triton routing == the torch routing references; the router GEMV == ``F.linear(x.float(), w)``; the router logits +
routing in one launch (``moe_routing.router_route``) == the two launches bit for bit, also with the fused MoE's
sort/pad in the same launch (== the Python oracle), and its counters are left zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


ROUTE_CASES = [  # (T, E, top_k, n_group, topk_group, norm, bias, sqrt_softplus)
    (9, 8, 2, 4, 2, True, True, False), (5, 64, 6, 1, 1, True, False, False), (7, 256, 8, 8, 4, True, True, False),
    (4, 16, 4, 1, 1, False, True, False), (6, 16, 4, 1, 1, True, True, True), (1, 32, 3, 4, 4, True, True, False)]


def check_routing(device) -> None:
    """The one-launch Triton routing == ``moe.route_sigmoid_grouped`` (V3) / V4's sqrt-softplus router: the same
    expert set per token and the same weights (fp32 1e-6), compared after sorting each row by expert id."""
    from torchinferno.kernels.triton import moe_routing
    from torchinferno.models.common.moe import route_sigmoid_grouped

    g = torch.Generator().manual_seed(11)
    for T, E, k, G, TG, norm, has_bias, ssp in ROUTE_CASES:
        logits = (torch.randn(T, E, generator=g) * 3).to(device)
        logits[0, :3] = torch.tensor([-30.0, 25.0, -16.0])  # softplus branches
        bias = (torch.rand(E, generator=g) - 0.5).to(device) if has_bias else None
        w, ids = moe_routing.route(logits, bias, k, G, TG, norm, 2.5, sqrt_softplus=ssp)
        if ssp:  # deepseek_v4.model.Router
            s = F.softplus(logits).sqrt()
            rid = torch.topk(s + bias, k, dim=-1).indices
            rw = s.gather(1, rid)
            rw = rw / (rw.sum(-1, keepdim=True) + 1e-20) * 2.5
        else:
            rw, rid = route_sigmoid_grouped(logits, bias, k, G, TG, norm, 2.5)
        o, ro = ids.sort(-1), rid.sort(-1)
        assert torch.equal(o.values, ro.values), f"routing ids {T, E, k, G, TG}"
        got, want = w.gather(1, o.indices), rw.gather(1, ro.indices)
        assert float((got - want).abs().max()) <= 1e-6 * float(want.abs().max()) + 1e-7, f"routing weights {T, E, k}"
    for T, E, D, dtype in ((1, 64, 2048, torch.float16), (5, 6, 100, torch.float32), (3, 16, 40, torch.float16)):
        x = torch.randn(T, D, generator=g).to(dtype).to(device)  # the router GEMV: x's cast folded in, fp32 math
        wr = (torch.randn(E, D, generator=g) * D**-0.5).to(device)
        got, want = moe_routing.router_logits(x, wr), F.linear(x.float(), wr)
        assert got.dtype == torch.float32 and got.shape == (T, E)
        assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max()), f"router logits {T, E, D}"
    for T, E, D, G, TG, ns, dtype in ((1, 64, 2048, 1, 1, 2, torch.float16), (5, 16, 100, 4, 2, 0, torch.float32),
                                      (3, 256, 64, 8, 4, 1, torch.float16), (2, 4, 40, 1, 1, 0, torch.float32)):
        x = torch.randn(T, D, generator=g).to(dtype).to(device)  # logits + routing in one launch == two launches
        wr = (torch.randn(E, D, generator=g) * 3 * D**-0.5).to(device)
        bias = (torch.rand(E, generator=g) - 0.5).to(device) if T % 2 else None
        k = min(6, E // 2)
        w1, id1 = moe_routing.router_route(x, wr, bias, k, G, TG, True, 2.5, n_shared=ns)
        w0, id0 = moe_routing.route(moe_routing.router_logits(x, wr), bias, k, G, TG, True, 2.5, n_shared=ns)
        assert torch.equal(id1, id0) and torch.equal(w1, w0), f"router_route {T, E, D, G, TG, ns}"
        assert not bool(moe_routing.route_counters(device, 1).any()), "route counters left nonzero"
        if E >= 2 and D > 64:  # other ROUTER_TILES (the probe's A/B): the same routing, logits to fp32 rounding
            w2, id2 = moe_routing.router_route(x, wr, bias, k, G, TG, True, 2.5, n_shared=ns, block_e=2, block_k=64)
            assert torch.equal(id2, id1) and torch.allclose(w2, w1, rtol=1e-5, atol=1e-6), f"router tiles {T, E, D}"
            nw = (torch.rand(D, generator=g) + 0.5).to(device)  # the pre-MoE RMSNorm fused into the GEMV
            xn = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5) * nw
            w3, id3 = moe_routing.router_route(x, wr, bias, k, G, TG, True, 2.5, n_shared=ns, rms=(nw, 1e-5))
            w4, id4 = moe_routing.route(moe_routing.router_logits(xn, wr), bias, k, G, TG, True, 2.5, n_shared=ns)
            assert torch.equal(id3, id4) and torch.allclose(w3, w4, rtol=1e-5, atol=1e-6), f"router rms {T, E, D}"
    from torchinferno.kernels.fused_moe import max_padded, reference_align

    for T, E, ns, bm in ((1, 64, 2, 16), (7, 64, 2, 16), (9, 16, 0, 4), (4, 8, 1, 64)):
        x = torch.randn(T, 48, generator=g).to(torch.float16).to(device)  # + the sort/pad in the same launch
        wr = (torch.randn(E, 48, generator=g) * 0.5).to(device)
        k = min(6, E // 2)
        p_max = max_padded(T * (k + ns), E + ns, bm)
        w1, id1, sp, be, n = moe_routing.router_route(x, wr, None, k, 1, 1, True, 1.0, n_shared=ns,
                                                      align=(E + ns, bm, p_max))
        w0, id0 = moe_routing.route(moe_routing.router_logits(x, wr), None, k, 1, 1, True, 1.0, n_shared=ns)
        assert torch.equal(id1, id0) and torch.equal(w1, w0), f"router_route+align ids {T, E, ns, bm}"
        rp, rb, rn = reference_align(id0.cpu(), E + ns, bm)
        assert torch.equal(sp.cpu(), rp) and torch.equal(be.cpu(), rb) and int(n) == rn, f"route+align {T, E, ns, bm}"
        assert not bool(moe_routing.route_counters(device, 1).any()), "route counters left nonzero"
