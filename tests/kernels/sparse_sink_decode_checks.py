"""Checks of DeepSeek-V4's sparse-sink decode kernel (kernels/triton/sparse_sink_decode.py), run by
tests/kernels/test_sparse_sink_decode.py: on CPU under ``TRITON_INTERPRET=1`` (``python <this> <check>``), on CUDA
as plain functions.

* ``kernel``: the Triton kernel == ``kernels.sparse_sink_decode.reference`` over several shapes (heads over two
  head blocks, a non-power-of-two head dim, more rows than a tile), masked rows (slot -1), a sequence with zero
  compressed entries, no entry cache at all, tuned tile configs.
* ``model``: the tiny V4 v1 model decoding through the static path with every Triton piece on (KV append, the
  sparse-sink kernel, fused MoE) == the eager per-sequence decode (tests/models/test_deepseek_v4_decode.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def case(device, dtype, B=3, H=4, D=32, W=6, K=5, blocks=12, bs=4, seed=0, ent_cache=True, config=None,
         zero_entries_row=1):
    """-> (got, want) for random caches/slots: row ``zero_entries_row`` has no valid entry, some window rows masked."""
    from torchinferno.kernels import sparse_sink_decode as ssd
    from torchinferno.kernels.triton import sparse_sink_decode as k

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, D, generator=g).to(dtype).to(device)
    kv = torch.randn(blocks, bs, D, generator=g).to(dtype).to(device)
    ent = torch.randn(blocks, bs, D, generator=g).to(dtype).to(device) if ent_cache else None
    sinks = torch.randn(H, generator=g).to(device)
    n = blocks * bs
    win = torch.randint(0, n, (B, W), generator=g)
    win[torch.rand(B, W, generator=g) < 0.3] = -1
    es = torch.randint(0, n, (B, K), generator=g)
    valid = torch.rand(B, K, generator=g) < 0.7
    if 0 <= zero_entries_row < B:
        valid[zero_entries_row] = False
    win, es, valid = win.to(device), es.to(device), valid.to(device)
    es_slots = ssd.fold_valid(es, valid) if ent_cache else None
    scale = D**-0.5
    got = k.sparse_sink_decode(q, kv, win, ent, es_slots, sinks, scale, config)
    want = ssd.reference(q.float(), kv.float(), win, None if ent is None else ent.float(), es_slots, sinks, scale)
    return got, want


def check_kernel(device, dtype) -> None:
    tol = TOL[dtype]
    cases = [
        {},
        {"H": 20, "D": 64},  # two head blocks of 16
        {"D": 48, "W": 40, "K": 70},  # hd not a power of two; rows over several tiles
        {"K": 0},  # no compressed entries (sliding layer)
        {"ent_cache": False},
        {"B": 1, "W": 3, "K": 9, "config": {"BLOCK_H": 32, "BLOCK_N": 16, "num_warps": 2}},
        {"B": 2, "H": 8, "D": 128, "W": 33, "K": 17, "blocks": 20, "bs": 8, "zero_entries_row": 0},
        # split-K: partials merged with the sink counted once; splits past the rows' end; no entries at all
        {"H": 20, "D": 48, "W": 40, "K": 70, "config": {"SPLITS": 3}},
        {"W": 5, "K": 2, "config": {"SPLITS": 4, "BLOCK_N": 16}},
        {"K": 0, "W": 50, "config": {"SPLITS": 2}},
    ]
    for i, kw in enumerate(cases):
        got, want = case(device, dtype, seed=i, **kw)
        assert got.dtype == dtype and got.shape == want.shape
        err = _rel(got, want)
        assert err <= tol, f"case {kw}: rel err {err:.2e} > {tol}"
    # every row masked -> exactly 0 (the sink alone), never NaN
    from torchinferno.kernels.triton import sparse_sink_decode as k

    q = torch.randn(2, 4, 32).to(dtype).to(device)
    kv = torch.randn(3, 4, 32).to(dtype).to(device)
    none = torch.full((2, 5), -1, device=device)
    for splits in (1, 3):
        out = k.sparse_sink_decode(q, kv, none, kv, none, torch.randn(4).to(device), 0.1, {"SPLITS": splits})
        assert out.float().abs().max() < 1e-6 and not out.isnan().any(), "all-masked rows must give 0"


def check_model(device) -> None:
    import test_deepseek_v4_decode as M

    from torchinferno.models.deepseek_v4.config import tiny_deepseek_v4_config
    from torchinferno.models.deepseek_v4.model import randomize_untrained_
    from torchinferno.models.deepseek_v4.v1 import DeepSeekV4V1

    torch.manual_seed(0)
    model = randomize_untrained_(DeepSeekV4V1(tiny_deepseek_v4_config()).eval(), seed=3).to(device)
    calls = []
    from torchinferno.kernels.triton import sparse_sink_decode as k

    real = k.sparse_sink_decode
    k.sparse_sink_decode = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    try:
        # 8 steps from prompts of 3 / 10 / 17: every row crosses CSA (4) and HCA (8) compression edges and the
        # window (6); the interpreter's cost is per step (the CUDA test runs the module's 18)
        steps = 8 if device.type == "cpu" else M.STEPS
        want, _ = M.run(model, static=False, steps=steps)
        got, _ = M.run(model, static=True, mode="emulated", steps=steps)
    finally:
        k.sparse_sink_decode = real
    assert calls, "the Triton kernel was not used"
    assert torch.equal(got.argmax(-1), want.argmax(-1)), "tokens differ"
    err = _rel(got, want)
    assert err <= 1e-5, f"static Triton decode vs eager: rel err {err:.2e}"


def main() -> None:
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent), str(here.parent / "models")]
    import triton_interpreter_checks  # noqa: F401  (interpreter patches; Triton dispatch accepts CPU tensors)

    cpu = torch.device("cpu")
    what = sys.argv[1]
    if what == "kernel":
        check_kernel(cpu, torch.float32)
        check_kernel(cpu, torch.float16)
    elif what == "model":
        check_model(cpu)
    print(f"ok {what}")


if __name__ == "__main__":
    main()
