"""Fused MoE checks shared by the Triton interpreter run (tests/kernels/test_fused_moe.py, ``TRITON_INTERPRET=1``
subprocess, CPU tensors) and the CUDA run (same test file, on a GPU).

``check_experts``: ``kernels.fused_moe.fused_experts`` vs ``moe.grouped_expert_mlp`` (the grouped torch reference)
and, clamped, vs ``deepseek_v4.raw_ops.clamped_experts``, for routings with empty experts, one hot expert, tokens
routed twice to one expert, repeated identical tokens and dropped (out-of-range) ids.
``check_small``: the per-token kernels of 1-3 tokens (``kernels.triton.moe_small``) == the reference == the grouped
path; ``check_block_paths``: one ``SparseMoE`` block on every path the policy picks == the torch block.
``check_model``: tiny deepseek_v32 / dsv4 / deepseek_v4 models, fused path vs ``moe_backend = "torch"``.
Routing checks: moe_routing_checks.py.

Run as a script (``python fused_moe_checks.py interpreter``) it switches the Triton dispatch onto CPU tensors (the
interpreter's patches from triton_interpreter_checks) and runs every check in fp32 and fp16 (the interpreter has no
bf16).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from moe_routing_checks import check_routing  # noqa: F401  (part of this script's "experts" check; CUDA test)

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}  # max abs err / max abs ref


def _silu_and_mul(h):
    g, u = h.chunk(2, dim=-1)
    return F.silu(g) * u


def routings(T: int, K: int, E: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Named expert-id tables [T, K] covering the fused path's corner cases."""
    rnd = torch.randint(0, E, (T, K), generator=g)
    few = torch.randint(0, 2, (T, K), generator=g) * (E - 1)  # only experts 0 and E-1: every other one empty
    hot = torch.full((T, K), 3 % E)  # every pair on one expert (a run spanning many row blocks)
    hot[:, 0] = 0
    dup = rnd.clone()
    dup[:, 1] = dup[:, 0]  # a token routed twice to one expert (hash tables can do that)
    drop = rnd.clone()
    drop[::2, -1] = E  # another rank's expert: contributes 0
    drop[1::3, 0] = -1
    return {"random": rnd, "few": few, "hot": hot, "dup": dup, "drop": drop}


def _drop_ref(ids, w, E):
    keep = (ids >= 0) & (ids < E)
    return ids.clamp(0, E - 1), w * keep


def check_experts(device, dtype, T=37, K=4, E=8, D=64, inter=48, configs=None, names=None) -> None:
    from torchinferno.kernels import fused_moe
    from torchinferno.models.common import moe
    from torchinferno.models.deepseek_v4 import raw_ops as v4_raw

    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, D, generator=g).to(dtype)
    x[5] = x[4]  # repeated tokens
    gate_up = (torch.randn(E, 2 * inter, D, generator=g) * D**-0.5).to(dtype)
    down = (torch.randn(E, D, inter, generator=g) * inter**-0.5).to(dtype)
    w = torch.rand(T, K, generator=g)
    x, gate_up, down, w = (t.to(device) for t in (x, gate_up, down, w))
    for name, ids in routings(T, K, E, g).items():
        if names is not None and name not in names:
            continue
        ids = ids.to(device)
        got = fused_moe.fused_experts(x, ids, w, gate_up, down, configs=configs, may_drop=name == "drop")
        rid, rw = _drop_ref(ids, w, E)
        want = moe.grouped_expert_mlp(x.float(), rid, rw, gate_up.float(), down.float(), _silu_and_mul)
        err = float((got.float() - want).abs().max() / want.abs().max())
        assert got.dtype == dtype and got.shape == (T, D), (got.dtype, got.shape)
        assert err <= TOL[dtype], f"{name} {dtype}: rel err {err:.2e}"
        limit = 0.05
        got = fused_moe.fused_experts(x, ids, w, gate_up, down, limit=limit, configs=configs, may_drop=name == "drop")
        want = v4_raw.clamped_experts(x.float(), rid, rw, gate_up.float(), down.float(), limit)
        err = float((got.float() - want).abs().max() / want.abs().max())
        assert err <= TOL[dtype], f"{name} clamped {dtype}: rel err {err:.2e}"
    empty = fused_moe.fused_experts(x[:0], ids[:0], w[:0], gate_up, down, configs=configs)
    assert empty.shape == (0, D)


def check_shared(device, dtype, T=13, K=3, E=8, D=64, inter=32, n_shared=2, configs=None) -> None:
    """Shared experts inside the fused MoE: ``fused_experts(..., shared=)`` with ids ``E + j`` appended at weight 1
    == the routed reference + the shared SwiGLU MLP (``ns * I`` wide, gate rows first) run on its own; the routing
    kernel's appended columns == ``append_shared``."""
    from torchinferno.kernels import fused_moe
    from torchinferno.models.common import moe

    g = torch.Generator().manual_seed(5)
    x = torch.randn(T, D, generator=g).to(dtype)
    gate_up = (torch.randn(E, 2 * inter, D, generator=g) * D**-0.5).to(dtype)
    down = (torch.randn(E, D, inter, generator=g) * inter**-0.5).to(dtype)
    s_gu = (torch.randn(2 * n_shared * inter, D, generator=g) * D**-0.5).to(dtype)
    s_dn = (torch.randn(D, n_shared * inter, generator=g) * (n_shared * inter) ** -0.5).to(dtype)
    w = torch.rand(T, K, generator=g)
    x, gate_up, down, s_gu, s_dn, w = (t.to(device) for t in (x, gate_up, down, s_gu, s_dn, w))
    shared_ref = F.linear(_silu_and_mul(F.linear(x.float(), s_gu.float())), s_dn.float())  # [T, D]
    for name, ids in routings(T, K, E, g).items():
        if name == "drop":
            continue
        ids = ids.to(device)
        aw, aid = fused_moe.append_shared(w, ids, E, n_shared)
        assert aid.shape == (T, K + n_shared) and bool((aid[:, K:] == torch.arange(E, E + n_shared).to(device)).all())
        got = fused_moe.fused_experts(x, aid, aw, gate_up, down, configs=configs, shared=(s_gu, s_dn))
        want = moe.grouped_expert_mlp(x.float(), ids, w, gate_up.float(), down.float(), _silu_and_mul) + shared_ref
        err = _rel_err(got.float(), want)
        assert got.dtype == dtype and got.shape == (T, D), (got.dtype, got.shape)
        assert err <= TOL[dtype], f"shared {name} {dtype}: rel err {err:.2e}"
    from torchinferno.kernels.triton import moe_routing

    logits = torch.randn(T, 16, generator=g).to(device)
    bias = (torch.rand(16, generator=g) - 0.5).to(device)
    w0, id0 = moe_routing.route(logits, bias, 4, 4, 2, True, 2.5)
    w1, id1 = moe_routing.route(logits, bias, 4, 4, 2, True, 2.5, n_shared=n_shared)
    aw, aid = fused_moe.append_shared(w0, id0, 16, n_shared)
    assert torch.equal(id1, aid) and torch.equal(w1, aw), "routing with shared columns"


SMALL_TILES = ({"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2},  # masked K tails at D=40, I=24
               {"BLOCK_N": 8, "BLOCK_K": 16, "num_warps": 4, "num_stages": 2})


def check_small(device, dtype, names=None) -> None:
    """The per-token kernels (``kernels.triton.moe_small``, ``fused_experts(small=True)``) == the grouped reference
    and == the grouped Triton path (``small=False``) at 1-3 tokens: every routing (dropped ids too), V4's clamp, the
    shared experts appended as ids ``E + j``, uneven tiles, the input RMSNorm and residual add fused in; and the
    policy picks them by token count."""
    from torchinferno.kernels import fused_moe
    from torchinferno.models.common import moe

    for T, K, E, D, inter in ((1, 6, 16, 64, 48), (3, 4, 8, 40, 24)):
        g = torch.Generator().manual_seed(T)
        x = torch.randn(T, D, generator=g).to(dtype).to(device)
        gate_up = (torch.randn(E, 2 * inter, D, generator=g) * D**-0.5).to(dtype).to(device)
        down = (torch.randn(E, D, inter, generator=g) * inter**-0.5).to(dtype).to(device)
        w = torch.rand(T, K, generator=g).to(device)
        s_gu = (torch.randn(4 * inter, D, generator=g) * D**-0.5).to(dtype).to(device)  # two shared experts
        s_dn = (torch.randn(D, 2 * inter, generator=g) * (2 * inter) ** -0.5).to(dtype).to(device)
        for name, ids in routings(T, K, E, g).items():
            if names is not None and name not in names:
                continue
            ids = ids.to(device)
            drop = name == "drop"
            rid, rw = _drop_ref(ids, w, E)
            want = moe.grouped_expert_mlp(x.float(), rid, rw, gate_up.float(), down.float(), _silu_and_mul)
            for small in (True, False):
                got = fused_moe.fused_experts(x, ids, w, gate_up, down, may_drop=drop, small=small)
                assert got.dtype == dtype and got.shape == (T, D), (got.dtype, got.shape)
                err = _rel_err(got.float(), want)
                assert err <= TOL[dtype], f"small={small} {name} T={T} {dtype}: rel err {err:.2e}"
            got = fused_moe.fused_experts(x, ids, w, gate_up, down, limit=0.05, may_drop=drop, small=True)
            from torchinferno.models.deepseek_v4 import raw_ops as v4_raw

            want_c = v4_raw.clamped_experts(x.float(), rid, rw, gate_up.float(), down.float(), 0.05)
            assert _rel_err(got.float(), want_c) <= TOL[dtype], f"small clamped {name} T={T}"
            if drop:
                continue
            aw, aid = fused_moe.append_shared(w, ids, E, 2)
            shared_ref = F.linear(_silu_and_mul(F.linear(x.float(), s_gu.float())), s_dn.float())
            got = fused_moe.fused_experts(x, aid, aw, gate_up, down, shared=(s_gu, s_dn), small=True)
            err = _rel_err(got.float(), want + shared_ref)
            assert err <= TOL[dtype], f"small shared {name} T={T} {dtype}: rel err {err:.2e}"
        from torchinferno.kernels.triton import moe_small

        ids = torch.randint(0, E, (T, K), generator=g).to(device)
        want = moe.grouped_expert_mlp(x.float(), ids, w, gate_up.float(), down.float(), _silu_and_mul)
        got = moe_small.small_m_experts(x, ids, w, gate_up, down, *SMALL_TILES)
        assert _rel_err(got.float(), want) <= TOL[dtype], f"small tiles T={T}"
        nw = (torch.rand(D, generator=g) + 0.5).to(dtype).to(device)  # a decode step's layer ends fused in
        xn = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5) * nw.float()
        want = x.float() + moe.grouped_expert_mlp(xn, ids, w, gate_up.float(), down.float(), _silu_and_mul)
        out = torch.empty_like(x)
        got = moe_small.small_m_experts(x, ids, w, gate_up, down, *SMALL_TILES, rms=(nw, 1e-5), residual=x, out=out)
        assert got is out and _rel_err(got.float(), want) <= TOL[dtype], f"small rms + residual T={T}"
    calls = []
    real = moe_small.small_m_experts
    moe_small.small_m_experts = lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k)
    try:
        with fused_moe.override_policy(small_m_max_tokens=2):
            for T in (1, 2, 3):
                ids = torch.randint(0, E, (T, K), generator=g).to(device)
                fused_moe.fused_experts(x[:1].expand(T, D), ids, w[:1].expand(T, K), gate_up, down)
    finally:
        moe_small.small_m_experts = real
    assert calls == [1, 2], f"policy: per-token kernels taken at {calls} tokens (want 1 and 2)"


def check_configs(device, dtype, names=None) -> None:
    """Tile shapes the tuner may pick: uneven K (masked loop tail), BLOCK_M larger than a run, GROUP_M > 1."""
    for cfg in ({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2},
                {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 4, "num_warps": 4, "num_stages": 2}):
        check_experts(device, dtype, T=9, K=3, E=5, D=40, inter=24, configs=(cfg, cfg), names=names)
    a = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2}
    b = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
    check_experts(device, dtype, T=9, K=3, E=5, D=40, inter=24, configs=(a, b), names=names)  # two alignments


ALIGN_CASES = [(1, 6, 64, 16), (5, 2, 4, 4), (33, 8, 16, 16), (7, 3, 5, 1), (64, 6, 8, 64), (300, 6, 64, 16),
               (40, 8, 256, 16), (3, 2, 300, 32)]  # (T, top_k, E, block_m): multi-chunk, E past one chunk's width


def check_align(device) -> None:
    """The one-program Triton sort/pad == the multi-program one (prefill sizes) == the Python oracle == the torch
    version (dropped ids, empty experts); then a prefill-sized routing (P > ALIGN_KERNEL_MAX_PAIRS, many chunks)
    through the multi-program one vs the torch version, and a sabotaged layout that the comparison catches."""
    from torchinferno.kernels.fused_moe import (
        align_pairs_torch,
        max_padded,
        reference_align,
    )
    from torchinferno.kernels.triton import fused_moe as tk

    g = torch.Generator().manual_seed(7)
    for T, K, E, B in ALIGN_CASES:
        ids = torch.randint(0, min(E, 24), (T, K), generator=g)  # experts >= 24 stay empty
        if T > 3:
            ids[0] = ids[1]
            ids[2, 0], ids[3, -1] = -1, E  # dropped
        want = reference_align(ids, E, B)
        got = tk.align_pairs(ids.to(device), E, B, max_padded(T * K, E, B))
        chunked = tk.align_pairs_chunked(ids.to(device), E, B, max_padded(T * K, E, B))
        alt = align_pairs_torch(ids.to(device), E, B)
        for name, (sp, be, n) in (("triton", got), ("chunked", chunked), ("torch", alt)):
            ok = torch.equal(sp.cpu(), want[0]) and torch.equal(be.cpu(), want[1]) and int(n) == want[2]
            assert ok, f"align {name} T={T} K={K} E={E} B={B}"
    for T, K, E, B in ((700, 6, 64, 64), (300, 8, 256, 16)):  # 4200 / 2400 pairs: 33 / 75 chunks
        ids = torch.randint(0, E, (T, K), generator=g)
        ids[5, 2], ids[9, 0] = -1, E + 3  # dropped
        want = align_pairs_torch(ids, E, B)
        sp, be, n = tk.align_pairs_chunked(ids.to(device), E, B, max_padded(T * K, E, B))
        assert torch.equal(sp.cpu(), want[0]) and torch.equal(be.cpu(), want[1]) and int(n) == int(want[2]), \
            f"align chunked T={T} K={K} E={E} B={B}"
        bad = sp.cpu().clone()
        bad[[0, 1]] = bad[[1, 0]]  # two pairs of one expert swapped: no longer ascending within the expert
        assert not torch.equal(bad, want[0])


def check_expert_parallel(device, dtype=torch.float32, T=11, K=3, E=6, D=32, inter=16) -> None:
    """Two expert-parallel ranks (experts [0, 2) and [2, 6)): their fused partial sums add up to all experts."""
    from torchinferno.models.common.layers import RoutedExperts
    from torchinferno.models.dsv4 import fused_ops
    from torchinferno.parallel.layers import ExpertParallelExperts

    torch.manual_seed(0)
    full = RoutedExperts(E, D, inter, fused_ops).to(device=device, dtype=dtype)
    full.moe_backend = "torch"
    ranks = [ExpertParallelExperts(0, 2, D, inter, fused_ops), ExpertParallelExperts(2, 4, D, inter, fused_ops)]
    for r in ranks:
        r.to(device=device, dtype=dtype)
        with torch.no_grad():
            r.gate_up_proj.copy_(full.gate_up_proj[r.start : r.start + r.count])
            r.down_proj.copy_(full.down_proj[r.start : r.start + r.count])
    g = torch.Generator().manual_seed(3)
    x = torch.randn(T, D, generator=g).to(dtype).to(device)
    ids = torch.randint(0, E, (T, K), generator=g).to(device)
    w = torch.rand(T, K, generator=g).to(device)
    with torch.no_grad():
        want = full(x, ids, w).float()
        got = sum(r(x, ids, w).float() for r in ranks)
    assert _rel_err(got, want) <= TOL[dtype], f"expert parallel: rel err {_rel_err(got, want):.2e}"


def _rel_err(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


def check_model(device, dtype=torch.float32) -> None:
    """Tiny deepseek_v32 / dsv4 / deepseek_v4 (default variant, fused ops): prefill 6 tokens into a paged cache,
    then decode 3 one at a time; the fused MoE path's logits == the reference path's (``moe_backend = "torch"``)."""
    from torchinferno.models.common.moe import set_moe_backend
    from torchinferno.testing import tiny_model

    for family in ("deepseek-v3.2", "dsv4", "deepseek-v4"):
        model = tiny_model(family, dtype=dtype).to(device)
        outs = []
        for backend in ("torch", "auto"):
            assert set_moe_backend(model, backend) > 0
            outs.append(_cached_logits(model, device, dtype))
        want, got = outs
        err = float((got - want).abs().max() / want.abs().max())
        assert err <= TOL[dtype], f"{family}: rel err {err:.2e}"
    check_shared_model(device, dtype)


def check_shared_model(device, dtype=torch.float32) -> None:
    """Tiny deepseek-v3.2 with two shared experts: shared experts inside the fused MoE (``fuse_shared``, the
    default) == the separate shared MLP after the fused routed experts == the torch reference; the fused-shared
    path is really taken (``moe.fused_shared_count``)."""
    from torchinferno.models.common import moe
    from torchinferno.models.common.layers import SparseMoE
    from torchinferno.models.deepseek_v32 import fused_ops
    from torchinferno.models.deepseek_v32.config import tiny_deepseek_v32_config
    from torchinferno.models.deepseek_v32.model import DeepSeekV32ForCausalLM
    from torchinferno.testing import randomize_

    torch.manual_seed(0)
    model = randomize_(DeepSeekV32ForCausalLM(tiny_deepseek_v32_config(n_shared_experts=2), fused_ops))
    model = model.to(device=device, dtype=dtype).eval()
    from torchinferno.models.registry import get_family

    model.family = get_family("deepseek-v3.2")
    blocks = [m for m in model.modules() if isinstance(m, SparseMoE)]
    from torchinferno.kernels import fused_moe

    x = torch.randn(3, model.config.hidden_size, device=device, dtype=dtype)
    assert blocks and all(b.fuse_shared is None for b in blocks)
    with fused_moe.override_policy(shared_fuse_max_tokens=2):  # both sides of the token threshold
        assert all(moe.fused_shared_count(b, x[:2]) == 2 and moe.fused_shared_count(b, x) == 0 for b in blocks)
    with fused_moe.override_policy(shared_fuse_max_tokens=3):
        assert all(moe.fused_shared_count(b, x) == 2 for b in blocks), "fused shared path not taken"
    with fused_moe.override_policy(shared_fuse_max_tokens=2):
        by_policy = _cached_logits(model, device, dtype)  # 6-token prefill apart, 1-token decodes fused
    for b in blocks:
        b.fuse_shared = True
    assert all(moe.fused_shared_count(b, x) == 2 for b in blocks)
    fused = _cached_logits(model, device, dtype)  # the prefill too
    for b in blocks:
        b.fuse_shared = False
    separate = _cached_logits(model, device, dtype)
    moe.set_moe_backend(model, "torch")
    ref = _cached_logits(model, device, dtype)
    for name, got in (("fused shared", fused), ("separate shared", separate), ("by token threshold", by_policy)):
        err = _rel_err(got, ref)
        assert err <= TOL[dtype], f"{name}: rel err {err:.2e}"


def check_block_paths(device, dtype=torch.float32) -> None:
    """One ``SparseMoE`` block (tiny deepseek-v3.2 config, two shared experts, fused ops) at 1-9 tokens: every path
    the policy picks (per-token kernels; routing + sort/pad in one launch with the shared experts inside or apart;
    past the router's one-launch range) == the torch reference block."""
    from torchinferno.kernels import fused_moe
    from torchinferno.models.common import moe
    from torchinferno.models.common.layers import SparseMoE
    from torchinferno.models.deepseek_v32 import fused_ops
    from torchinferno.models.deepseek_v32.config import tiny_deepseek_v32_config
    from torchinferno.testing import randomize_

    torch.manual_seed(1)
    cfg = tiny_deepseek_v32_config(n_shared_experts=2)
    block = randomize_(SparseMoE(cfg, fused_ops)).to(device=device, dtype=dtype).eval()
    g = torch.Generator().manual_seed(4)
    with torch.no_grad(), fused_moe.override_policy(shared_fuse_max_tokens=3, small_m_max_tokens=1):
        for T, aligned in ((1, False), (2, True), (3, True), (6, True), (9, True)):
            x = torch.randn(T, cfg.hidden_size, generator=g).to(dtype).to(device)
            took = moe.fused_routed_aligned(block, x) is not None
            assert took == aligned, f"T={T}: one-launch routing + sort/pad taken {took}"
            got = block(x)
            moe.set_moe_backend(block, "torch")
            want = block(x)
            moe.set_moe_backend(block, "auto")
            err = _rel_err(got.float(), want.float())
            assert err <= TOL[dtype], f"block T={T} {dtype}: rel err {err:.2e}"


def _cached_logits(model, device, dtype) -> torch.Tensor:  # [9, V] fp32
    from torchinferno.models.common.attention_metadata import (
        build_attention_metadata,
        positions_for,
    )

    ids = torch.tensor([5, 17, 99, 3, 42, 7, 8, 11, 2], device=device)
    caches = model.family.kv_spec(model.config).allocate(num_blocks=6, block_size=4, dtype=dtype, device=device)
    table = [[5, 2, 0, 4]]
    with torch.no_grad():
        meta = build_attention_metadata([6], [0], table, 4, device=device)
        steps = [model.compute_logits(model(ids[:6], positions_for([6], [0]).to(device), caches, meta))]
        for t in range(6, 9):
            meta = build_attention_metadata([1], [t], table, 4, device=device)
            steps.append(model.compute_logits(model(ids[t : t + 1], torch.tensor([t], device=device), caches, meta)))
    return torch.cat(steps).float()


def main() -> None:
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]
    import triton_interpreter_checks  # noqa: F401  (interpreter patches; Triton dispatch accepts CPU tensors)

    cpu = torch.device("cpu")
    what = sys.argv[1]
    if what == "experts":
        check_align(cpu)
        check_routing(cpu)
        check_experts(cpu, torch.float32)
        check_experts(cpu, torch.float16, names=("random", "hot"))
        check_configs(cpu, torch.float32, names=("drop",))
        check_expert_parallel(cpu)
    elif what == "shared":
        check_shared(cpu, torch.float32)
        check_shared(cpu, torch.float32, T=1, K=6, E=16, n_shared=1)
        cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
        check_shared(cpu, torch.float32, T=9, K=2, E=5, D=40, inter=24, configs=(cfg, cfg))  # masked K tail
        check_shared(cpu, torch.float16, T=5)
    elif what == "small":
        check_small(cpu, torch.float32)
        check_small(cpu, torch.float16, names=("random", "drop"))
    elif what == "model":
        check_block_paths(cpu)
        check_block_paths(cpu, torch.float16)
        check_model(cpu)
    print(f"ok {what}")


if __name__ == "__main__":
    main()
