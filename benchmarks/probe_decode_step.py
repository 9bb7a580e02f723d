"""Probe: the fused batch-1 decode step (models/llama3/cuda_decode.py) on the Llama-3-8B shape under tile variants.

Run on the GPU machine from the repo root: ``PYTHONPATH=src python3 benchmarks/probe_decode_step.py [--pick]``. Times the
real kernel chain (CUDA-graph step and device loop at context 128, same accounting as ``bench-gpu`` (a)) for
the default GEMV tiles and a few variants, beside the same-run copy bandwidth.
"""

from __future__ import annotations

import sys

import torch

from torchinferno.bench.ceilings import copy_bandwidth
from torchinferno.bench.generate_bench import weight_bytes_per_step
from torchinferno.bench.gpu_decode import DecodeBench, build_random_model

VARIANTS = {
    "default": {},
    "no early launch": {k: {"early_launch": False} for k in ("qkv", "o", "gate_up", "down")},
    "gate_up bn16 bk512": {"gate_up": {"block_n": 16, "block_k": 512, "num_stages": 3}},
    "gate_up bn4 bk2048": {"gate_up": {"block_n": 4, "block_k": 2048, "num_stages": 3}},
    "qkv bn4 bk2048": {"qkv": {"block_n": 4, "block_k": 2048, "num_stages": 3}},
    "o/down 8 warps": {"o": {"num_warps": 8}, "down": {"num_warps": 8}},
    "more stages": {k: {"num_stages": 4} for k in ("qkv", "o", "gate_up", "down")},
}
# --pick: the candidates worth a second look, each measured twice, interleaved with the default (noise)
PICK = {
    "default": {},
    "qkv bn4 bk2048 + 4 stages": {"qkv": {"block_n": 4, "block_k": 2048, "num_stages": 4},
                                  **{k: {"num_stages": 4} for k in ("o", "gate_up", "down")}},
    "4 stages": {k: {"num_stages": 4} for k in ("qkv", "o", "gate_up", "down")},
}


def main(pick: bool = False) -> dict:
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev, nbytes=2 * 1024**3, iters=5)
    model = build_random_model("llama3-8b", dev)
    wbytes = weight_bytes_per_step(model)
    bench = DecodeBench(model, max_batch=1, max_ctx=4096 + 64, buckets=(1,))
    out = {"copy_gb_s": bw / 1e9, "variants": {}}
    print(f"ceiling: copy {bw / 1e9:.0f} GB/s")
    runs = [(n, c, ctx) for _ in range(2) for n, c in PICK.items() for ctx in (128, 4096)] if pick else \
        [(n, c, 128) for n, c in VARIANTS.items()]
    for name, cfg, ctx in runs:
        bench.set_fused_step(True, configs=cfg)
        r = bench.measure(1, ctx, wbytes, bw)
        out["variants"].setdefault(f"{name} @ {ctx}", []).append(
            {k: r[k] for k in ("step_ms", "loop_ms_per_step", "bound_ms", "fraction_of_bound")})
        print(f"{name:26s} ctx {ctx:4d} step {r['step_ms']:.3f} ms (loop {r['loop_ms_per_step']:.3f}) -> "
              f"{100 * r['fraction_of_bound']:.1f}% of bound ({100 * r['loop_fraction_of_bound']:.1f}% loop)")
    return out


if __name__ == "__main__":
    from probe_io import save_json_arg  # this folder's helper (the script's directory is on sys.path)

    save_json_arg(main(pick="--pick" in sys.argv))
