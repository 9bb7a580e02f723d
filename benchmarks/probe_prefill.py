"""Probe: where (c)'s 2048-token prefill loses time against the matmul ceiling (Llama-3-8B shape, random bf16).

Run on the GPU machine from the repo root: ``PYTHONPATH=src python3 benchmarks/probe_prefill.py [--json F]``.
In one process, with the SM clock, power and clock-event reasons sampled through NVML in a thread and summarised
per phase:

- the matmul ceiling as bench-gpu measures it (one 8192^3 product at a time, best of 10: a burst) beside the same
  products back to back in one graph for about as long as a prefill (sustained);
- the prefill, graph-replayed (bench-gpu (c)'s figure);
- the model's 128 prefill GEMMs alone, in model order, on its own weights (graph-replayed), and the per-shape
  rates when each shape runs alone (bench-gpu's ``prefill_gemm_shapes``): what the element-wise kernels and the sustained load cost the GEMMs;
- the o/down projections with the residual add fused into cuBLAS's epilogue (``addmm`` with beta 1) + a norm
  that then reads one tensor instead of two, against the unfused pair;
- cuBLASLt as the preferred BLAS library, and PyTorch's TunableOp (cuBLASLt algorithms timed per shape);
- one layer's causal attention through each SDPA route and our Triton paged prefill kernel.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.nn.functional as F

from torchinferno.bench.ceilings import matmul_rate, sustained_matmul_rate
from torchinferno.bench.gpu_bench import model_flops_prefill, prefill_gemm_shapes, prefill_runner
from torchinferno.bench.gpu_clocks import ClockSampler
from torchinferno.bench.gpu_decode import build_random_model
from torchinferno.bench.gpu_timing import graph_time_ms, profile_kernels

T = 2048


def timed(clock, phase, fn, *a, **k):
    with clock.phase(phase):
        return fn(*a, **k)


def model_linears(model):
    layers = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        layers.append((a.qkv_proj.weight, a.o_proj.weight, m.gate_up_proj.weight, m.down_proj.weight))
    return layers


def gemm_sequence(layers, fused_residual=False):
    """The prefill's GEMMs in model order on fresh-looking inputs; optionally o/down accumulate into a residual."""
    dev = layers[0][0].device
    xd = torch.randn(T, layers[0][0].shape[1], device=dev, dtype=torch.bfloat16)
    xi = torch.randn(T, layers[0][3].shape[1], device=dev, dtype=torch.bfloat16)
    res = torch.randn(T, layers[0][1].shape[0], device=dev, dtype=torch.bfloat16)
    qkv_o = torch.empty(T, layers[0][0].shape[0], device=dev, dtype=torch.bfloat16)
    gu_o = torch.empty(T, layers[0][2].shape[0], device=dev, dtype=torch.bfloat16)
    d_o = torch.empty(T, layers[0][1].shape[0], device=dev, dtype=torch.bfloat16)

    def run():
        for wqkv, wo, wgu, wd in layers:
            torch.mm(xd, wqkv.t(), out=qkv_o)
            if fused_residual:
                res.addmm_(xd, wo.t())  # res += x @ W^T in the GEMM's epilogue (beta 1), in place
            else:
                torch.mm(xd, wo.t(), out=d_o)
            torch.mm(xd, wgu.t(), out=gu_o)
            if fused_residual:
                res.addmm_(xi, wd.t())
            else:
                torch.mm(xi, wd.t(), out=d_o)
    flops = sum(2 * T * w.shape[0] * w.shape[1] for ws in layers for w in ws)
    return run, flops


def norm_pair(dim=4096, calls=64):
    from torchinferno.kernels import api as kapi

    x = torch.randn(T, dim, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(T, dim, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(dim, device="cuda", dtype=torch.bfloat16)
    with_res = graph_time_ms(lambda: kapi.add_rms_norm(x, r, w, 1e-5), calls=calls, iters=10) * calls
    plain = graph_time_ms(lambda: kapi.rms_norm(x, w, 1e-5), calls=calls, iters=10) * calls
    return {"add_rms_norm_x64_ms": with_res, "rms_norm_x64_ms": plain}


def attention_routes(cfg) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    h, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim_
    qkv = torch.randn(T, (h + 2 * kv) * hd, device="cuda", dtype=torch.bfloat16)
    q = qkv[:, : h * hd].view(T, h, hd)
    k = qkv[:, h * hd: (h + kv) * hd].view(T, kv, hd)
    v = qkv[:, (h + kv) * hd:].view(T, kv, hd)
    qc, kc, vc = (t.transpose(0, 1).contiguous()[None] for t in (q, k, v))  # [1, H, T, D] dense
    flops = 2 * 2 * h * hd * T * (T + 1) / 2
    ref = F.scaled_dot_product_attention(qc.float(), kc.float().repeat_interleave(h // kv, 1),
                                         vc.float().repeat_interleave(h // kv, 1), is_causal=True)

    def sdpa(qq, kk, vv, backend=None):
        def fn():
            if backend is None:
                return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, enable_gqa=True)
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, enable_gqa=True)
        return fn

    strided = (q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None])
    routes = {"model (strided, default)": sdpa(*strided),
              "strided cudnn": sdpa(*strided, backend=SDPBackend.CUDNN_ATTENTION),
              "strided flash": sdpa(*strided, backend=SDPBackend.FLASH_ATTENTION),
              "dense cudnn": sdpa(qc, kc, vc, backend=SDPBackend.CUDNN_ATTENTION),
              "dense cudnn expanded kv": sdpa(qc, kc.repeat_interleave(h // kv, 1), vc.repeat_interleave(h // kv, 1),
                                              backend=SDPBackend.CUDNN_ATTENTION)}
    out = {}
    for name, fn in routes.items():
        try:
            o = fn()
            err = float((o.float() - ref).norm() / ref.norm())
            ms = graph_time_ms(fn, calls=10, iters=10)
            out[name] = {"ms": ms, "tflop_s": flops / ms / 1e9, "rel_err": err}
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:100]}"}
    return out


def main(argv):
    json_path = argv[argv.index("--json") + 1] if "--json" in argv else None
    torch.set_grad_enabled(False)
    clock = ClockSampler().start()
    rep: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}

    def show(k, v):
        rep[k] = v
        print(f"{k}: {json.dumps(v, default=str)}", flush=True)

    time.sleep(0.3)
    show("mm_burst_tflop_s", timed(clock, "mm_burst", matmul_rate, "cuda", torch.bfloat16, 8192, 10) / 1e12)
    show("mm_sustained_tflop_s", timed(clock, "mm_sustained", sustained_matmul_rate, "cuda", torch.bfloat16, 8192) / 1e12)
    model = build_random_model("llama3-8b", "cuda")
    cfg = model.config
    flops = model_flops_prefill(cfg, T)
    r = timed(clock, "prefill", measure_prefill_graph, model)
    show("prefill_graph_ms", r)
    show("prefill_graph_tflop_s", flops / r / 1e9)
    layers = model_linears(model)
    run, gflops = gemm_sequence(layers)
    ms = timed(clock, "gemm_seq", graph_time_ms, run, calls=1, iters=10)
    show("gemm_seq", {"ms": ms, "tflop_s": gflops / ms / 1e9})
    prof = profile_kernels(run)
    show("gemm_seq_kernels", prof["top"])
    show("per_shape_tflop_s", timed(clock, "per_shape", prefill_gemm_shapes, model, T))
    run_f, _ = gemm_sequence(layers, fused_residual=True)
    ms_f = timed(clock, "gemm_seq_addmm", graph_time_ms, run_f, calls=1, iters=10)
    show("gemm_seq_addmm", {"ms": ms_f, "tflop_s": gflops / ms_f / 1e9, "kernels": profile_kernels(run_f)["top"]})
    show("norms", norm_pair())
    try:
        torch.backends.cuda.preferred_blas_library("cublaslt")
        ms_lt = timed(clock, "gemm_seq_cublaslt", graph_time_ms, run, calls=1, iters=10)
        show("gemm_seq_cublaslt", {"ms": ms_lt, "tflop_s": gflops / ms_lt / 1e9, "kernels": profile_kernels(run)["top"]})
    except Exception as e:
        show("gemm_seq_cublaslt", {"error": str(e)[:200]})
    finally:
        torch.backends.cuda.preferred_blas_library("default")
    show("attention", timed(clock, "attention", attention_routes, cfg))
    r2 = timed(clock, "prefill_again", measure_prefill_graph, model)
    show("prefill_graph_again_tflop_s", flops / r2 / 1e9)
    try:  # TunableOp: time every cuBLASLt algorithm per GEMM shape, keep the fastest
        import torch.cuda.tunable as tunable

        tunable.enable(True)
        tunable.tuning_enable(True)
        tunable.set_max_tuning_duration(40)
        tunable.set_filename("/tmp/tunableop_results.csv")
        t0 = time.perf_counter()
        timed(clock, "tuning", run)
        torch.cuda.synchronize()
        tunable.tuning_enable(False)
        tune_s = time.perf_counter() - t0
        ms_t = timed(clock, "gemm_seq_tunable", graph_time_ms, run, calls=1, iters=10)
        res = tunable.get_results()
        show("gemm_seq_tunableop", {"ms": ms_t, "tflop_s": gflops / ms_t / 1e9, "tune_s": tune_s,
                                    "kernels": profile_kernels(run)["top"], "results": [str(x)[:160] for x in res][:8]})
        timed(clock, "tuning", measure_prefill_graph, model)  # tune the remaining (head) shapes
        r3 = timed(clock, "prefill_tunable", measure_prefill_graph, model)
        show("prefill_graph_tunableop_tflop_s", flops / r3 / 1e9)
        tunable.enable(False)
    except Exception as e:
        show("tunableop", {"error": f"{type(e).__name__}: {str(e)[:200]}"})
    clock.stop()
    show("clocks", clock.summary())
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rep, f, indent=2, default=str)


def measure_prefill_graph(model) -> float:
    return graph_time_ms(prefill_runner(model, T), calls=1, iters=10)


if __name__ == "__main__":
    main(sys.argv[1:])
