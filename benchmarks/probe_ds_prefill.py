"""Probe (issue 24, session 16): where the V2-Lite-like model's eager 2048-token prefill spends its HOST time (run 43:
59.9 ms wall for 19.7 ms of kernels), and what split count the MLA absorbed decode wants at batch 1 (run 43: 0.50 ms
of a 2.05 ms batch-1 step in ``_decode_stage1``, one program per layer at context 128).

``python benchmarks/probe_ds_prefill.py OUT.json [sections]`` on one CUDA device; sections: prefill, mla, decode
(default all), run in the order given. Prints one line per finding; the JSON keeps the tables.

* prefill: wall vs device time of ``model(ids, pos, caches, meta)`` at 2048 tokens; host milliseconds per module
  (forward pre/post hooks, no sync: the Python + launch time spent inside each module, or a hidden host sync's
  wait); torch.profiler CPU ops by count and self time; CUDA runtime calls (launches, syncs, copies).
* mla: ``batched_paged_decode_attention`` at the MLA shape (16 heads, 576 / 512, one latent head) for batch 1 / 8 and
  context 128 / 1024 / 4096 over split counts and tiles (device time, 20 calls per CUDA graph).
* decode: the model's batch-1 / 8 decode step replayed from CUDA graphs with the MLA launch plan
  (``kernels.mla_decode.mla_num_splits``, 32-row tiles; from session 17's sweep) and with the GQA kernel's own
  choice (one split per 256 rows, 16-row tiles: the plan before), same caches and tokens.
"""

from __future__ import annotations

import collections
import json
import sys
import time

import torch

from torchinferno.bench.gpu_timing import cuda_time_ms, device_time_ms, graph_time_ms
from torchinferno.bench.moe_bench import build_v2_lite
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

    H, D, DV, bs = 16, 576, 512, 16
    rows = []
    for B in (1, 8):
        for ctx in (128, 1024, 4096):
            per = -(-(ctx + 1) // bs)
            kc = torch.randn(B * per + 1, bs, 1, D, device=DEV, dtype=torch.bfloat16)
            vc = kc[..., :DV]
            bt = torch.arange(1, 1 + B * per, device=DEV, dtype=torch.int32).view(B, per)
            lens = torch.full((B,), ctx, device=DEV, dtype=torch.int32)
            q = torch.randn(B, H, D, device=DEV, dtype=torch.bfloat16)
            cnt = merge_counters(DEV, B)
            default = mla_num_splits(B, per * bs, DEV)  # paged_absorbed_decode's plan
            ref = batched_paged_decode_attention(q, kc, vc, bt, lens, 0.07, num_splits=1).float()
            for splits in (1, 2, 4, 8, 16, 32, 64):
                if splits > 1 and ctx // splits < 16:
                    continue
                for cfg in ({"block_n": 16, "num_warps": 4}, {"block_n": 32, "num_warps": 4}):
                    def fn(splits=splits, cfg=cfg):
                        return batched_paged_decode_attention(q, kc, vc, bt, lens, 0.07, num_splits=splits,
                                                              config=cfg, merge_counters=cnt)
                    try:
                        err = (fn().float() - ref).abs().max().item()
                        ms = graph_time_ms(fn, calls=20, iters=10)
                    except Exception as e:  # noqa: BLE001 - a sweep point that does not compile / fit
                        rows.append({"B": B, "ctx": ctx, "splits": splits, **cfg, "error": f"{type(e).__name__}: {e}"[:200]})
                        continue
                    rows.append({"B": B, "ctx": ctx, "splits": splits, **cfg, "us": ms * 1e3, "max_err": err,
                                 "default_splits": default})
            best = min((r for r in rows if r["B"] == B and r["ctx"] == ctx and "us" in r), key=lambda r: r["us"])
            dflt = [r for r in rows if r["B"] == B and r["ctx"] == ctx and r.get("splits") == default
                    and r.get("block_n") == MLA_BLOCK_N and r.get("num_warps") == 4]
            log(f"mla B={B} ctx={ctx}: plan ({default} splits, {MLA_BLOCK_N}/4w) {dflt[0]['us'] if dflt else float('nan'):.1f} us;"
                f" best {best['us']:.1f} us at {best['splits']} splits block_n {best['block_n']} {best['num_warps']}w"
                f" (err {best['max_err']:.1e})")
    return {"rows": rows}


def decode_section(model) -> dict:
    from torchinferno.kernels import mla_decode as md
    from torchinferno.kernels.cuda_graphs import CudaGraphDecodeRunner
    from torchinferno.kernels.triton import decode_attention as da

    cfg, bs, ctx = model.config, 16, 128
    spec = model.family.kv_spec(cfg)
    batches = (1, 8)
    blocks_per = -(-(ctx + 8) // bs)
    out = {}
    orig_plan, orig_bn = md.mla_num_splits, md.MLA_BLOCK_N
    for label in ("mla_plan", "gqa_default"):  # the MLA launch plan vs the GQA kernel's own choice (16-row tiles)
        torch.manual_seed(0)  # the same caches and tokens for both: their argmaxes compare
        if label == "gqa_default":
            md.mla_num_splits = lambda b, rows, d: da.choose_num_splits(b, 1, rows, d)
            md.MLA_BLOCK_N = 16
        caches = spec.allocate(max(batches) * blocks_per + 1, bs, torch.bfloat16, DEV)
        for layer in caches:
            for t in layer:
                t.normal_()
        runner = CudaGraphDecodeRunner(model, caches, bs, blocks_per, batch_sizes=batches)
        runner.capture()
        for B in batches:
            table = [list(range(1 + b * blocks_per, 1 + (b + 1) * blocks_per)) for b in range(B)]
            meta = build_attention_metadata([1] * B, [ctx] * B, table, bs, device=DEV)
            ids = torch.randint(0, cfg.vocab_size, (B,), device=DEV)
            pos = torch.full((B,), ctx, device=DEV)

            def replay(ids=ids, pos=pos, meta=meta):
                with torch.no_grad():
                    return runner.run(ids, pos, meta.slot_mapping, meta.block_tables, meta.seq_lens, meta.seq_lens_list)

            logits = replay().float()
            out[f"{label}_B{B}"] = {"ms": cuda_time_ms(replay, iters=30, warmup=3),
                                    "device_ms": device_time_ms(replay, iters=20, warmup=2),
                                    "argmax": logits.argmax(-1).tolist()}
            log(f"decode {label} B={B}: {out[f'{label}_B{B}']['ms']:.3f} ms (device "
                f"{out[f'{label}_B{B}']['device_ms']:.3f}) argmax {out[f'{label}_B{B}']['argmax'][:4]}")
        del runner, caches
        md.mla_num_splits, md.MLA_BLOCK_N = orig_plan, orig_bn
        torch.cuda.empty_cache()
    return out


def main() -> None:
    path = sys.argv[1]
    sections = sys.argv[2].split(",") if len(sys.argv) > 2 else ["prefill", "mla", "decode"]
    rep: dict = {"device": torch.cuda.get_device_name(DEV), "torch": torch.__version__}
    model = None
    for sec in sections:  # in the order given (a capped run keeps the first ones' results)
        if sec == "mla":
            rep["mla"] = mla_section()
        elif sec in ("prefill", "decode"):
            if model is None:
                model = build_v2_lite(DEV)
            rep[sec] = prefill_section(model) if sec == "prefill" else decode_section(model)
        json.dump(rep, open(path, "w"), indent=1, default=str)


if __name__ == "__main__":
    main()
