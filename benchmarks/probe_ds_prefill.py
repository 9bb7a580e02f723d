"""Probe (issue 24, session 16): where the V2-Lite-like model's eager 2048-token prefill spends its HOST time (run 43:
59.9 ms wall for 19.7 ms of kernels), and what split count the MLA absorbed decode wants at batch 1 (run 43: 0.50 ms
of a 2.05 ms batch-1 step in ``_decode_stage1``, one program per layer at context 128).

``python benchmarks/probe_ds_prefill.py OUT.json [sections [decode variants]]`` on one CUDA device; sections: prefill,
mla, decode (default all), run in the order given; decode variants: labels of :data:`DECODE_VARIANTS` (default all). Prints one line per finding; the JSON keeps the tables.

* prefill: wall vs device time of ``model(ids, pos, caches, meta)`` at 2048 tokens; host milliseconds per module
  (forward pre/post hooks, no sync: the Python + launch time spent inside each module, or a hidden host sync's
  wait); torch.profiler CPU ops by count and self time; CUDA runtime calls (launches, syncs, copies).
* mla: the absorbed decode attention at the MLA shape (16 heads, 576 / 512) for batch 1 / 8 / 64 and context
  128 / 1024 / 4096: the MLA kernel (``kernels.triton.mla_decode_attention``) over split counts and tiles beside
  the GQA kernel with one 576-wide key head at the session-18 plan (device time, 20 calls per CUDA graph).
* decode: the model's batch-1 decode step replayed from a CUDA graph at context 128 / 1024: module path vs the
  decode-GEMV step (and the step with q / kv_a in two launches, without PDL, with the absorption bmms, with the MoE's
  norm and add as their own launches), MLA split floors, the GQA kernel (``kernels.mla_decode.DECODE_KERNEL``) and
  other router tiles (``moe_routing.ROUTER_TILES``); same caches, tokens; each beside the bound (active bytes at the
  step's routing + KV over the copy bandwidth measured in the same run).
"""

from __future__ import annotations

import collections
import json
import sys
import time

import torch

from torchinferno.bench.gpu_timing import cuda_time_ms, device_time_ms, graph_time_ms
from torchinferno.bench.ceilings import copy_bandwidth
from torchinferno.bench.moe_bench import _routing_hits, build_v2_lite
from torchinferno.bench.moe_models import active_bytes
from torchinferno.models.common.attention_metadata import build_attention_metadata, positions_for

DEV = torch.device("cuda")


def log(msg: str) -> None:
    print(msg, flush=True)


def prefill_section(model, T: int = 2048) -> dict:
    cfg, bs = model.config, 16
    spec = model.family.kv_spec(cfg)
    ids = torch.randint(0, cfg.vocab_size, (T,), device=DEV)
    pos = positions_for([T], [0]).to(DEV)
    caches = spec.allocate(-(-T // bs) + 1, bs, torch.bfloat16, DEV)
    meta = build_attention_metadata([T], [0], [list(range(1, 1 + -(-T // bs)))], bs, device=DEV)

    def run():
        with torch.no_grad():
            return model(ids, pos, caches, meta)

    out = {"tokens": T, "wall_ms": cuda_time_ms(run, iters=5, warmup=2),
           "device_ms": device_time_ms(run, iters=5, warmup=1, hold_us=200000.0)}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    run()
    out["host_issue_ms"] = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    log(f"prefill {T}: wall {out['wall_ms']:.1f} ms, device {out['device_ms']:.1f} ms, host issue "
        f"{out['host_issue_ms']:.1f} ms")

    # host ms per module (layer 1's children and grandchildren, summed over every layer by their relative name)
    host = collections.defaultdict(float)
    calls = collections.Counter()
    stack: list[tuple[str, float]] = []
    hooks = []
    for name, m in model.named_modules():
        parts = name.split(".")
        if len(parts) >= 4 and parts[0] == "model" and parts[1] == "layers" and len(parts) <= 5:
            rel = ".".join(parts[3:])
        elif name in ("model.embed_tokens", "model.norm", "lm_head"):
            rel = name
        else:
            continue

        def pre(_m, _a, rel=rel):
            stack.append((rel, time.perf_counter()))

        def post(_m, _a, _o, rel=rel):
            r, t = stack.pop()
            host[r] += (time.perf_counter() - t) * 1e3
            calls[r] += 1

        hooks += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    run()
    torch.cuda.synchronize()
    host.clear()
    calls.clear()
    run()
    torch.cuda.synchronize()
    for h in hooks:
        h.remove()
    out["host_ms_by_module"] = dict(sorted(host.items(), key=lambda kv: -kv[1]))
    log("  host ms by module (all layers): " + "; ".join(f"{k} {v:.1f}" for k, v in list(out["host_ms_by_module"].items())[:14]))

    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    ka = prof.key_averages()
    rows = [{"name": e.key, "count": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
             "device_ms": getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) / 1e3}
            for e in ka]
    by_count = sorted((r for r in rows if not r["name"].startswith("cuda") and not r["name"].startswith("cu")),
                      key=lambda r: -r["count"])[:40]
    by_self = sorted(rows, key=lambda r: -r["self_cpu_ms"])[:40]
    runtime = sorted((r for r in rows if r["name"].startswith(("cuda", "cu"))), key=lambda r: -r["count"])
    out["ops_by_count"], out["ops_by_self_cpu"], out["runtime_calls"] = by_count, by_self, runtime
    log("  runtime calls: " + "; ".join(f"{r['name']} x{r['count']} {r['self_cpu_ms']:.1f} ms" for r in runtime[:10]))
    log("  ops by count: " + "; ".join(f"{r['name']} x{r['count']}" for r in by_count[:30]))
    log("  ops by self cpu: " + "; ".join(f"{r['name']} {r['self_cpu_ms']:.1f} ms x{r['count']}" for r in by_self[:20]))
    return out


def mla_section() -> dict:
    from torchinferno.kernels.mla_decode import MLA_BLOCK_N, merge_counters, mla_num_splits
    from torchinferno.kernels.triton.decode_attention import batched_paged_decode_attention
    from torchinferno.kernels.triton import num_sms
    from torchinferno.kernels.triton.mla_decode_attention import default_config, mla_paged_decode_attention

    H, D, DV, bs = 16, 576, 512, 16
    rows = []
    for B in (1, 8, 64):
        for ctx in (128, 1024, 4096):
            per = -(-(ctx + 1) // bs)
            cache = torch.randn(B * per + 1, bs, D, device=DEV, dtype=torch.bfloat16)
            kc = cache.unsqueeze(2)
            bt = torch.arange(1, 1 + B * per, device=DEV, dtype=torch.int32).view(B, per)
            lens = torch.full((B,), ctx, device=DEV, dtype=torch.int32)
            q = torch.randn(B, H, D, device=DEV, dtype=torch.bfloat16)
            cnt = merge_counters(DEV, B)
            plan = mla_num_splits(B, per * bs, DEV)  # paged_absorbed_decode's plan (16 heads: one head block)
            ref = batched_paged_decode_attention(q, kc, kc[..., :DV], bt, lens, 0.07, num_splits=1).float()
            variants = [("gqa", plan, {"block_n": MLA_BLOCK_N, "num_warps": 4})]  # the GQA kernel's MLA plan
            tiles = default_config(B * plan, num_sms(DEV.index or 0), False)  # the kernel's own tiles at the plan
            variants += [("mla", splits, {"block_n": bn, "num_warps": w})
                         for splits in sorted({1, max(1, plan // 2), plan, 2 * plan})
                         for bn in (16, 32, 64) for w in (4, 8) if splits == 1 or ctx // splits >= bn]
            for kernel, splits, cfg in variants:
                def fn(kernel=kernel, splits=splits, cfg=cfg):
                    if kernel == "gqa":
                        return batched_paged_decode_attention(q, kc, kc[..., :DV], bt, lens, 0.07, num_splits=splits,
                                                              config=cfg, merge_counters=cnt)
                    return mla_paged_decode_attention(q, cache, bt, lens, 0.07, D - DV, splits, merge_counters=cnt,
                                                      config=cfg)
                try:
                    err = (fn().float() - ref).abs().max().item()
                    ms = graph_time_ms(fn, calls=20, iters=10)
                except Exception as e:  # noqa: BLE001 - a sweep point that does not compile / fit
                    rows.append({"B": B, "ctx": ctx, "kernel": kernel, "splits": splits, **cfg,
                                 "error": f"{type(e).__name__}: {e}"[:200]})
                    continue
                rows.append({"B": B, "ctx": ctx, "kernel": kernel, "splits": splits, **cfg, "us": ms * 1e3,
                             "max_err": err, "plan_splits": plan})
            here = [r for r in rows if r["B"] == B and r["ctx"] == ctx and "us" in r]
            gqa = [r for r in here if r["kernel"] == "gqa"]
            dflt = [r for r in here if r["kernel"] == "mla" and r["splits"] == plan
                    and r["block_n"] == tiles["block_n"] and r["num_warps"] == tiles["num_warps"]]
            best = min((r for r in here if r["kernel"] == "mla"), key=lambda r: r["us"], default=None)
            log(f"mla B={B} ctx={ctx}: gqa plan {gqa[0]['us'] if gqa else float('nan'):.1f} us | mla kernel "
                f"{dflt[0]['us'] if dflt else float('nan'):.1f} us ({plan} splits, {tiles['block_n']}/"
                f"{tiles['num_warps']}w, err {dflt[0]['max_err'] if dflt else float('nan'):.1e})"
                + (f" | best {best['us']:.1f} us at {best['splits']} splits {best['block_n']}/{best['num_warps']}w"
                   if best else ""))
    return {"rows": rows}


ROUTER_4X512 = {"block_e": 4, "block_k": 512}  # the router tiles before session 22 (16 programs of four loads)
DECODE_VARIANTS = (  # label, options of the batch-1 decode-GEMV step (models/deepseek_v32/cuda_decode.py; None: the
    # module path), MLA kernel (kernels.mla_decode.DECODE_KERNEL), MLA split floor in rows, router tiles
    ("module", None, "mla", 128, None), ("step", {}, "mla", 128, None),
    ("step_q_kv_apart", {"fuse_q_kv": False}, "mla", 128, None), ("step_no_pdl", {"pdl": False}, "mla", 128, None),
    ("step_absorb_bmm", {"absorb_gemv": False}, "mla", 128, None),
    ("step_moe_ends_apart", {"fuse_moe_ends": False}, "mla", 128, None),
    ("step_split64", {}, "mla", 64, None), ("step_split32", {}, "mla", 32, None), ("step_gqa", {}, "gqa", 128, None),
    ("step_router_4x512", {}, "mla", 128, ROUTER_4X512))
# The per-token expert down kernel's tiles (kernels/triton/moe_small.py; the default BLOCK_N 4 x BLOCK_K 2048, 8 warps,
# read at 65% of its bytes' time in run 55): label -> policy small_m_tiles["down"], the rest as the step
DOWN_VARIANTS = {  # session 22: BLOCK_N 8 won on the H200 (run 57) and is now the default
    "step_down_4x2048": {"BLOCK_N": 4, "BLOCK_K": 2048, "num_warps": 8, "num_stages": 1},
    "step_down_8x2048": {"BLOCK_N": 8, "BLOCK_K": 2048, "num_warps": 8, "num_stages": 1},
    "step_down_16x2048": {"BLOCK_N": 16, "BLOCK_K": 2048, "num_warps": 8, "num_stages": 1},
    "step_down_8x1024": {"BLOCK_N": 8, "BLOCK_K": 1024, "num_warps": 8, "num_stages": 2},
    "step_down_2x2048": {"BLOCK_N": 2, "BLOCK_K": 2048, "num_warps": 4, "num_stages": 1},
    "step_down_4x512": {"BLOCK_N": 4, "BLOCK_K": 512, "num_warps": 4, "num_stages": 3},
    "step_down_8x512": {"BLOCK_N": 8, "BLOCK_K": 512, "num_warps": 4, "num_stages": 3},
}
DECODE_VARIANTS += tuple((label, {}, "mla", 128, None) for label in DOWN_VARIANTS)
# The step's GEMV tiles (models/deepseek_v32/cuda_decode.DEFAULT_CONFIGS: llama3's H200 sweep; run 58 read the dense
# weights at 71% of the H200's copy bandwidth) and a lower MLA split floor (one program a layer at context 128)
DECODE_VARIANTS += (
    ("step_pdl_chain", {"pdl_chain": True}, "mla", 128, None),  # the prologue, attention and MoE kernels under PDL
    ("step_no_chain", {"pdl_chain": False}, "mla", 128, None),  # only the GEMVs under PDL (the default until s25)
    ("step_split16", {}, "mla", 16, None),
    ("step_proj_8x1024", {"configs": {"proj": {"block_n": 8, "block_k": 1024, "num_stages": 2}}}, "mla", 128, None),
    ("step_proj_2x2048", {"configs": {"proj": {"block_n": 2, "block_k": 2048}}}, "mla", 128, None),
    ("step_head_8x1024", {"configs": {"head": {"block_n": 8, "block_k": 1024, "num_stages": 2}}}, "mla", 128, None),
    ("step_head_2x2048", {"configs": {"head": {"block_n": 2, "block_k": 2048}}}, "mla", 128, None),
)


def decode_section(model, contexts=(128, 1024), labels: list[str] | None = None) -> dict:
    """The batch-1 decode step replayed from a CUDA graph (as the engine runs it) per :data:`DECODE_VARIANTS`: the
    module path vs the decode-GEMV step, the MLA split floor (``kernels.mla_decode.MLA_MIN_SPLIT_ROWS``) and the GQA
    kernel baseline; same caches and tokens for all (argmaxes compare), wall and device time."""
    from torchinferno.kernels import fused_moe
    from torchinferno.kernels import mla_decode as md
    from torchinferno.kernels.cuda_graphs import CudaGraphDecodeRunner
    from torchinferno.kernels.triton import moe_routing
    from torchinferno.models.common.step_model import step_model

    cfg, bs = model.config, 16
    spec = model.family.kv_spec(cfg)
    out = {}
    router = dict(moe_routing.ROUTER_TILES)  # the default, restored after each variant and at the end
    bw = copy_bandwidth(DEV)  # the bound's bandwidth, measured in this run
    out["copy_gbps"] = bw / 1e9
    for ctx in contexts:
        blocks_per = -(-(ctx + 8) // bs)
        torch.manual_seed(0)
        caches = spec.allocate(blocks_per + 1, bs, torch.bfloat16, DEV)
        for layer in caches:
            for t in layer:
                t.normal_()
        meta = build_attention_metadata([1], [ctx], [list(range(1, 1 + blocks_per))], bs, device=DEV)
        ids = torch.randint(0, cfg.vocab_size, (1,), device=DEV)
        pos = torch.full((1,), ctx, device=DEV)
        nbytes = active_bytes(model, _routing_hits(model, ids, pos, caches, meta)) + ctx * spec.bytes_per_token(
            torch.bfloat16)
        bound_ms = out[f"bound_ms_ctx{ctx}"] = nbytes / bw * 1e3
        log(f"decode bound ctx={ctx}: {nbytes / 1e9:.3f} GB at {bw / 1e9:.0f} GB/s copy = {bound_ms:.3f} ms")
        for label, options, kernel, split_rows, router_tiles in DECODE_VARIANTS:
            if labels and label not in labels:
                continue
            md.DECODE_KERNEL, md.MLA_MIN_SPLIT_ROWS = kernel, split_rows
            moe_routing.ROUTER_TILES.clear()
            moe_routing.ROUTER_TILES.update(router_tiles or router)
            run_model = model if options is None else step_model(model, DEV, **options)
            runner = CudaGraphDecodeRunner(run_model, caches, bs, blocks_per, batch_sizes=(1,))
            tiles = dict(fused_moe.policy().small_m_tiles)
            tiles["down"] = DOWN_VARIANTS.get(label, tiles["down"])
            with fused_moe.override_policy(small_m_tiles=tiles):  # the graph keeps the tiles it was captured with
                runner.capture()

            def replay(runner=runner):
                with torch.no_grad():
                    return runner.run(ids, pos, meta.slot_mapping, meta.block_tables, meta.seq_lens, meta.seq_lens_list)

            logits = replay().float()
            row = out[f"{label}_ctx{ctx}"] = {"ms": cuda_time_ms(replay, iters=30, warmup=3),
                                              "device_ms": device_time_ms(replay, iters=30, warmup=3),
                                              "argmax": logits.argmax(-1).tolist()}
            log(f"decode {label} ctx={ctx}: {row['ms']:.3f} ms (device {row['device_ms']:.3f}; "
                f"{bound_ms / row['ms']:.1%} / {bound_ms / row['device_ms']:.1%} of the bound) argmax {row['argmax']}")
            del runner
        del caches
        torch.cuda.empty_cache()
    md.DECODE_KERNEL, md.MLA_MIN_SPLIT_ROWS = "mla", 128
    moe_routing.ROUTER_TILES.clear()
    moe_routing.ROUTER_TILES.update(router)
    return out


def main() -> None:
    path = sys.argv[1]
    sections = sys.argv[2].split(",") if len(sys.argv) > 2 else ["prefill", "mla", "decode"]
    labels = sys.argv[3].split(",") if len(sys.argv) > 3 else None  # decode variants to run (default: all)
    unknown = set(labels or ()) - {v[0] for v in DECODE_VARIANTS}
    if unknown:
        sys.exit(f"unknown decode variants {sorted(unknown)}; valid: {', '.join(v[0] for v in DECODE_VARIANTS)}")
    rep: dict = {"device": torch.cuda.get_device_name(DEV), "torch": torch.__version__}
    model = None
    for sec in sections:  # in the order given (a capped run keeps the first ones' results)
        if sec == "mla":
            rep["mla"] = mla_section()
        elif sec in ("prefill", "decode"):
            if model is None:
                model = build_v2_lite(DEV)
            rep[sec] = prefill_section(model) if sec == "prefill" else decode_section(model, labels=labels)
        json.dump(rep, open(path, "w"), indent=1, default=str)


if __name__ == "__main__":
    main()
