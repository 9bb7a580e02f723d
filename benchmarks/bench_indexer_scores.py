"""Lightning-indexer scores on CUDA: the Triton kernel (kernels.indexer_scores) vs the torch paths, time and peak
memory (run by benchmarks/device_indexer_kernel.sh; CUDA only, no assertions on time).

Shapes: 64 index heads x 128, causal, Q = 2048 / 4096 / 8192 queries of one fresh prompt;
* ``v4``: V4 CSA, S = Q / 4 compressed entries, entry s visible iff s < (pos + 1) // 4; torch path = ``reference``
  (``Indexer.select``'s arithmetic) + the boolean-mask masked_fill;
* ``v32``: V3.2 DSA, S = Q tokens, key s visible iff s <= pos; torch path = ``mla.indexer_scores`` + ``masked_scores``.
Per row: ms (median of timed reps after warmup, CUDA events), peak extra memory (max_memory_allocated over the
allocated memory before the call: inputs excluded, the [Q, S] output included), the kernel's error vs the torch path
and the share of rows whose top-k sets agree; the stable top-k sort that follows in the models, for scale. Also the
fp32 (IEEE) kernel and a small tile sweep at Q = 4096 of both shapes (``--sweep``; ``same_bits_as_default``: whether
other tiles give the default's bits, for information only: the invariant needs one fixed config per call site).

    python benchmarks/bench_indexer_scores.py OUT.json [--sweep]
"""

from __future__ import annotations

import json
import sys

import torch

from torchinferno.kernels import indexer_scores as iks
from torchinferno.models.common import mla

HI, D = 64, 128
DEV = "cuda"
TOPK = {"v4": 512, "v32": 2048}


def timed(fn, reps: int = 5, warmup: int = 2) -> tuple[float, float, object]:
    """-> (median ms, peak extra GiB, last result)."""
    for _ in range(warmup):
        fn()  # result dropped at once
    out = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        out = None  # the previous result is not counted in this call's peak
        a.record()
        out = fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    return sorted(times)[len(times) // 2], peak, out


def inputs(kind: str, Q: int, dtype=torch.bfloat16, seed: int = 0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    S = Q // 4 if kind == "v4" else Q
    q = torch.randn(Q, HI, D, device=DEV, generator=g).to(dtype)
    k = torch.randn(S, D, device=DEV, generator=g).to(dtype)
    w = torch.randn(Q, HI, device=DEV, generator=g) * HI**-0.5
    pos = torch.arange(Q, device=DEV)
    lim = (pos + 1) // 4 if kind == "v4" else pos + 1
    return q, k, w, lim


def torch_path(kind, q, k, w, lim):
    vis = torch.arange(k.shape[0], device=q.device)[None, :] < lim[:, None]  # the [Q, S] mask the models build
    if kind == "v4":
        return iks.reference(q, k, w, D**-0.5).masked_fill(~vis, float("-inf"))
    return mla.masked_scores(mla.indexer_scores(q, k, w * D**-0.5), vis)


def kernel_path(kind, q, k, w, lim, config=None):
    scale = D**-0.5 if kind == "v4" else 1.0
    return iks.indexer_scores(q, k, w if kind == "v4" else w * D**-0.5, scale, lim, config=config)


def topk_agree(a: torch.Tensor, b: torch.Tensor, k: int) -> float:
    k = min(k, a.shape[-1])
    ia = torch.sort(a, dim=-1, descending=True, stable=True).indices[:, :k]
    ib = torch.sort(b, dim=-1, descending=True, stable=True).indices[:, :k]
    ma = torch.zeros_like(a, dtype=torch.bool).scatter_(1, ia, True)
    mb = torch.zeros_like(b, dtype=torch.bool).scatter_(1, ib, True)
    return float((ma == mb).all(-1).float().mean())


def row(kind: str, Q: int) -> dict:
    q, k, w, lim = inputs(kind, Q)
    S = k.shape[0]
    r = {"kind": kind, "Q": Q, "S": S, "logits_GiB": Q * HI * S * 4 / 2**30}
    r["kernel_ms"], r["kernel_peak_GiB"], got = timed(lambda: kernel_path(kind, q, k, w, lim))
    flops = 2 * HI * D * float(((lim.clamp(max=S)).sum()))  # useful (visible) pairs only
    r["kernel_TFLOPs"] = flops / r["kernel_ms"] / 1e9
    q32, k32 = q.float(), k.float()
    r["kernel_fp32_ms"], _, got32 = timed(lambda: kernel_path(kind, q32, k32, w, lim), reps=3)
    del q32, k32
    try:
        r["torch_ms"], r["torch_peak_GiB"], want = timed(lambda: torch_path(kind, q, k, w, lim), reps=3, warmup=1)
    except torch.OutOfMemoryError as e:
        r["torch_ms"] = r["torch_peak_GiB"] = None
        r["torch_error"] = f"OOM: {str(e)[:120]}"
        want = None
        torch.cuda.empty_cache()
    if want is not None:
        fin = torch.isfinite(want)
        r["same_inf_pattern"] = bool(torch.equal(fin, torch.isfinite(got)))
        r["rel_err_bf16"] = float((got[fin] - want[fin]).norm() / want[fin].norm())
        r["rel_err_fp32_kernel_vs_bf16_ref"] = float((got32[fin] - want[fin]).norm() / want[fin].norm())
        r["topk_rows_agree"] = topk_agree(got, want, TOPK[kind])
        del want
    r["sort_ms"], r["sort_peak_GiB"], _ = timed(
        lambda: torch.sort(got, dim=-1, descending=True, stable=True).indices[:, : TOPK[kind]], reps=3)
    torch.cuda.empty_cache()
    return r


SWEEP = [{"BLOCK_Q": bq, "BLOCK_S": bs, "num_warps": nw, "num_stages": ns}
         for bq, bs, nw, ns in ((64, 128, 8, 2), (64, 64, 4, 2), (128, 64, 8, 2), (128, 128, 8, 2), (64, 128, 4, 3),
                                (32, 128, 4, 2))]


def sweep(kind: str = "v32", Q: int = 4096) -> list[dict]:
    q, k, w, lim = inputs(kind, Q)
    ref = kernel_path(kind, q, k, w, lim)
    out = []
    for cfg in SWEEP:
        try:
            ms, _, got = timed(lambda: kernel_path(kind, q, k, w, lim, cfg), reps=5)
            out.append({"kind": kind, "Q": Q, **cfg, "ms": ms, "same_bits_as_default": bool(torch.equal(got, ref))})
        except Exception as e:  # a config past the shared memory / registers: reported, not fatal
            out.append({"kind": kind, "Q": Q, **cfg, "error": f"{type(e).__name__}: {str(e)[:100]}"})
        print("sweep", kind, Q, out[-1], flush=True)
    return out


def main() -> None:
    path = sys.argv[1]
    rep = {"device": torch.cuda.get_device_name(), "rows": [], "sweep": []}
    for kind in ("v4", "v32"):
        for Q in (2048, 4096, 8192):
            r = row(kind, Q)
            rep["rows"].append(r)
            print("row", json.dumps(r), flush=True)
            json.dump(rep, open(path, "w"), indent=1)
    if "--sweep" in sys.argv:
        rep["sweep"] = sweep("v4", 4096) + sweep("v32", 4096)
    json.dump(rep, open(path, "w"), indent=1)
    print(f"{'shape':>14} {'kernel ms':>9} {'peak GiB':>8} {'TFLOP/s':>7} {'fp32 ms':>8} | {'torch ms':>8} "
          f"{'peak GiB':>8} | {'rel err':>8} {'top-k ok':>8} | {'sort ms':>7}")
    for r in rep["rows"]:
        t = "OOM" if r["torch_ms"] is None else f"{r['torch_ms']:8.2f} {r['torch_peak_GiB']:8.2f}"
        e = "" if r["torch_ms"] is None else f"{r['rel_err_bf16']:8.1e} {r['topk_rows_agree']:8.4f}"
        print(f"{r['kind']:>4} Q{r['Q']:>5} S{r['S']:>4} {r['kernel_ms']:9.2f} {r['kernel_peak_GiB']:8.2f} "
              f"{r['kernel_TFLOPs']:7.1f} {r['kernel_fp32_ms']:8.2f} | {t} | {e} | {r['sort_ms']:7.2f}")


if __name__ == "__main__":
    main()
