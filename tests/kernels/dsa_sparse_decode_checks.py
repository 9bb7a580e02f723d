"""Checks of V3.2's sparse DSA decode (``kernels.mla_decode.sparse_absorbed_decode`` over the generalized
sparse-sink kernel: keys the whole latent row, values its first ``dv`` dims, no sink), run by
tests/kernels/test_dsa_sparse_decode.py: on CPU under ``TRITON_INTERPRET=1`` (``python <this> <check>``), on CUDA as
plain functions.

* ``kernel``: the Triton kernel with ``dv < dk`` and no sinks == ``kernels.sparse_sink_decode.reference`` (several
  shapes, split-K, masked slots, a row with no valid slot -> 0); and the sparse absorbed decode == the dense
  ``mla.mla_absorbed_attention`` over the gathered rows with the keep-mask (the reference of both paths agree).
* ``model``: the tiny V3.2 model with the fused ops (Triton pieces on) decoding sparse == the same weights with the
  raw ops decoding dense (the keep-mask over every cached row), with the sparse kernel actually used.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def case(device, dtype, B=3, H=4, R=32, r=16, k=7, blocks=12, bs=4, seed=0, config=None, empty_row=1):
    """-> (got, want): the kernel (values the first R of R + r) against the reference; row ``empty_row`` all -1."""
    from torchinferno.kernels import sparse_sink_decode as ssd
    from torchinferno.kernels.triton import sparse_sink_decode as kern

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, R + r, generator=g).to(dtype).to(device)
    cache = torch.randn(blocks, bs, R + r, generator=g).to(dtype).to(device)
    slots = torch.randint(0, blocks * bs, (B, k), generator=g)
    slots[torch.rand(B, k, generator=g) < 0.3] = -1
    if 0 <= empty_row < B:
        slots[empty_row] = -1
    slots = slots.to(device)
    scale = (R + r) ** -0.5
    got = kern.sparse_sink_decode(q, cache, slots, None, None, None, scale, config, dv=R)
    want = ssd.reference(q.float(), cache.float(), slots, None, None, None, scale, dv=R)
    return got, want


def check_kernel(device, dtype) -> None:
    tol = TOL[dtype]
    cases = [
        {},
        {"H": 20, "R": 64, "r": 16},  # two head blocks
        {"R": 48, "r": 8, "k": 70},  # value dims not a power of two; rows over several tiles
        {"R": 32, "r": 0, "empty_row": -1},  # dv == dk (no tail), no sink
        {"k": 40, "config": {"SPLITS": 3}},  # split-K merge without a sink; an empty row across splits
        {"k": 5, "config": {"SPLITS": 4, "BLOCK_N": 16}},  # splits past the rows' end
    ]
    for i, kw in enumerate(cases):
        got, want = case(device, dtype, seed=i, **kw)
        assert got.dtype == dtype and got.shape == want.shape, (got.shape, want.shape)
        assert not got.isnan().any(), f"case {kw}: NaN"
        err = _rel(got, want)
        assert err <= tol, f"case {kw}: rel err {err:.2e} > {tol}"
        assert got[1].float().abs().max() < 1e-6 if kw.get("empty_row", 1) == 1 else True, "empty row must give 0"
    # sabotage: the reference over slots shifted by one row must not match the kernel
    from torchinferno.kernels import sparse_sink_decode as ssd
    from torchinferno.kernels.triton import sparse_sink_decode as kern

    g = torch.Generator().manual_seed(9)
    q, cache = torch.randn(2, 4, 48, generator=g), torch.randn(6, 4, 48, generator=g)
    slots = torch.randint(0, 23, (2, 9), generator=g)
    got = kern.sparse_sink_decode(q.to(dtype).to(device), cache.to(dtype).to(device), slots.to(device), None, None,
                                  None, 0.2, dv=32)
    off = ssd.reference(q, cache, slots + 1, None, None, None, 0.2, dv=32)
    assert _rel(got, off.to(got.device)) > 10 * tol, "an off-by-one slot went unnoticed"
    check_absorbed(device, dtype)
    check_paged_indexer(device, dtype)


def check_paged_indexer(device, dtype) -> None:
    """The indexer kernel reading the paged index-key cache in place == the kernel over the gathered keys, bitwise
    (same values, same tiles: the same selection), and == the reference within fp32 rounding."""
    from torchinferno.kernels import indexer_scores as iks
    from torchinferno.kernels.triton import indexer_scores as kern
    from torchinferno.models.common.attention import gather_kv

    g = torch.Generator().manual_seed(11)
    B, Q, Hi, D, blocks, page, S = 3, 2, 4, 32, 24, 8, 70  # S not a multiple of the page; tables padded with 0
    q = torch.randn(B, Q, Hi, D, generator=g).to(dtype).to(device)
    cache = torch.randn(blocks, page, D, generator=g).to(dtype).to(device)
    tables = torch.stack([torch.randperm(blocks, generator=g)[:9] for _ in range(B)]).to(torch.int32)
    tables[0, 3:] = 0  # row 0 is short: blocks past its length are padding
    tables = tables.to(device)
    w = torch.randn(B, Q, Hi, generator=g).to(device)
    limits = torch.tensor([[20, 21], [69, 70], [40, 41]], device=device)
    cfg = {"BLOCK_Q": 16, "BLOCK_S": 16, "num_warps": 4, "num_stages": 1}
    got = kern.indexer_scores(q, cache, w, 1.0, limits, cfg, block_tables=tables, num_keys=S)
    gathered = gather_kv(cache, tables, S)
    want = kern.indexer_scores(q, gathered, w, 1.0, limits, cfg)
    assert got.shape == (B, Q, S) and torch.equal(got, want), "paged indexer scores differ from the gathered ones"
    ref = iks.reference(q, gathered, w, 1.0, limits)
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(got)) and _rel(got[fin], ref[fin]) <= 1e-5
    assert iks.paged_usable(q, cache)  # the fused ops take this path (Triton on q's device)


def check_absorbed(device, dtype) -> None:
    """sparse_absorbed_decode (Triton where usable, and the reference) == the dense absorbed op with the keep-mask."""
    from torchinferno.kernels import mla_decode
    from torchinferno.models.common import mla

    g = torch.Generator().manual_seed(5)
    B, H, dn, dv, R, r, blocks, bs, k = 3, 4, 16, 16, 32, 8, 10, 4, 6
    lens = torch.tensor([3, 17, 29])
    tables = torch.stack([torch.randperm(blocks, generator=g)[:8] for _ in range(B)]).to(torch.int32)
    q_nope = torch.randn(B, H, dn, generator=g).to(dtype)
    q_pe = torch.randn(B, H, r, generator=g).to(dtype)
    cache = torch.randn(blocks, bs, R + r, generator=g).to(dtype)
    w = (torch.randn(H * (dn + dv), R, generator=g) * R**-0.5).to(dtype)
    pos = torch.stack([torch.randperm(32, generator=g)[:k] for _ in range(B)])  # some past each row's length
    slots = mla.selected_slots(pos, lens, tables, bs)
    L = 32
    lat = cache.flatten(0, 1)[(tables.long()[:, :, None] * bs + torch.arange(bs)).flatten(1)][:, :L]  # [B, L, R+r]
    keep = torch.zeros(B, L, dtype=torch.bool).scatter_(1, pos, True) & (torch.arange(L) < lens[:, None])
    want = mla.mla_absorbed_attention(q_nope.float(), q_pe.float(), lat.float(), w.float(), 0.2, keep)
    dev = lambda t: t.to(device)  # noqa: E731
    for use_triton in (True, False):
        got = mla_decode.sparse_absorbed_decode(dev(q_nope), dev(q_pe), dev(cache), dev(w), 0.2, dev(slots),
                                                use_triton=use_triton)
        err = _rel(got, want.to(got.device))
        assert err <= TOL[dtype], f"sparse absorbed (triton={use_triton}) vs dense keep-mask: rel err {err:.2e}"


def check_model(device) -> None:
    """Fused-ops tiny V3.2 (Triton pieces on ``device``) decoding sparse == raw ops decoding dense."""
    from dataclasses import replace

    import test_deepseek_dsa_sparse as M

    from torchinferno.kernels.triton import sparse_sink_decode as kern
    from torchinferno.models.deepseek_v32.config import tiny_deepseek_v32_config

    cfg = replace(tiny_deepseek_v32_config(), index_topk=8)
    dense = M.make(cfg, sparse=False).to(device)
    sparse = M.twin(dense, variant="v1", sparse=True).to(device)
    from torchinferno.kernels.triton import indexer_scores as ikern

    calls, paged = [], []
    real, real_ik = kern.sparse_sink_decode, ikern.indexer_scores
    kern.sparse_sink_decode = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    ikern.indexer_scores = lambda *a, **kw: paged.append(kw.get("block_tables") is not None) or real_ik(*a, **kw)
    try:
        got = M.decode(sparse, [3, 12, 6], steps=5, device=device)
    finally:
        kern.sparse_sink_decode, ikern.indexer_scores = real, real_ik
    want = M.decode(dense, [3, 12, 6], steps=5, device=device)
    assert calls, "the Triton sparse kernel was not used"
    assert any(paged), "the indexer did not read the paged index-key cache in place"
    err = _rel(got, want)
    assert err <= 1e-5, f"sparse (fused, Triton) vs dense (raw): rel err {err:.2e}"


def main() -> None:
    sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "models")]
    from triton_interpreter_checks import run_checks  # the interpreter patches (Triton dispatch accepts CPU tensors)

    def kernel(cpu):
        check_kernel(cpu, torch.float32)
        check_kernel(cpu, torch.float16)

    run_checks({"kernel": kernel, "model": check_model})


if __name__ == "__main__":
    main()
