"""Probe: the fused MoE's expert compute at 1-4 tokens on the V2-Lite-like shape (64 experts top-6 + 2 shared,
hidden 2048, expert width 1408, bf16): the per-token kernels (``kernels.triton.moe_small``) under a small tile
sweep vs the grouped GEMMs (sort/pad + two grouped GEMMs + sum), replayed from CUDA graphs, beside the bound
(bytes of the experts hit / the same run's copy bandwidth). Prints the best per-token tiles: the numbers for
``MoEPolicy.small_m_tiles`` / ``small_m_max_tokens`` in ``kernels/triton/fused_moe_configs.json``.

Run on the GPU machine from the repo root: ``PYTHONPATH=src python3 benchmarks/probe_moe_small.py [out.json]``.
"""

from __future__ import annotations

import json
import sys

import torch

from torchinferno.bench.ceilings import copy_bandwidth
from torchinferno.bench.gpu_timing import graph_time_ms
from torchinferno.kernels import fused_moe
from torchinferno.kernels.triton import moe_small

GATE_UP = [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=3) for bn, bk, w in
           ((16, 256, 4), (8, 512, 4), (16, 512, 4), (32, 256, 8), (8, 256, 2))]
DOWN = [dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=s) for bn, bk, w, s in
        ((4, 2048, 8, 1), (8, 2048, 8, 1), (2, 2048, 4, 1), (8, 512, 4, 3), (4, 512, 4, 3))]


def main(E=64, top_k=6, D=2048, inter=1408, n_shared=2, tokens=(1, 2, 4)) -> dict:
    dev, bf = torch.device("cuda"), torch.bfloat16
    bw = copy_bandwidth(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    gate_up = torch.randn(E, 2 * inter, D, device=dev, dtype=bf, generator=g) * 0.02
    down = torch.randn(E, D, inter, device=dev, dtype=bf, generator=g) * 0.02
    s_gu = torch.randn(2 * n_shared * inter, D, device=dev, dtype=bf, generator=g) * 0.02
    s_dn = torch.randn(D, n_shared * inter, device=dev, dtype=bf, generator=g) * 0.02
    out = {"copy_bw": bw, "rows": []}
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s; shape E={E} top-{top_k} + {n_shared} shared, D={D}, I={inter}")
    for T in tokens:
        x = torch.randn(T, D, device=dev, dtype=bf, generator=g)
        ids = torch.stack([torch.randperm(E, device=dev)[:top_k] for _ in range(T)])
        w = torch.rand(T, top_k, device=dev)
        aw, aid = fused_moe.append_shared(w, ids, E, n_shared)
        hit = int(torch.unique(ids).numel()) + n_shared
        bound_ms = hit * 3 * D * inter * 2 / bw * 1e3
        grouped = graph_time_ms(lambda: fused_moe.fused_experts(x, aid, aw, gate_up, down, shared=(s_gu, s_dn),
                                                                small=False))
        ref = fused_moe.fused_experts(x, aid, aw, gate_up, down, shared=(s_gu, s_dn), small=False).float()
        best = None
        for c1 in GATE_UP:
            for c2 in DOWN:
                def run(c1=c1, c2=c2):
                    return moe_small.small_m_experts(x, aid, aw, gate_up, down, c1, c2, shared=(s_gu, s_dn))

                err = float((run().float() - ref).abs().max() / ref.abs().max())
                ms = graph_time_ms(run)
                if best is None or ms < best[0]:
                    best = (ms, c1, c2, err)
        row = {"tokens": T, "grouped_ms": grouped, "per_token_ms": best[0], "gate_up": best[1], "down": best[2],
               "rel_err_vs_grouped": best[3], "bound_ms": bound_ms}
        out["rows"].append(row)
        print(f"T={T}: grouped {grouped:.4f} ms  per-token best {best[0]:.4f} ms ({100 * bound_ms / best[0]:.0f}% of "
              f"bound {bound_ms:.4f})  gate_up {best[1]}  down {best[2]}  rel err {best[3]:.1e}")
    return out


if __name__ == "__main__":
    rep = main()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rep, f, indent=1)
