"""``bench-moe``'s layer section: one MoE block (router + routed + shared experts) fused vs the grouped torch
reference at decode token counts and a prefill, beside the same-run bound (``bench.moe_bench``'s module doc)."""

from __future__ import annotations

import torch

from torchinferno.bench.gpu_timing import cuda_time_ms, graph_time_ms
from torchinferno.bench.moe_models import _randomize


LAYER_SHAPES = {  # name -> (E, top_k, D, I, shared, n_group, topk_group)
    "v2-lite": (64, 6, 2048, 1408, 2, 1, 1),
    "v3": (256, 8, 7168, 2048, 1, 8, 4),  # one DeepSeek-V3 MoE layer (22.5 GB in bf16)
}


def _moe_cfg(E: int, top_k: int, D: int, inter: int, shared: int, n_group: int = 1, topk_group: int = 1):
    from torchinferno.models.deepseek_v32.config import DeepSeekV32Config

    return DeepSeekV32Config(hidden_size=D, moe_intermediate_size=inter, n_routed_experts=E, num_experts_per_tok=top_k,
                             n_shared_experts=shared, n_group=n_group, topk_group=topk_group, norm_topk_prob=True,
                             routed_scaling_factor=1.0, index_n_heads=0)


def _hit_experts(moe, x) -> int:
    with torch.no_grad():
        _, ids = moe.gate(x)
    return int(torch.unique(ids).numel())


def layer_rows(dev, E=64, top_k=6, D=2048, inter=1408, shared=2, batches=(1, 8, 64, 256), prefill=2048,
               bw: float | None = None, mm: float | None = None, log=print, n_group: int = 1,
               topk_group: int = 1) -> list[dict]:
    """One MoE block: fused (graph-replayed) vs the grouped reference, per token count."""
    from torchinferno.kernels import fused_moe
    from torchinferno.models.common.layers import SparseMoE
    from torchinferno.models.common.moe import set_moe_backend
    from torchinferno.models.deepseek_v32 import fused_ops

    with torch.device("meta"):
        moe = SparseMoE(_moe_cfg(E, top_k, D, inter, shared, n_group, topk_group), fused_ops)
    moe.to(dtype=torch.bfloat16).to_empty(device=dev)
    _randomize(moe)
    moe.eval()
    expert_bytes = 3 * D * inter * 2
    rows = []
    for M in (*batches, prefill):
        x = torch.randn(M, D, device=dev, dtype=torch.bfloat16)
        hit = _hit_experts(moe, x)
        nbytes = E * D * 4 + hit * expert_bytes + shared * expert_bytes + 2 * M * D * 2
        flops = 2 * M * (top_k + shared) * 3 * D * inter
        with torch.no_grad():
            set_moe_backend(moe, "auto")
            want = moe(x)
            try:
                fused_ms, graphed = graph_time_ms(lambda x=x: moe(x), calls=10, fallback=False), True
            except Exception as e:  # noqa: BLE001 - a capture failure is a finding, reported
                log(f"  layer M={M}: CUDA graph capture failed ({type(e).__name__}: {e}); timing eagerly")
                fused_ms, graphed = cuda_time_ms(lambda x=x: moe(x)), False

            def timed(x=x):
                if graphed:
                    return graph_time_ms(lambda: moe(x), calls=10, fallback=False)
                return cuda_time_ms(lambda: moe(x))

            ab = {}
            try:  # A/Bs of the path policy (kernels.fused_moe.policy): shared experts in / apart, per-token kernels
                for label, fuse in (("shared_in_ms", True), ("separate_shared_ms", False)):
                    moe.fuse_shared = fuse
                    ab[label] = timed()
                moe.fuse_shared = None
                if M <= 8:
                    with fused_moe.override_policy(small_m_max_tokens=0 if M <= fused_moe.policy().small_m_max_tokens
                                                   else M):
                        ab["other_small_m_path_ms"] = timed()
            finally:
                moe.fuse_shared = None
            sep_ms = ab["separate_shared_ms"]
            set_moe_backend(moe, "torch")
            ref = moe(x)
            ref_ms = cuda_time_ms(lambda x=x: moe(x), iters=10)
            set_moe_backend(moe, "auto")
        err = float((want.float() - ref.float()).abs().max() / ref.float().abs().max())
        small_now = M <= fused_moe.policy().small_m_max_tokens
        row = {"tokens": M, "experts_hit": hit, "fused_ms": fused_ms, "graphed": graphed, "torch_ms": ref_ms, **ab,
               "small_m_path": small_now, "rel_err_vs_torch": err, "bytes": nbytes, "flops": flops}
        if bw:
            row["bound_ms"] = nbytes / bw * 1e3
            row["pct_of_bw_bound"] = 100 * row["bound_ms"] / fused_ms
        if mm and M == prefill:
            row["pct_of_matmul_rate"] = 100 * flops / mm / (fused_ms * 1e-3)
        other = (f" {'grouped' if small_now else 'per-token'} {ab['other_small_m_path_ms']:.3f}"
                 if "other_small_m_path_ms" in ab else "")
        log(f"  layer M={M:5d}: fused {fused_ms:8.3f} ms{' (graph)' if graphed else ''} (shared in "
            f"{ab['shared_in_ms']:.3f} apart {sep_ms:.3f}{other})  torch {ref_ms:8.3f} ms  "
            f"x{ref_ms / fused_ms:5.1f}  hit {hit}/{E}  " + (f"bound {row['bound_ms']:.3f} ms "
                                                          f"({row['pct_of_bw_bound']:.0f}%)  " if bw else "")
            + (f"matmul {row['pct_of_matmul_rate']:.0f}%  " if "pct_of_matmul_rate" in row else "")
            + f"rel err {err:.1e}")
        rows.append(row)
    return rows
