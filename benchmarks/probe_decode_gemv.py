"""Probe: the fused one-row decode GEMVs (kernels/triton/decode_gemv.py) vs cuBLAS on Llama-3-8B shapes.

Run on the GPU machine from the repo root: ``PYTHONPATH=src python3 benchmarks/probe_decode_gemv.py [--quick]``.
Each measurement is a CUDA graph of back-to-back calls over distinct weight copies (>= 1 GB in all, so
weights stream from HBM as in a decode step, never from L2), timed per call, as weight GB/s beside the
same-run copy bandwidth. Our kernels run with their fused prologue/epilogue (qkv: add + RMSNorm + rotary +
KV store; gate_up: RMSNorm + SwiGLU; o and down: residual add), cuBLAS as the bare ``F.linear``; with
and without PDL.
Sweeps launch tiles and prints the best per shape (what ``models/llama3/cuda_decode.DEFAULT_CONFIGS`` holds).
"""

from __future__ import annotations

import itertools
import sys

import torch
import torch.nn.functional as F

from torchinferno.bench.ceilings import copy_bandwidth
from torchinferno.bench.gpu_timing import graph_time_ms
from torchinferno.kernels.triton import decode_gemv as dg

D, INTER, H, HKV, HD = 4096, 14336, 32, 8, 128
SHAPES = {"qkv": ((H + 2 * HKV) * HD, D), "o": (D, H * HD), "gate_up": (2 * INTER, D), "down": (D, INTER)}


def _copies(n, k, dev):
    count = max(4, -(-(1 << 30) // (n * k * 2)))
    return [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(count)]


def main(quick: bool = False) -> dict:
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev, nbytes=2 * 1024**3, iters=5)
    out = {"copy_gb_s": bw / 1e9, "shapes": {}}
    print(f"ceiling: copy {bw / 1e9:.0f} GB/s")
    x = torch.randn(D, device=dev, dtype=torch.bfloat16)
    r = torch.randn(D, device=dev, dtype=torch.bfloat16)
    nw = torch.rand(D, device=dev, dtype=torch.bfloat16) + 0.5
    h = torch.empty_like(x)
    xi = torch.randn(INTER, device=dev, dtype=torch.bfloat16)
    cos, sin = torch.rand(HD // 2, device=dev, dtype=torch.bfloat16), torch.rand(HD // 2, device=dev, dtype=torch.bfloat16)
    kc = torch.zeros(64, 16, HKV, HD, device=dev, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    slot = torch.tensor([5], device=dev)

    def ours(kind, w, cfg, pdl):
        if kind == "qkv":
            return lambda: dg.gemv_rope_kv(x, w, cos, sin, kc, vc, slot, H, HKV, HD, norm_weight=nw, pdl=pdl, config=cfg)
        if kind == "gate_up":
            return lambda: dg.gemv_swiglu(x, w, norm_weight=nw, pdl=pdl, config=cfg)
        return lambda: dg.gemv(xi if kind == "down" else x, w, h, residual=r, pdl=pdl, config=cfg)

    if quick:
        grid = [(16, 256, 4, 4), (16, 512, 4, 3), (8, 512, 4, 3), (32, 256, 4, 3), (16, 1024, 8, 2)]
    else:
        grid = [(bn, bk, w, s) for bn, bk, (w, s) in itertools.product((4, 8, 16, 32), (512, 1024, 2048),
                                                                         ((4, 2), (4, 3), (8, 2), (8, 3)))
                if 4096 <= bn * bk <= 16384]
    for kind, (n, k) in SHAPES.items():
        ws = _copies(n, k, dev)
        nbytes = n * k * 2

        def timed(make, ws=ws):
            fns = [make(w) for w in ws]
            ms = graph_time_ms(lambda: [f() for f in fns], calls=1, iters=10)
            return ms * 1e3 / len(ws)  # us per call

        inp = xi if kind == "down" else x
        cub = timed(lambda w: (lambda: F.linear(inp.view(1, -1), w)))
        rows = []
        for bn, bk, warps, stages in grid:
            cfg = {"block_n": bn, "block_k": bk, "num_warps": warps, "num_stages": stages}
            try:
                us = timed(lambda w: ours(kind, w, cfg, False))
            except Exception as e:  # e.g. out of shared memory / registers for this tile
                rows.append({"config": cfg, "error": f"{type(e).__name__}: {str(e)[-300:]}"})
                continue
            rows.append({"config": cfg, "us": us, "gb_s": nbytes / us / 1e3})
        ok = sorted((rw for rw in rows if "us" in rw), key=lambda rw: rw["us"])
        if not ok:
            print(f"{kind}: every config failed, e.g. {rows[0]['error']}")
            continue
        best = ok[0]["config"]
        pdl = timed(lambda w: ours(kind, w, best, True))
        early = timed(lambda w: ours(kind, w, {**best, "early_launch": True}, True))
        res = {"cublas_us": cub, "cublas_gb_s": nbytes / cub / 1e3, "best": best, "best_us": ok[0]["us"],
               "best_gb_s": ok[0]["gb_s"], "pdl_us": pdl, "pdl_gb_s": nbytes / pdl / 1e3, "pdl_early_us": early,
               "pdl_early_gb_s": nbytes / early / 1e3, "sweep": rows}
        out["shapes"][kind] = res
        top = ", ".join(f"bn{rw['config']['block_n']}_bk{rw['config']['block_k']}_w{rw['config']['num_warps']}"
                        f"_s{rw['config']['num_stages']} {rw['us']:.1f}" for rw in ok[:5])
        print(f"{kind:8s} {n}x{k}: cuBLAS {cub:.1f} us ({res['cublas_gb_s']:.0f} GB/s) | ours best {ok[0]['us']:.1f} us "
              f"({res['best_gb_s']:.0f} GB/s), +PDL {pdl:.1f} us ({res['pdl_gb_s']:.0f} GB/s), +early launch {early:.1f} us "
              f"({res['pdl_early_gb_s']:.0f} GB/s) | top: {top}")
        ws.clear()
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    from probe_io import save_json_arg  # this folder's helper (the script's directory is on sys.path)

    save_json_arg(main(quick="--quick" in sys.argv))
