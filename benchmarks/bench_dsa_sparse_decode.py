"""V3.2 DSA decode attention step on CUDA: sparse (top-k latent rows through the Triton kernel) vs dense (every cached
row gathered, the keep-mask applied), run by benchmarks/device_dsa_sparse.sh. CUDA only, no assertions on time.

One ``DeepSeekMLA`` at V3.2's attention shape (latent 512 + 64 rope, nope 128 / v 128, 64 index heads x 128,
top-k 2048; 16 or 128 query heads), bf16, block size 64, shuffled block tables, every row at the same context length
``L``. Timed: ``DeepSeekMLA._decode_absorbed`` (indexer scores over the cached index keys, stable top-k, then the
attention) with ``sparse_decode`` on and off, eager (CUDA events, median); the sparse step also replayed from a CUDA
graph (capture checks it is capturable). Also per row: the indexer + top-k alone (shared by both), the sparse
attention alone, and the max relative error sparse vs dense. A small tile sweep of the sparse kernel at one shape.

    python benchmarks/bench_dsa_sparse_decode.py OUT.json [--quick]
"""

from __future__ import annotations

import json
import sys

import torch

from torchinferno.kernels import mla_decode
from torchinferno.models.common.attention_metadata import build_attention_metadata
from torchinferno.models.common.mla import selected_slots
from torchinferno.models.deepseek_v32 import fused_ops
from torchinferno.models.deepseek_v32.config import tiny_deepseek_v32_config
from torchinferno.models.deepseek_v32.model import DeepSeekMLA, IndexerProj

DEV, BS, TOPK = "cuda", 64, 2048


def timed(fn, reps: int = 10, warmup: int = 3) -> float:
    """Median ms per call with CUDA events (``bench.gpu_timing.cuda_time_ms``)."""
    from torchinferno.bench.gpu_timing import cuda_time_ms

    return cuda_time_ms(fn, iters=reps, warmup=warmup)


def build(H: int) -> DeepSeekMLA:
    cfg = tiny_deepseek_v32_config(hidden_size=1024, num_attention_heads=H, q_lora_rank=1536, kv_lora_rank=512,
                                   qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, index_n_heads=64,
                                   index_head_dim=128, index_topk=TOPK, max_position_embeddings=65536)
    torch.manual_seed(0)
    attn = DeepSeekMLA(cfg, fused_ops).to(DEV, torch.bfloat16).eval()
    torch.nn.init.normal_(attn.kv_b_proj.weight, std=512**-0.5)
    return attn


def inputs(attn: DeepSeekMLA, B: int, L: int, seed: int = 0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    H, per = attn.num_heads, -(-L // BS)
    nblocks = B * per + 1
    bf = dict(device=DEV, dtype=torch.bfloat16)
    latent = torch.randn(nblocks, BS, 576, generator=g, **bf)
    index_k = torch.randn(nblocks, BS, 128, generator=g, **bf)
    tables = torch.randperm(nblocks - 1, generator=g, device=DEV)[: B * per].view(B, per) + 1
    meta = build_attention_metadata([1] * B, [L - 1] * B, tables.cpu(), BS, device=DEV)
    q_nope = torch.randn(B, H, 128, generator=g, **bf)
    q_pe = torch.randn(B, H, 64, generator=g, **bf)
    idx = IndexerProj(torch.randn(B, 64, 128, generator=g, **bf), torch.randn(B, 128, generator=g, **bf),
                      torch.randn(B, 64, generator=g, device=DEV) * 64**-0.5 * 128**-0.5)
    return q_nope, q_pe, idx, (latent, index_k), meta


def graph_ms(fn) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return timed(g.replay)


def row(attn, B: int, L: int) -> dict:
    q_nope, q_pe, idx, kv, meta = inputs(attn, B, L)
    step = lambda: attn._decode_absorbed(q_nope, q_pe, idx, kv, meta)  # noqa: E731
    out = {"B": B, "H": attn.num_heads, "L": L}
    with torch.no_grad():
        attn.sparse_decode = False
        try:  # the dense path materializes the whole context's logits: past ~36 GiB an H100 has no room
            dense = step()
            out["dense_ms"] = timed(step)
        except torch.OutOfMemoryError as e:
            dense = None
            out["dense_error"] = f"OutOfMemoryError: {str(e).splitlines()[0]}"[:200]
            torch.cuda.empty_cache()
        attn.sparse_decode = True
        sparse = step()
        out["sparse_ms"] = timed(step)
        if dense is not None:
            out["rel_err"] = float((sparse.float() - dense.float()).norm() / dense.float().norm())
        lens = meta.seq_lens

        def select():
            return attn.indexer.select_positions(idx.q[:, None], kv[1], meta.block_tables, L, idx.w[:, None],
                                                 lens[:, None])[:, 0]

        out["indexer_topk_ms"] = timed(select)
        slots = selected_slots(select(), lens, meta.block_tables, BS)
        out["sparse_attn_ms"] = timed(lambda: mla_decode.sparse_absorbed_decode(
            q_nope, q_pe, kv[0], attn.kv_b_proj.weight, attn.scale, slots))
        try:
            out["sparse_graph_ms"] = graph_ms(step)
        except Exception as e:  # report, keep going
            out["sparse_graph_error"] = f"{type(e).__name__}: {e}"[:300]
    return out


def sweep(attn, B: int, L: int) -> list[dict]:
    q_nope, q_pe, idx, kv, meta = inputs(attn, B, L)
    pos = torch.stack([torch.randperm(L, device=DEV)[:TOPK] for _ in range(B)])
    slots = selected_slots(pos, meta.seq_lens, meta.block_tables, BS)
    rows = []
    tiles = [(16, 16, 4), (16, 32, 4), (16, 16, 8), (16, 32, 8), (32, 16, 8), (32, 32, 8), (64, 16, 8)]
    configs = [{"BLOCK_H": bh, "BLOCK_N": bn, "num_warps": nw, "SPLITS": "auto"} for bh, bn, nw in tiles]
    configs += [{**mla_decode.SPARSE_CONFIG, "SPLITS": sp} for sp in (1, 2, 8)]
    for cfg in configs:
        try:
            ms = timed(lambda: mla_decode.sparse_absorbed_decode(  # noqa: B023
                q_nope, q_pe, kv[0], attn.kv_b_proj.weight, attn.scale, slots, config=cfg))
            rows.append({**cfg, "ms": ms})
        except Exception as e:
            rows.append({**cfg, "error": f"{type(e).__name__}: {e}"[:200]})
    return rows


def main() -> None:
    quick = "--quick" in sys.argv
    rep = {"device": torch.cuda.get_device_name(), "rows": [], "sweep": {}}
    for H in (16, 128):
        attn = build(H)
        for B in ((1,) if quick else (1, 8)):
            for L in (4096, 16384, 32768):
                r = row(attn, B, L)
                rep["rows"].append(r)
                print(json.dumps(r), flush=True)
        if H == 128:
            rep["sweep"] = {"B": 8, "H": 128, "L": 16384, "rows": sweep(attn, 8, 16384)}
            for s in rep["sweep"]["rows"]:
                print("sweep", json.dumps(s), flush=True)
        del attn
        torch.cuda.empty_cache()
    json.dump(rep, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
