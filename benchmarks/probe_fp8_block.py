"""Probe: DeepSeek linears in bf16 vs block-scaled FP8 (kernels.fp8_block, ``--quantization fp8-block``), and the
V2-Lite-like model's logits under fp8-block vs bf16.

Run on the GPU machine from the repo root: ``PYTHONPATH=src python3 benchmarks/probe_fp8_block.py OUT.json [sections]``
(sections: ``micro``, ``sweep``, ``moe``, ``accuracy``; default all).

* ``micro``: at M = 1, 16, 128, 2048 rows and real DeepSeek [N, K] shapes (V2-Lite-like: q_proj 3072x2048, o_proj
  2048x2048, dense gate_up 21888x2048 and down 2048x10944; V3: q_b 24576x1536, o_proj 7168x16384, dense down
  7168x18432, shared gate_up 4096x7168, kv_a 576x7168): device time per call (CUDA-graph replays, the weight
  cycled over enough copies to exceed the 50 MB L2 so decode rows stream from HBM) of bf16 ``F.linear``, the
  fp8-block module (quantizer + GEMM, default tiles), the GEMM alone, and the per-channel FP8 module
  (``kernels.fp8_linear``) for reference, and the GEMM with K unsplit where ``block_config`` splits it; TFLOP/s and GB/s (weight + activation + output bytes) beside the same-run
  copy bandwidth and bf16 matmul rate.
* ``moe``: the routed experts alone at V2-Lite-like and V3 layer shapes, 1 / 16 / 128 / 2048 tokens: the bf16 fused
  MoE vs the block-FP8 fused MoE on the same weights (ms, GB/s of the experts hit, relative error vs bf16).
* ``sweep``: a few tile configs of the GEMM alone per (shape, M): what ``kernels.fp8_block.M_TILES`` should say.
* ``accuracy``: the V2-Lite-like model (random bf16, ``bench.moe_bench.build_model_shape``): logits of a 64-token
  prefill bf16 vs fp8-block linears only vs fp8-block linears + experts (max / mean abs diff, relative to the
  bf16 logits' max), greedy agreement over 32 tokens (the bf16 model's greedy continuation, teacher-forced:
  argmax agreement per position; and the first position where free-running greedy decoding differs).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from torchinferno.bench.ceilings import copy_bandwidth, matmul_rate
from torchinferno.bench.gpu_timing import cuda_time_ms

SHAPES = {  # name -> (N, K)
    "v2l_q_proj": (3072, 2048), "v2l_o_proj": (2048, 2048), "v2l_gate_up": (21888, 2048), "v2l_down": (2048, 10944),
    "v3_q_b": (24576, 1536), "v3_o_proj": (7168, 16384), "v3_down": (7168, 18432), "v3_shared_gu": (4096, 7168),
    "v3_kv_a": (576, 7168),
}
MS = (1, 16, 128, 2048)
SWEEP = ({"BLOCK_M": 16, "BLOCK_N": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 4},
         {"BLOCK_M": 16, "BLOCK_N": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 4, "SPLIT_K": 2},
         {"BLOCK_M": 16, "BLOCK_N": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 4, "SPLIT_K": 8},
         {"BLOCK_M": 16, "BLOCK_N": 64, "GROUP_M": 1, "num_warps": 4, "num_stages": 4, "SPLIT_K": 4},
         {"BLOCK_M": 16, "BLOCK_N": 64, "GROUP_M": 1, "num_warps": 4, "num_stages": 5},
         {"BLOCK_M": 16, "BLOCK_N": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 4},
         {"BLOCK_M": 32, "BLOCK_N": 128, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
         {"BLOCK_M": 64, "BLOCK_N": 128, "GROUP_M": 8, "num_warps": 4, "num_stages": 3},
         {"BLOCK_M": 64, "BLOCK_N": 128, "GROUP_M": 32, "num_warps": 4, "num_stages": 3},
         {"BLOCK_M": 128, "BLOCK_N": 128, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
         {"BLOCK_M": 128, "BLOCK_N": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4})
L2_BYTES = 100 * 1024**2  # cycle weight copies past this (H100/H200 L2: 50 MB)


def _per_call_ms(ops: list, reps: int = 4) -> float:
    """Device ms per op call: all ``ops`` (each reading its own weight copy) ``reps`` times in one CUDA graph."""
    for op in ops:
        op()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            for op in ops:
                op()
    return cuda_time_ms(g.replay, iters=10, warmup=2) / (reps * len(ops))


def micro(dev, log=print) -> list[dict]:
    from torchinferno.kernels.fp8_block import Fp8BlockLinear, block_config, quantize_weight_blocks
    from torchinferno.kernels.fp8_linear import Fp8Linear
    from torchinferno.kernels.triton.fp8_block import fp8_block_matmul, quantize_fp8_groups_triton

    rows = []
    for name, (N, K) in SHAPES.items():
        copies = max(1, min(8, -(-L2_BYTES // (N * K))))  # by the FP8 bytes; bf16 copies are twice as large
        ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        blocks = [Fp8BlockLinear(*quantize_weight_blocks(w)) for w in ws]
        rowwise = [Fp8Linear.from_linear(torch.nn.Linear(K, N, bias=False, device=dev, dtype=torch.bfloat16))
                   for _ in range(copies)]
        for M in MS:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            xq, xs = quantize_fp8_groups_triton(x)
            cfg = block_config(M, N, K)
            t = {"bf16": _per_call_ms([lambda w=w: F.linear(x, w) for w in ws]),
                 "fp8_block": _per_call_ms([lambda b=b: b(x) for b in blocks]),
                 "gemm": _per_call_ms([lambda b=b: fp8_block_matmul(xq, xs, b.weight_fp8, b.weight_scale_inv,
                                                                     torch.bfloat16, cfg) for b in blocks]),
                 "gemm_nosplit": _per_call_ms([lambda b=b: fp8_block_matmul(  # the default tiles, K unsplit
                     xq, xs, b.weight_fp8, b.weight_scale_inv, torch.bfloat16, {**cfg, "SPLIT_K": 1})
                     for b in blocks]),
                 "quant": _per_call_ms([lambda: quantize_fp8_groups_triton(x)]),
                 "fp8_rowwise": _per_call_ms([lambda r=r: r(x) for r in rowwise])}
            flop = 2 * M * N * K
            row = {"shape": name, "N": N, "K": K, "M": M, "copies": copies, "config": cfg,
                   **{f"{k}_ms": v for k, v in t.items()}}
            for k, nbytes in (("bf16", 2 * N * K + 2 * M * K + 2 * M * N),
                              ("fp8_block", N * K + 2 * M * K + 2 * M * N + 4 * (N // 128 + 1) * (K // 128 + 1))):
                row[f"{k}_tflop_s"] = flop / t[k] / 1e9
                row[f"{k}_gb_s"] = nbytes / t[k] / 1e6
            row["speedup"] = t["bf16"] / t["fp8_block"]
            rows.append(row)
            log(f"micro {name:12s} M={M:4d}: bf16 {t['bf16'] * 1e3:7.1f}us {row['bf16_tflop_s']:4.0f}TF "
                f"{row['bf16_gb_s']:4.0f}GB/s | fp8b {t['fp8_block'] * 1e3:7.1f}us {row['fp8_block_tflop_s']:4.0f}TF "
                f"{row['fp8_block_gb_s']:4.0f}GB/s =q{t['quant'] * 1e3:.1f}+mm{t['gemm'] * 1e3:.1f} (split "
                f"{cfg['SPLIT_K']}; unsplit {t['gemm_nosplit'] * 1e3:.1f}) | rowwise "
                f"{t['fp8_rowwise'] * 1e3:.1f}us | {row['speedup']:.2f}x")
        del ws, blocks, rowwise
        torch.cuda.empty_cache()
    return rows


def sweep(dev, log=print) -> list[dict]:
    from torchinferno.kernels.fp8_block import block_config, quantize_weight_blocks
    from torchinferno.kernels.triton.fp8_block import fp8_block_matmul, quantize_fp8_groups_triton

    rows = []
    for name in ("v2l_o_proj", "v2l_gate_up", "v3_q_b", "v3_down"):
        N, K = SHAPES[name]
        copies = max(1, min(8, -(-L2_BYTES // (N * K))))
        ws = [quantize_weight_blocks(torch.randn(N, K, device=dev) * 0.02) for _ in range(copies)]
        for M in MS:
            xq, xs = quantize_fp8_groups_triton(torch.randn(M, K, device=dev, dtype=torch.bfloat16))
            res = {}
            for cfg in (block_config(M, N, K), *SWEEP):
                key = "bm{BLOCK_M}_bn{BLOCK_N}_g{GROUP_M}_w{num_warps}_s{num_stages}_k{SPLIT_K}".format(**{"SPLIT_K": 1, **cfg})
                if key in res:
                    continue
                try:
                    res[key] = 1e3 * _per_call_ms([lambda w=w, cfg=cfg: fp8_block_matmul(xq, xs, w[0], w[1],
                                                                                          torch.bfloat16, cfg)
                                                   for w in ws])
                except Exception as e:  # noqa: BLE001 - a config Triton cannot build (shared memory): reported
                    log(f"  sweep {name} M={M} {key}: {type(e).__name__}: {str(e)[:160]}")
            default = "bm{BLOCK_M}_bn{BLOCK_N}_g{GROUP_M}_w{num_warps}_s{num_stages}_k{SPLIT_K}".format(**block_config(M, N, K))
            best = min(res, key=res.get)
            rows.append({"shape": name, "M": M, "us": res, "best": best, "default": default})
            log(f"sweep {name:12s} M={M:5d}: best {best} {res[best]:.1f} us ({2 * M * N * K / res[best] / 1e6:.0f} "
                f"TFLOP/s, {N * K / res[best] / 1e3:.0f} GB/s), default {default} {res.get(default, float('nan')):.1f} us")
        del ws
        torch.cuda.empty_cache()
    return rows


MOE_SHAPES = {"v2-lite": (64, 6, 2048, 1408), "v3": (256, 8, 7168, 2048)}  # name -> (E, top_k, D, I)


def moe(dev, log=print, tokens=(1, 16, 128, 2048)) -> list[dict]:
    """Routed experts alone: the bf16 fused MoE (``kernels.fused_moe``) vs the block-FP8 fused MoE on the same
    weights, uniform random routing, CUDA-graph replays; bytes = the experts the routing hits. The FP8 MoE is timed
    with its default quantizer placement and with the other one (``quant_inline``: in the grouped GEMMs, which run
    52 showed doubling the dense M=1 GEMM, or as separate launches), for ``FUSE_QUANT_MAX_TOKENS``."""
    from torchinferno.kernels import fused_moe
    from torchinferno.kernels.fp8_block_moe import FUSE_QUANT_MAX_TOKENS, fused_fp8_block_experts, quantize_expert_blocks

    rows = []
    for name, (E, k, D, inter) in MOE_SHAPES.items():
        gu = torch.randn(E, 2 * inter, D, device=dev, dtype=torch.bfloat16) * 0.02
        dn = torch.randn(E, D, inter, device=dev, dtype=torch.bfloat16) * 0.02
        q = (*quantize_expert_blocks(gu), *quantize_expert_blocks(dn))
        for T in tokens:
            x = torch.randn(T, D, device=dev, dtype=torch.bfloat16)
            ids = torch.stack([torch.randperm(E, device=dev)[:k] for _ in range(T)])
            w = torch.rand(T, k, device=dev)
            hit = int(torch.unique(ids).numel())
            t_bf16 = _per_call_ms([lambda: fused_moe.fused_experts(x, ids, w, gu, dn)])
            t_fp8 = _per_call_ms([lambda: fused_fp8_block_experts(x, ids, w, *q)])
            inline = T <= FUSE_QUANT_MAX_TOKENS  # the default placement; time the other one too
            t_other = _per_call_ms([lambda: fused_fp8_block_experts(x, ids, w, *q, quant_inline=not inline)])
            want, got = fused_moe.fused_experts(x, ids, w, gu, dn), fused_fp8_block_experts(x, ids, w, *q)
            err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
            row = {"shape": name, "tokens": T, "experts_hit": hit, "bf16_ms": t_bf16, "fp8_block_ms": t_fp8,
                   "bf16_gb_s": hit * 3 * D * inter * 2 / t_bf16 / 1e6, "fp8_block_gb_s": hit * 3 * D * inter / t_fp8 / 1e6,
                   "tflop_s_fp8": 2 * T * k * 3 * D * inter / t_fp8 / 1e9, "rel_err_vs_bf16": err,
                   "quant_inline": inline, "fp8_block_other_quant_ms": t_other}
            rows.append(row)
            log(f"moe {name:7s} T={T:4d} hit {hit:3d}: bf16 {t_bf16 * 1e3:8.1f}us {row['bf16_gb_s']:5.0f}GB/s | fp8b "
                f"{t_fp8 * 1e3:8.1f}us {row['fp8_block_gb_s']:5.0f}GB/s {row['tflop_s_fp8']:4.0f}TF | "
                f"{t_bf16 / t_fp8:.2f}x | rel err vs bf16 {err:.3f} | quantizer {'inline' if inline else 'separate'}; "
                f"{'separate' if inline else 'inline'} {t_other * 1e3:.1f}us")
        del gu, dn, q
        torch.cuda.empty_cache()
    return rows


def _prefill_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model(ids, torch.arange(ids.numel(), device=ids.device), None, None)).float()


def accuracy(dev, log=print, prompt_len: int = 64, new_tokens: int = 32) -> dict:
    from torchinferno.bench.moe_bench import build_model_shape
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.generate import generate
    from torchinferno.kernels.fp8_block import swap_linear_for_fp8_block
    from torchinferno.kernels.fp8_block_moe import swap_experts_for_fp8_block

    model = build_model_shape(dev, "v2-lite")
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size * 9 // 10, (prompt_len,), generator=g).tolist()
    sp = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    want = generate(model, [prompt], sp)[0].token_ids
    seq = torch.tensor(prompt + want, device=dev)
    base = _prefill_logits(model, seq)  # [L, V]
    out = {"prompt_len": prompt_len, "new_tokens": new_tokens}
    for label, swap in (("linears", lambda m: swap_linear_for_fp8_block(m)),
                        ("linears_experts", lambda m: swap_experts_for_fp8_block(m))):
        swap(model)
        torch.cuda.empty_cache()
        got = _prefill_logits(model, seq)
        diff = (got - base).abs()
        gen = generate(model, [prompt], sp)[0].token_ids
        first = next((i for i, (a, b) in enumerate(zip(gen, want)) if a != b), len(want))
        gen_pos = slice(prompt_len - 1, prompt_len - 1 + new_tokens)  # positions predicting the generated tokens
        r = {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
             "rel_max_diff": float(diff.max() / base.abs().max()), "logit_max": float(base.abs().max()),
             "teacher_forced_argmax_agreement": float((got.argmax(-1) == base.argmax(-1))[gen_pos].float().mean()),
             "first_greedy_divergence": first, "greedy_equal_tokens": sum(a == b for a, b in zip(gen, want))}
        out[label] = r
        log(f"accuracy fp8-block {label}: logits max |diff| {r['max_abs_diff']:.4f} (rel {r['rel_max_diff']:.4f}), "
            f"mean {r['mean_abs_diff']:.5f}; teacher-forced argmax agreement {r['teacher_forced_argmax_agreement']:.3f} "
            f"over {new_tokens} tokens; free greedy first differs at {first}/{new_tokens}")
    return out


def main(path: str, sections: tuple[str, ...]) -> dict:
    dev = torch.device("cuda")
    bw, mm = copy_bandwidth(dev, nbytes=2 * 1024**3, iters=5), matmul_rate(dev, torch.bfloat16, n=8192, iters=5)
    rep = {"device": torch.cuda.get_device_name(dev), "copy_gb_s": bw / 1e9, "bf16_tflop_s": mm / 1e12}
    print(f"ceilings: copy {bw / 1e9:.0f} GB/s, bf16 matmul {mm / 1e12:.0f} TFLOP/s ({rep['device']})")
    for name, fn in (("micro", micro), ("sweep", sweep), ("moe", moe), ("accuracy", accuracy)):
        if name in sections:
            rep[name] = fn(dev)
            with open(path, "w") as f:  # partial results survive a timeout
                json.dump(rep, f, indent=1, default=str)
    return rep


if __name__ == "__main__":
    main(sys.argv[1], tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else ("micro", "sweep", "moe", "accuracy"))
