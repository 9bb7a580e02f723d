"""perf-smoke: paged decode attention, torch reference vs the specialized (Triton) kernel.

Every row is also a numerical check against fp64 attention over the stored cache values: its max
abs error must stay within ``RTOL_EPS`` ulps of its compute dtype, relative to the largest output
(``check_tolerance``); ``result["ok"]`` is False (and the command exits 1) when any row fails or a
non-sweep row does not run. Where no specialized kernel applies (CPU), ``specialized (api)`` *is* the
torch reference path: no speedup is reported (``speedup_vs_reference`` is None).
"""

from __future__ import annotations

import torch

RTOL_EPS = 8  # tolerance in units of the compute dtype's machine epsilon (bf16: 6%, fp16: 0.8% of max |out|)
MIN_RTOL = 1e-4  # fp32 rows: fp32 accumulation over long contexts, not output rounding, dominates

from torchinferno.bench.gpu_timing import cuda_time_ms, graph_time_ms, wall_time_ms


def check_tolerance(max_abs_exact: float, dtype: torch.dtype) -> float:
    """The max abs error a correct row may have: ``max(RTOL_EPS * eps(dtype), MIN_RTOL) * max |exact output|``."""
    return max(RTOL_EPS * torch.finfo(dtype).eps, MIN_RTOL) * max(max_abs_exact, 1e-6)


def _paged_cache(batch, seq_len, kv_heads, head_dim, value_dim, block_size, dtype, device, gen=None):
    nb = -(-seq_len // block_size)
    total = batch * nb + 1
    perm = torch.randperm(total - 1, generator=gen) + 1  # block 0 stays free (scratch)
    bt = perm[: batch * nb].view(batch, nb).to(torch.int32).to(device)
    kc = torch.randn(total, block_size, kv_heads, head_dim, device=device, dtype=dtype)
    vc = torch.randn(total, block_size, kv_heads, value_dim, device=device, dtype=dtype)
    return kc, vc, bt


# ------------------------------------------------------------------------------------- perf-smoke
def perf_smoke(device="cuda", batch=1, heads=32, kv_heads=8, seq_len=4096, head_dim=128, value_dim=None,
               block_size=16, dtype="bfloat16", iters=50, sweep=False, kv_cache_dtype="auto", log=print) -> dict:
    """Paged decode attention: torch reference vs the specialized kernel (time, max error, GB/s).

    ``kv_cache_dtype`` (a ``--kv-cache-dtype`` spelling) stores the caches in another dtype (``fp8``:
    half the bytes); errors are measured against fp64 attention over the stored values.
    """
    from torchinferno.checkpoint.auto import resolve_dtype
    from torchinferno.kernels import api
    from torchinferno.kernels.kv_dtype import is_fp8, kv_store_values, parse_kv_cache_dtype
    from torchinferno.models.common.attention import gather_kv

    dt = resolve_dtype(dtype)
    dv = value_dim or head_dim
    dev = torch.device(device)
    torch.manual_seed(0)
    kc, vc, bt = _paged_cache(batch, seq_len, kv_heads, head_dim, dv, block_size, dt, dev)
    kv_dt = parse_kv_cache_dtype(kv_cache_dtype) or dt
    kc, vc = kv_store_values(kc, kv_dt), kv_store_values(vc, kv_dt)
    q = torch.randn(batch, heads, head_dim, device=dev, dtype=dt)
    lens = torch.full((batch,), seq_len, dtype=torch.int32, device=dev)
    scale = head_dim ** -0.5
    lens_list = [seq_len] * batch
    exact = api.paged_attention_reference(q.double(), kc.double(), vc.double(), [1] * batch, lens_list, bt, scale)
    max_exact = float(exact.abs().max())
    from torchinferno.kernels import triton as _tri

    specialized = _tri.usable(q)  # else kernels.api runs the torch reference for "specialized (api)"

    def sdpa_gather():  # what TorchAttention's decode path does
        k = gather_kv(kc, bt, seq_len).transpose(1, 2).to(dt)
        v = gather_kv(vc, bt, seq_len).transpose(1, 2).to(dt)
        return torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), k, v, scale=scale,
                                                                enable_gqa=heads != kv_heads).squeeze(2)

    candidates = {
        "reference (torch fp32)": lambda: api.paged_attention_reference(q, kc, vc, [1] * batch, lens_list, bt, scale),
        "torch SDPA over gathered blocks": sdpa_gather,
        "specialized (api)": lambda: api.batched_paged_decode_attention(q, kc, vc, bt, lens, scale, seq_lens_list=lens_list),
    }
    if dev.type == "cuda":
        from torchinferno.kernels.triton import decode_attention as da

        counters = torch.zeros(batch * kv_heads, dtype=torch.int32, device=dev)
        candidates["triton, splits merged in-kernel"] = lambda: da.batched_paged_decode_attention(
            q, kc, vc, bt, lens, scale, merge_counters=counters)
    row_dtype = {}  # rows that compute in another precision than dt
    if dev.type == "cuda" and kv_dt != dt and is_fp8(kv_dt):
        candidates["triton, FP8 tiles upcast to bf16 (not fp16)"] = lambda: da.batched_paged_decode_attention(
            q, kc, vc, bt, lens, scale, config={"fp8_dot": "bf16"})
        row_dtype["triton, FP8 tiles upcast to bf16 (not fp16)"] = torch.bfloat16
    required = set(candidates)  # the sweep below adds optional tilings
    if sweep and dev.type == "cuda":
        base = da.choose_num_splits(batch, kv_heads, bt.shape[1] * block_size, dev)
        for bn in (32, 64, 128) if not is_fp8(kv_dt) else (64, 128, 256):  # FP8 rows are half as wide
            for w in (4, 8):
                for st in (2, 3) if not is_fp8(kv_dt) else (2, 3, 4):
                    for sp in sorted({max(1, base // 2), base, min(64, base * 2)}):
                        cfg = {"block_n": bn, "num_warps": w, "num_stages": st}
                        candidates[f"triton bn={bn} w={w} st={st} splits={sp}"] = (
                            lambda cfg=cfg, sp=sp: da.batched_paged_decode_attention(q, kc, vc, bt, lens, scale, sp, config=cfg))
    kv_bytes = batch * seq_len * kv_heads * (head_dim + dv) * kc.element_size()
    rows = []
    for name, fn in candidates.items():
        try:
            out = fn()
            err = float((out.double() - exact).abs().max())
            if dev.type == "cuda":
                ms, launch_ms = graph_time_ms(fn), cuda_time_ms(fn, iters=iters)
            else:
                ms = launch_ms = wall_time_ms(fn, iters=max(1, iters // 10))
        except Exception as e:  # a sweep point that does not compile (shared memory) is reported, not fatal
            rows.append({"name": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"})
            continue
        tol = check_tolerance(max_exact, max(row_dtype.get(name, dt), dt, key=lambda d: torch.finfo(d).eps))
        rows.append({"name": name, "ms": ms, "ms_with_launch": launch_ms, "max_abs_err": err, "kv_gb_s": kv_bytes / ms / 1e6,
                     "tolerance": tol, "check": "ok" if err <= tol else "FAILED"})  # NaN fails
    failed = [r for r in rows if r.get("check") == "FAILED" or ("error" in r and r["name"] in required)]
    timed = {r["name"]: r for r in rows if "ms" in r}
    spec, ref = timed.get("specialized (api)"), timed.get("reference (torch fp32)")
    speedup = ref["ms"] / spec["ms"] if specialized and spec and ref else None
    result = {"device": str(dev), "batch": batch, "heads": heads, "kv_heads": kv_heads, "seq_len": seq_len,
              "head_dim": head_dim, "value_dim": dv, "block_size": block_size, "dtype": dtype, "kv_cache_dtype": str(kv_dt).replace("torch.", ""), "kv_bytes": kv_bytes,
              "ok": not failed, "failed": [r["name"] for r in failed], "specialized_kernel": specialized,
              "rows": rows, "speedup_vs_reference": speedup}
    log(f"perf-smoke B={batch} H={heads} Hkv={kv_heads} L={seq_len} D={head_dim} Dv={dv} page={block_size} {dtype} (cache {result['kv_cache_dtype']}) on {dev}")
    log("  (time: device time per call from CUDA-graph replays; 'with launch': eager call incl. Python launch cost)"
        if dev.type == "cuda" else "  (time: wall time per eager call)")
    for r in sorted(rows, key=lambda r: r.get("ms", 1e9)):
        if "ms" in r:
            log(f"  {r['name']:<44} {r['ms'] * 1e3:9.1f} us (with launch {r['ms_with_launch'] * 1e3:8.1f} us)  "
                f"max err {r['max_abs_err']:.2e}  KV {r['kv_gb_s']:7.0f} GB/s" + ("" if r["check"] == "ok" else
                f"  FAILED (tolerance {r['tolerance']:.1e})"))
        else:
            log(f"  {r['name']:<44} failed: {r['error']}")
    if speedup is not None:
        log(f"  specialized is {speedup:.1f}x the reference")
    else:
        log(f"  no speedup: on {dev.type} 'specialized (api)' is the torch reference path itself (no specialized kernel here)")
    if failed:
        log(f"  numerical check FAILED: {', '.join(r['name'] for r in failed)} (errors vs fp64 attention above)")
    return result


# ------------------------------------------------------------------------------------- model
