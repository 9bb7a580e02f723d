"""Checks of the in-place MLA prefill kernel (kernels/triton/mla_prefill_attention.py), run by
tests/kernels/test_mla_prefill.py: under ``TRITON_INTERPRET=1`` (``python <this> kernel``, CPU tensors, fp32 / fp16)
and on CUDA (bf16 at DeepSeek's head dims) as plain functions.

``check_kernel``: ``expanded_attention`` with ``PREFILL_KERNEL = "triton"`` == the reference
``mla_expanded_attention`` for fresh prompts (plain causal) and chunks over a cached context (lower right, against
the boolean mask), over odd sizes (Q, S, H, dims off the tiles, rows past the last query tile), values wider and
narrower than the key; the kernel really ran; sabotage: the comparison rejects a reference that ignores the cached
context (causal from the top left).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}
CASES = [  # Q, context, H, dn, dv, r, R
    (37, 0, 3, 16, 16, 8, 32),
    (9, 14, 2, 12, 20, 4, 24),  # a chunk after 14 cached keys; dv > dn + r
    (50, 0, 1, 24, 8, 8, 16),  # several query and key tiles at the test tiles
    (5, 60, 2, 16, 16, 8, 16),  # a short chunk after a long context
]
SMALL = {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1}


def _inputs(Q, S, H, dn, dv, R, r, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q_nope = torch.randn(Q, H, dn, generator=g)
    q_pe = torch.randn(Q, H, r, generator=g)
    latent = torch.randn(S, R + r, generator=g)
    w = torch.randn(H * (dn + dv), R, generator=g) * R**-0.5
    return [t.to(device=device, dtype=dtype) for t in (q_nope, q_pe, latent, w)]


def _rel(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def _mask(Q, ctx, device):
    return torch.arange(ctx + Q, device=device)[None, :] <= (ctx + torch.arange(Q, device=device))[:, None]


def run_case(device, dtype, Q, ctx, H, dn, dv, r, R, config=None, seed=0) -> float:
    from torchinferno.kernels import mla_prefill
    from torchinferno.kernels.triton import mla_prefill_attention as kern
    from torchinferno.models.common.mla import mla_expanded_attention

    q_nope, q_pe, latent, w = _inputs(Q, ctx + Q, H, dn, dv, R, r, dtype, device, seed)
    scale = (dn + r) ** -0.5
    calls, real_kernel, real_choice = [], kern.mla_prefill_attention, mla_prefill.PREFILL_KERNEL
    kern.mla_prefill_attention = lambda *a, **k: calls.append(1) or real_kernel(*a, **{**k, "config": config})
    mla_prefill.PREFILL_KERNEL = "triton"
    try:
        got = mla_prefill.expanded_attention(q_nope, q_pe, latent, w, scale, None, pad_v=True, context_len=ctx)
    finally:
        kern.mla_prefill_attention, mla_prefill.PREFILL_KERNEL = real_kernel, real_choice
    assert calls, "the Triton kernel did not run"
    f = [t.float() for t in (q_nope, q_pe, latent, w)]
    want = mla_expanded_attention(*f, scale, _mask(Q, ctx, device) if ctx else None)
    assert got.shape == (Q, H, dv) and got.dtype == dtype
    err = _rel(got, want)
    assert err <= TOL[dtype], f"Q={Q} ctx={ctx} H={H} dn={dn} dv={dv} r={r} {dtype}: rel err {err:.2e}"
    if ctx:  # sabotage: the reference causal from the top left (the cached context ignored) must fail the comparison
        # (the earlier control, one key more, moves a row over 1536 keys by ~1/1536: within bf16's tolerance on CUDA)
        upper_left = torch.arange(ctx + Q, device=device)[None, :] <= torch.arange(Q, device=device)[:, None]
        bad = mla_expanded_attention(*f, scale, upper_left)
        assert _rel(got, bad) > 10 * TOL[dtype], "sabotage 'upper-left causal' passed"
    return err


def check_kernel(device) -> None:
    for dtype in (torch.float32, torch.float16):
        for i, case in enumerate(CASES):
            run_case(device, dtype, *case, config=SMALL if dtype == torch.float16 else None, seed=i)


def main() -> None:
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]
    import triton_interpreter_checks  # noqa: F401  (interpreter patches; Triton dispatch accepts CPU tensors)

    what = sys.argv[1]
    {"kernel": check_kernel}[what](torch.device("cpu"))
    print(f"ok {what}")


if __name__ == "__main__":
    main()
