"""Probe (issue 24, session 23): the V2-Lite-like 2048-token prefill's two largest costs, each beside an alternative.

``python benchmarks/probe_prefill_moe.py OUT.json [sections [model variants]]`` on one CUDA device (sections: moe, attn, model;
default all, in that order). One line per finding; the JSON keeps the figures.

* moe: one MoE layer's routed experts at 2048 tokens x top-6 of 64 (hidden 2048, expert width 1408, bf16): the
  Triton grouped path (``kernels.fused_moe.fused_experts``) against torch's grouped GEMM over expert-sorted rows
  (``kernels.grouped_mm_moe``), the two grouped GEMMs alone on pre-sorted rows, and one dense cuBLAS GEMM of the
  same FLOPs; device times (CUDA graph of 5 calls), each as % of the bf16 matmul rate measured in the same run; the
  two paths' outputs compared; both paths again at 128-1024 tokens (where the policy's threshold goes).
* attn: the MLA prefill attention at 2048 tokens, 16 heads, qk 192 (128 + 64 rope) / v 128: today's
  ``kernels.mla_prefill.expanded_attention`` (values padded to 192, flash) and SDPA alone with each backend that
  accepts the unpadded 128-wide values.
* attn also: ``expanded_attention`` with ``PREFILL_KERNEL = "triton"`` (kernels/triton/mla_prefill_attention.py:
  read in place, no copies, no padding) over a few tiles.
* model: the V2-Lite-like model's prefill (``bench.moe_bench.prefill_row``: eager, device, graph-replayed, % of
  the matmul rate): today's paths ("base") and both alternatives ("both"; argv[3] picks from base, grouped_mm_moe,
  triton_attn, both).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from torchinferno.bench.ceilings import sustained_matmul_rate
from torchinferno.bench.gpu_timing import graph_time_ms

DEV = torch.device("cuda")


def log(msg: str) -> None:
    print(msg, flush=True)


def moe_section(mm: float, T: int = 2048, k: int = 6, E: int = 64, D: int = 2048, inter: int = 1408) -> dict:
    from torchinferno.kernels import fused_moe, grouped_mm_moe

    g = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(T, D, device=DEV, generator=g).to(torch.bfloat16)
    gate_up = (torch.randn(E, 2 * inter, D, device=DEV, generator=g) * D**-0.5).to(torch.bfloat16)
    down = (torch.randn(E, D, inter, device=DEV, generator=g) * inter**-0.5).to(torch.bfloat16)
    logits = torch.randn(T, E, device=DEV, generator=g)
    w, ids = logits.softmax(-1).topk(k, dim=-1)
    flops = 2 * T * k * 3 * D * inter
    out = {"tokens": T, "top_k": k, "experts": E, "flops": flops, "matmul_tflops": mm / 1e12}
    order, ends = grouped_mm_moe.sort_pairs(ids, E)
    a = x.index_select(0, order // k)
    act = torch.randn(T * k, inter, device=DEV, generator=g).to(torch.bfloat16)
    dense_a = torch.randn(T * k, D, device=DEV, generator=g).to(torch.bfloat16)
    dense_w = torch.randn(3 * inter, D, device=DEV, generator=g).to(torch.bfloat16)
    with fused_moe.override_policy(grouped_mm_min_tokens=0):
        cases = {
            "triton_grouped": lambda: fused_moe.fused_experts(x, ids, w, gate_up, down),
            "grouped_mm_path": lambda: grouped_mm_moe.grouped_mm_experts(x, ids, w, gate_up, down),
            "grouped_mm_gemms_only": lambda: (torch._grouped_mm(a, gate_up.transpose(1, 2), offs=ends),
                                              torch._grouped_mm(act, down.transpose(1, 2), offs=ends)),
            "dense_cublas_same_flops": lambda: F.linear(dense_a, dense_w),
        }
        for name, fn in cases.items():
            try:
                ms = graph_time_ms(fn, calls=5, iters=10, fallback=False)
            except Exception as e:  # noqa: BLE001 - reported, the other cases still run
                out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                log(f"moe {name}: FAILED {out[name]['error']}")
                continue
            pct = 100 * flops / mm / (ms * 1e-3)
            out[name] = {"ms": ms, "pct_of_matmul_rate": pct}
            log(f"moe {name}: {ms * 1e3:.1f} us per layer = {pct:.0f}% of the matmul rate")
        ref = fused_moe.fused_experts(x, ids, w, gate_up, down).float()
        got = grouped_mm_moe.grouped_mm_experts(x, ids, w, gate_up, down).float()
    out["grouped_vs_triton_rel_err"] = float((got - ref).abs().max() / ref.abs().max())
    log(f"moe grouped_mm vs Triton: max rel err {out['grouped_vs_triton_rel_err']:.2e}")
    out["by_tokens"] = {}  # where the threshold goes: both paths at fewer tokens
    for t in (128, 256, 512, 1024):
        row = {}
        for name, fn in (("triton_grouped", lambda: fused_moe.fused_experts(x[:t], ids[:t], w[:t], gate_up, down)),
                         ("grouped_mm_path", lambda: grouped_mm_moe.grouped_mm_experts(x[:t], ids[:t], w[:t], gate_up,
                                                                                       down))):
            with fused_moe.override_policy(grouped_mm_min_tokens=0):
                row[name] = graph_time_ms(fn, calls=5, iters=10)
        out["by_tokens"][t] = row
        log(f"moe {t} tokens: Triton {row['triton_grouped'] * 1e3:.1f} us, grouped_mm {row['grouped_mm_path'] * 1e3:.1f} us")
    return out


def attn_section(T: int = 2048, H: int = 16, dn: int = 128, r: int = 64, dv: int = 128, R: int = 512) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from torchinferno.kernels.mla_prefill import expanded_attention

    g = torch.Generator(device=DEV).manual_seed(1)
    bf = torch.bfloat16
    q_nope = torch.randn(T, H, dn, device=DEV, generator=g).to(bf)
    q_pe = torch.randn(T, H, r, device=DEV, generator=g).to(bf)
    latent = torch.randn(T, R + r, device=DEV, generator=g).to(bf)
    w_kv_b = (torch.randn(H * (dn + dv), R, device=DEV, generator=g) * R**-0.5).to(bf)
    scale = (dn + r) ** -0.5
    flops = 2 * H * (dn + r + dv) * T * T // 2  # causal: half the score matrix
    out = {"tokens": T, "heads": H, "flops_causal": flops}
    from torchinferno.kernels import mla_prefill
    from torchinferno.kernels.triton import mla_prefill_attention as mpa

    chosen = mla_prefill.PREFILL_KERNEL
    mla_prefill.PREFILL_KERNEL = "sdpa"  # the padded flash call first: the baseline and the reference
    want = expanded_attention(q_nope, q_pe, latent, w_kv_b, scale, None).float()
    ms = graph_time_ms(lambda: expanded_attention(q_nope, q_pe, latent, w_kv_b, scale, None), calls=5, iters=10)
    out["expanded_attention_ms"] = ms
    log(f"attn expanded_attention (kv_b GEMM + padded flash + copies): {ms * 1e3:.1f} us per layer")
    real = mpa.default_config
    mla_prefill.PREFILL_KERNEL = "triton"
    try:
        for bm, bn, w, st in ((128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3)):
            mpa.default_config = lambda fp32, c={"block_m": bm, "block_n": bn, "num_warps": w, "num_stages": st}: c
            label = f"triton_in_place_{bm}x{bn}_w{w}_s{st}"
            try:
                got = expanded_attention(q_nope, q_pe, latent, w_kv_b, scale, None).float()
                ms = graph_time_ms(lambda: expanded_attention(q_nope, q_pe, latent, w_kv_b, scale, None), calls=5,
                                   iters=10, fallback=False)
            except Exception as e:  # noqa: BLE001 - a tile that does not fit is reported
                out[label] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                log(f"attn {label}: FAILED {out[label]['error']}")
                continue
            err = float((got - want).abs().max() / want.abs().max())
            out[label] = {"ms": ms, "rel_err_vs_sdpa": err}
            log(f"attn expanded_attention with {label}: {ms * 1e3:.1f} us per layer, rel err vs sdpa {err:.1e}")
    finally:
        mpa.default_config, mla_prefill.PREFILL_KERNEL = real, chosen
    q = torch.randn(1, H, T, dn + r, device=DEV, generator=g).to(bf)
    k = torch.randn(1, H, T, dn + r, device=DEV, generator=g).to(bf)
    v = torch.randn(1, H, T, dv, device=DEV, generator=g).to(bf)
    vp = F.pad(v, (0, dn + r - dv))
    for name, backend, vv in (("flash_padded_v", SDPBackend.FLASH_ATTENTION, vp),
                              ("cudnn_v128", SDPBackend.CUDNN_ATTENTION, v),
                              ("efficient_v128", SDPBackend.EFFICIENT_ATTENTION, v)):
        def fn(vv=vv, backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, vv, is_causal=True, scale=scale)

        try:
            o = fn()
            ref = F.scaled_dot_product_attention(q.float(), k.float(), vv.float(), is_causal=True, scale=scale)
            err = float((o.float() - ref).abs().max())
            ms = graph_time_ms(fn, calls=5, iters=10, fallback=False)
        except Exception as e:  # noqa: BLE001 - a backend that refuses the shape is reported
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            log(f"attn {name}: FAILED {out[name]['error']}")
            continue
        out[name] = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12, "max_abs_err": err}
        log(f"attn {name}: {ms * 1e3:.1f} us ({out[name]['tflops']:.0f} TFLOP/s on the unpadded FLOPs), err {err:.1e}")
    return out


def model_section(mm: float, labels=("base", "both")) -> dict:
    from torchinferno.bench.moe_bench import prefill_row
    from torchinferno.bench.moe_models import build_v2_lite
    from torchinferno.kernels import fused_moe, mla_prefill

    model = build_v2_lite(DEV)
    out, chosen = {}, mla_prefill.PREFILL_KERNEL
    variants = {"base": (0, "sdpa"), "grouped_mm_moe": (256, "sdpa"), "triton_attn": (0, "triton"),
                "both": (256, "triton")}
    for label in labels:
        threshold, attn = variants[label]
        mla_prefill.PREFILL_KERNEL = attn
        with fused_moe.override_policy(grouped_mm_min_tokens=threshold):
            log(f"model prefill {label} (grouped_mm_min_tokens={threshold}, PREFILL_KERNEL={attn}):")
            out[label] = prefill_row(model, DEV, 2048, mm, log, torch_moe=False, kernels=label == "both")
    mla_prefill.PREFILL_KERNEL = chosen
    return out


def main() -> None:
    path = sys.argv[1]
    sections = sys.argv[2].split(",") if len(sys.argv) > 2 else ["moe", "attn", "model"]
    mm = sustained_matmul_rate(DEV)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "matmul_rate": mm}
    log(f"{res['device']}, torch {res['torch']}: bf16 matmul {mm / 1e12:.0f} TFLOP/s")
    for s in sections:
        labels = sys.argv[3].split(",") if len(sys.argv) > 3 else ("base", "both")
        res[s] = {"moe": lambda: moe_section(mm), "attn": attn_section,
                  "model": lambda: model_section(mm, labels)}[s]()
        with open(path, "w") as f:
            json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
