"""Probe: Llama-3-8B linears in bf16 vs FP8 W8A8 (kernels.fp8_linear) at decode and prefill M.

Run on the GPU machine from the repo root: ``PYTHONPATH=src python3 benchmarks/probe_fp8_linear.py``.
Prints device time per call (CUDA-graph replays) for F.linear bf16, the FP8 module (Triton per-token
quantization + rowwise-scaled ``torch._scaled_mm``), the quantization alone and ``_scaled_mm``
alone, as TFLOP/s and weight GB/s, beside the same-run bf16 matmul and copy ceilings.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from torchinferno.bench.ceilings import copy_bandwidth, matmul_rate
from torchinferno.bench.gpu_timing import graph_time_ms
from torchinferno.kernels.fp8_linear import Fp8Linear
from torchinferno.kernels.triton.fp8_quant import quantize_fp8_rows_triton

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}


def main(ms=(1, 64, 256, 2048)) -> dict:
    dev = torch.device("cuda")
    bw, mm = copy_bandwidth(dev, nbytes=2 * 1024**3, iters=5), matmul_rate(dev, torch.bfloat16, n=8192, iters=5)
    a = torch.randn(8192, 8192, device=dev).to(torch.float8_e4m3fn)
    b = torch.randn(8192, 8192, device=dev).to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=dev)
    fp8_ms = graph_time_ms(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), calls=5)
    out = {"copy_gb_s": bw / 1e9, "bf16_tflop_s": mm / 1e12, "fp8_tflop_s_8192": 2 * 8192**3 / fp8_ms / 1e9, "rows": []}
    print(f"ceilings: copy {bw / 1e9:.0f} GB/s, bf16 matmul {mm / 1e12:.0f} TFLOP/s, fp8 matmul (per-tensor) "
          f"{out['fp8_tflop_s_8192']:.0f} TFLOP/s")
    for name, (k, n) in SHAPES.items():
        lin = torch.nn.Linear(k, n, bias=False, device=dev, dtype=torch.bfloat16)
        with torch.no_grad():
            lin.weight.normal_(0, 0.02)
        f8 = Fp8Linear.from_linear(lin, "scaled_mm")
        wt, ws = f8.weight_fp8.t(), f8.weight_scale.view(1, -1)
        for m in ms:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            xq, xs = quantize_fp8_rows_triton(x)
            t = {"bf16": graph_time_ms(lambda: F.linear(x, lin.weight)), "fp8": graph_time_ms(lambda: f8(x)),
                 "quant": graph_time_ms(lambda: quantize_fp8_rows_triton(x)),
                 "scaled_mm": graph_time_ms(lambda: torch._scaled_mm(xq, wt, scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16))}
            flop = 2 * m * k * n
            row = {"shape": name, "m": m, **{f"{key}_us": v * 1e3 for key, v in t.items()},
                   "bf16_tflop_s": flop / t["bf16"] / 1e9, "fp8_tflop_s": flop / t["fp8"] / 1e9,
                   "bf16_weight_gb_s": 2 * k * n / t["bf16"] / 1e6, "fp8_weight_gb_s": k * n / t["fp8"] / 1e6}
            out["rows"].append(row)
            print(f"{name:8s} M={m:5d}: bf16 {row['bf16_us']:8.1f} us ({row['bf16_tflop_s']:5.0f} TFLOP/s, "
                  f"{row['bf16_weight_gb_s']:5.0f} GB/s) | fp8 {row['fp8_us']:8.1f} us ({row['fp8_tflop_s']:5.0f} TFLOP/s, "
                  f"{row['fp8_weight_gb_s']:5.0f} GB/s) = quant {row['quant_us']:.1f} + mm {row['scaled_mm_us']:.1f} | "
                  f"speedup {row['bf16_us'] / row['fp8_us']:.2f}x")
    return out


if __name__ == "__main__":
    res = main()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(res, f, indent=2)
