"""Probe: Llama-3-8B linears in bf16 vs FP8 W8A8 (kernels.fp8_linear) at decode and prefill M.

Run on the GPU machine from the repo root: ``PYTHONPATH=src python3 benchmarks/probe_fp8_linear.py``.
Prints device time per call (CUDA-graph replays) for F.linear bf16, the FP8 module (Triton per-token
quantization, then the small-M Triton GEMV or rowwise-scaled ``torch._scaled_mm``), the same with
``_scaled_mm`` for every M, the quantization alone and ``_scaled_mm``
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

DOT_CONFIGS = ((16, 256, 4, 4), (32, 256, 4, 4), (16, 512, 4, 3), (32, 512, 4, 3), (64, 256, 4, 4), (16, 1024, 4, 2),
               (32, 128, 4, 6))
SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}


def main(ms=(1, 4, 256)) -> dict:
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
        f8, f8_mm = Fp8Linear.from_linear(lin, "scaled_mm"), Fp8Linear.from_linear(lin, "scaled_mm")
        f8_mm.gemv_rows = 0  # every M through _scaled_mm
        wt, ws = f8.weight_fp8.t(), f8.weight_scale.view(1, -1)
        for m in ms:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            xq, xs = quantize_fp8_rows_triton(x)
            t = {"bf16": graph_time_ms(lambda: F.linear(x, lin.weight)), "fp8": graph_time_ms(lambda: f8(x)),
                 "fp8_no_gemv": graph_time_ms(lambda: f8_mm(x)),
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
                  f"(no GEMV {row['fp8_no_gemv_us']:.1f}) | speedup {row['bf16_us'] / row['fp8_us']:.2f}x")
    if "--sweep" in sys.argv:
        out["gemv_sweep"] = gemv_sweep(dev)
    return out


def gemv_sweep(dev) -> list:
    """Launch configs of the skinny FP8 kernel (block_n, block_k, warps, stages) per shape and M, beside _scaled_mm."""
    from torchinferno.kernels.triton.fp8_gemv import fp8_skinny_dot

    rows = []
    for name, (k, n) in SHAPES.items():
        w = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
        ws = torch.rand(n, device=dev)
        for m in (1, 4, 16):
            xq, xs = quantize_fp8_rows_triton(torch.randn(m, k, device=dev, dtype=torch.bfloat16))
            res = {"scaled_mm": 1e3 * graph_time_ms(lambda: torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=ws.view(1, -1),
                                                                           out_dtype=torch.bfloat16))}
            for bn, bk, nw, st in DOT_CONFIGS:
                try:
                    us = 1e3 * graph_time_ms(lambda: fp8_skinny_dot(xq, xs, w, ws, torch.bfloat16, bn, bk, nw, st))
                except Exception as e:  # a config Triton cannot build
                    print(f"  dot bn{bn}_bk{bk}_w{nw}_s{st}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                res[f"bn{bn}_bk{bk}_w{nw}_s{st}"] = us
            best = min(res, key=res.get)
            rows.append({"shape": name, "m": m, "us": res, "best": best})
            print(f"gemv sweep {name:8s} M={m}: best {best} {res[best]:.1f} us ({k * n / res[best] / 1e3:.0f} GB/s); "
                  + ", ".join(f"{c} {v:.1f}" for c, v in res.items()))
    return rows


def decode_steps(dev, cases=((1, 128), (4, 128), (64, 1024), (256, 1024))) -> dict:
    """The 8B model's decode step (CUDA graph) in bf16, then with FP8 W8A8 linears, same weights."""
    from torchinferno.bench.generate_bench import weight_bytes_per_step
    from torchinferno.bench.gpu_decode import DecodeBench, build_random_model
    from torchinferno.kernels.fp8_linear import swap_linear_for_fp8

    bw = copy_bandwidth(dev, nbytes=2 * 1024**3, iters=5)
    model = build_random_model("llama3-8b", dev)
    out = {}
    for label in ("bf16", "fp8"):
        if label == "fp8":
            swap_linear_for_fp8(model)
            torch.cuda.empty_cache()
        wbytes = weight_bytes_per_step(model)
        bench = DecodeBench(model, max_batch=256, max_ctx=1100, buckets=(1, 4, 64, 256))
        for b, ctx in cases:
            r = bench.measure(b, ctx, wbytes, bw)
            out[f"{label}_b{b}_ctx{ctx}"] = {k: r[k] for k in ("step_ms", "loop_ms_per_step", "tok_s", "bound_ms")}
            print(f"decode {label} batch {b} ctx {ctx}: graph step {r['step_ms']:.3f} ms, loop {r['loop_ms_per_step']:.3f} "
                  f"ms/step, {r['tok_s']:.0f} tok/s; weight+KV bytes {r['bytes'] / 1e9:.2f} GB -> bound "
                  f"{r['bound_ms']:.3f} ms ({100 * r['fraction_of_bound']:.0f}%)")
        del bench
    return out


if __name__ == "__main__":
    res = main()
    if "--decode" in sys.argv:
        res["decode"] = decode_steps(torch.device("cuda"))
    sys.argv = [a for a in sys.argv if a not in ("--decode", "--sweep")]
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(res, f, indent=2)
