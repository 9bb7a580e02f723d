"""Probe: fused_rmsnorm_swiglu at Llama-3-8B shapes — Triton fused (add+norm kernel, GEMM with SwiGLU epilogue)
vs the unfused kernels (Triton add+norm, cuBLAS GEMM, Triton SwiGLU) vs the torch reference, plus a tile sweep.

Run on the GPU machine from the repo root: ``PYTHONPATH=src python3 benchmarks/probe_fused_mlp.py [out.json]``.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from torchinferno.bench.ceilings import matmul_rate
from torchinferno.bench.gpu_timing import graph_time_ms
from torchinferno.kernels import custom_ops  # noqa: F401  (registers the ops)
from torchinferno.kernels.custom_ops import reference_fused_rmsnorm_swiglu
from torchinferno.kernels.triton.activation import swiglu_activation
from torchinferno.kernels.triton.gemm_swiglu import matmul_swiglu
from torchinferno.kernels.triton.norm import add_rms_norm

SWEEP = [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=w, num_stages=s)
         for bm, bn, bk, w, s in ((128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
                                  (128, 128, 32, 8, 4), (64, 64, 128, 4, 4), (128, 256, 64, 8, 3), (64, 64, 64, 4, 5))]


def main(d: int = 4096, inter: int = 14336, ms=(1, 64, 256, 2048)) -> dict:
    dev = torch.device("cuda")
    mm = matmul_rate(dev, torch.bfloat16, n=8192, iters=5)
    print(f"bf16 matmul {mm / 1e12:.0f} TFLOP/s")
    bf = torch.bfloat16
    w = torch.rand(d, device=dev, dtype=bf) + 0.5
    gu = torch.randn(2 * inter, d, device=dev, dtype=bf) * 0.02
    out = {"bf16_tflop_s": mm / 1e12, "rows": []}
    for m in ms:
        x, res = torch.randn(m, d, device=dev, dtype=bf), torch.randn(m, d, device=dev, dtype=bf)

        def unfused():
            n, h = add_rms_norm(x, res, w, 1e-5)
            return swiglu_activation(F.linear(n, gu)), h

        n, _ = add_rms_norm(x, res, w, 1e-5)
        t = {"fused": graph_time_ms(lambda: torch.ops.torchinferno.fused_rmsnorm_swiglu(x, res, w, gu, 1e-5)),
             "unfused": graph_time_ms(unfused), "reference": graph_time_ms(lambda: reference_fused_rmsnorm_swiglu(x, res, w, gu, 1e-5)),
             "gemm_swiglu": graph_time_ms(lambda: matmul_swiglu(n, gu)), "cublas_gemm": graph_time_ms(lambda: F.linear(n, gu))}
        flop = 2 * m * d * 2 * inter
        row = {"m": m, **{f"{k}_us": v * 1e3 for k, v in t.items()}, "fused_gemm_tflop_s": flop / t["gemm_swiglu"] / 1e9,
               "cublas_tflop_s": flop / t["cublas_gemm"] / 1e9}
        if m >= 256:
            sweep = {}
            for cfg in SWEEP:
                try:
                    sweep[str(cfg)] = graph_time_ms(lambda: matmul_swiglu(n, gu, cfg)) * 1e3
                except Exception as e:  # out of shared memory etc.
                    sweep[str(cfg)] = f"{type(e).__name__}"
            row["sweep_us"] = sweep
            ok = {k: v for k, v in sweep.items() if isinstance(v, float)}
            best = min(ok, key=ok.get)
            print(f"  M={m} sweep best {best}: {ok[best]:.1f} us ({flop / ok[best] / 1e6:.0f} TFLOP/s)")
        out["rows"].append(row)
        print(f"M={m:5d}: fused {row['fused_us']:8.1f} us | unfused (norm + cuBLAS + SwiGLU) {row['unfused_us']:8.1f} us | "
              f"torch reference {row['reference_us']:8.1f} us | GEMM+SwiGLU {row['gemm_swiglu_us']:.1f} us "
              f"({row['fused_gemm_tflop_s']:.0f} TFLOP/s) vs cuBLAS GEMM alone {row['cublas_gemm_us']:.1f} us "
              f"({row['cublas_tflop_s']:.0f} TFLOP/s)")
    return out


if __name__ == "__main__":
    res = main()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(res, f, indent=2)
