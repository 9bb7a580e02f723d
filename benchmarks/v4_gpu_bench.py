"""DeepSeek-V4 on one GPU (issue 22 item 4), run by benchmarks/device_issue22.sh: writes JSON under OUT, prints a
compact summary.

* ``models``: tiny (debug, fp32) and mid-size (small, bf16, batch 1 and 8) random V4 configs through ``LLM``: the eager
  per-sequence decode (``static_decode`` off), the static decode run eagerly (``enforce_eager``) and the static
  decode from CUDA graphs; greedy tokens compared with the first, ms per decode step of each (a batch of B prompts:
  (time(max_tokens=N) - time(max_tokens=1)) / (N - 1)).
* ``kernel``: the Triton sparse-sink decode vs its torch reference at V4-Flash's attention shape (64 heads of 512,
  window 128, top-512 entries) and the small config's, batch 1 / 8 / 64: max abs error, microseconds each.
* ``artifacts``: prepare-deepseek-v4-kernels for the small config (tuned here), then the graph decode with them.
* ``prefill``: prefill attention (``kernels.sparse_sink_prefill``: the decode kernel, one row per query) vs the torch
  ``_attend`` at V4-Flash's attention shape (64 heads of 512, window 128), fresh prompts of 512 / 2048 / 4096 tokens,
  sliding-only, CSA (top-512 of Q/4 entries) and HCA (Q/128 entries): ms, peak memory above the inputs (torch may
  OOM: reported), error vs an fp32 oracle computed in query chunks; a tile sweep at 4096 CSA; and the small
  config's whole-model prefill (2048 tokens, bf16) with the kernel on / off.

Usage: python3 benchmarks/v4_gpu_bench.py OUT [kernel,models,artifacts,prefill]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.llm import LLM
from torchinferno.kernels import sparse_sink_decode as ssd
from torchinferno.models.deepseek_v4.model import V4Attention, randomize_untrained_
from torchinferno.testing import tiny_model

DEV = torch.device("cuda")


def v4(size: str, dtype):
    m = tiny_model("deepseek-v4", size=size, seed=0, dtype=torch.float32, device="cpu")
    return randomize_untrained_(m, seed=1).to(device=DEV, dtype=dtype).eval()


def set_static(model, on: bool) -> None:
    for a in model.modules():
        if isinstance(a, V4Attention):
            a.static_decode = on


def timed_generate(llm, prompts, n: int) -> tuple[list[list[int]], float]:
    p = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, p, use_tqdm=False)  # warm (prefix cache off: same work every time)
    torch.cuda.synchronize()
    t = time.perf_counter()
    outs = llm.generate(prompts, p, use_tqdm=False)
    torch.cuda.synchronize()
    return [o.token_ids for o in outs], time.perf_counter() - t


def run_mode(model, mode: str, prompts, n: int, artifacts: str | None = None) -> dict:
    set_static(model, mode != "eager-seq")
    llm = LLM(model, block_size=16, num_gpu_blocks=512, max_model_len=min(1024, model.config.max_position_embeddings),
              max_num_seqs=8,
              enforce_eager=mode != "graphs", enable_prefix_caching=False, kernel_artifacts=artifacts)
    toks, t_n = timed_generate(llm, prompts, n)
    _, t_1 = timed_generate(llm, prompts, 1)
    graphs = llm.engine.stats().num_graph_steps
    del llm
    torch.cuda.empty_cache()
    set_static(model, True)
    return {"mode": mode, "tokens": toks, "ms_per_step": (t_n - t_1) * 1000 / (n - 1), "graph_steps": graphs}


def models(out: Path, summary: list[str]) -> None:
    res = []
    # bf16 random weights give near-tied logits: a rounding difference between paths flips a token and the rest of
    # the sequence diverges, so the small config also runs in fp32 (paths must agree there) and each row reports
    # where it first diverges and its agreement with the static eager path it replays.
    for size, dtype, B, n in (("debug", torch.float32, 4, 32), ("small", torch.float32, 8, 48),
                              ("small", torch.bfloat16, 1, 48), ("small", torch.bfloat16, 8, 48)):
        model = v4(size, dtype)
        g = torch.Generator().manual_seed(0)
        V = min(model.config.vocab_size, 256)
        prompts = [torch.randint(0, V, (int(L),), generator=g).tolist() for L in torch.randint(20, 200, (B,), generator=g)]
        rows = [run_mode(model, m, prompts, n) for m in ("eager-seq", "static-eager", "graphs")]
        ref, static = rows[0]["tokens"], rows[1]["tokens"]

        def agree(toks, other) -> tuple[float, int]:
            same = sum(a == b for x, y in zip(toks, other) for a, b in zip(x, y))
            first = min((next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(toks, other)))
            return same / sum(len(x) for x in other), first

        for r in rows:
            r["token_match"], r["first_divergence"] = agree(r["tokens"], ref)
            r["match_vs_static"], _ = agree(r["tokens"], static)
        for r in rows:
            r.pop("tokens")
        res.append({"size": size, "dtype": str(dtype), "batch": B, "new_tokens": n, "modes": rows})
        summary.append(f"model {size:5s} {str(dtype)[6:]:8s} B={B}: " + "  ".join(
            f"{r['mode']} {r['ms_per_step']:.2f} ms/step match {r['token_match']:.3f} (first diff {r['first_divergence']}, "
            f"vs static {r['match_vs_static']:.3f}) graph steps {r['graph_steps']}"
            for r in rows))
        del model
        torch.cuda.empty_cache()
    (out / "models.json").write_text(json.dumps(res, indent=2))


def _time(fn, iters: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1000 / iters


def kernel(out: Path, summary: list[str]) -> None:
    res = []
    for name, H, D, W, K in (("flash", 64, 512, 128, 512), ("small", 16, 128, 64, 64)):
        for B in (1, 8, 64):
            g = torch.Generator().manual_seed(B)
            bs, blocks = 64, -(-B * (W + K) // 64) + 2
            q = torch.randn(B, H, D, generator=g).to(DEV, torch.bfloat16)
            cache = torch.randn(blocks, bs, D, generator=g).to(DEV, torch.bfloat16)
            win = torch.randint(0, blocks * bs, (B, W), generator=g).to(DEV)
            ent = torch.randint(0, blocks * bs, (B, K), generator=g).to(DEV)
            ent[:, K // 2 :] = -1  # half the entries masked (a short context)
            sinks = torch.randn(H, generator=g).to(DEV)
            tri = lambda: ssd.sparse_sink_decode(q, cache, win, cache, ent, sinks, D**-0.5)  # noqa: E731
            one = lambda: ssd.sparse_sink_decode(q, cache, win, cache, ent, sinks, D**-0.5, config={"SPLITS": 1})  # noqa: E731
            ref = lambda: ssd.reference(q, cache, win, cache, ent, sinks, D**-0.5)  # noqa: E731
            exact = ssd.reference(q.float(), cache.float(), win, cache.float(), ent, sinks, D**-0.5)
            err_t = float((tri().float() - exact).abs().max())
            err_r = float((ref().float() - exact).abs().max())
            row = {"shape": name, "B": B, "H": H, "D": D, "rows": W + K, "max_err_triton": err_t, "max_err_torch_bf16": err_r,
                   "us_triton": _time(tri), "us_triton_1split": _time(one), "us_torch": _time(ref),
                   "max_err_1split": float((one().float() - exact).abs().max())}
            res.append(row)
            summary.append(f"kernel {name:5s} B={B:3d}: triton {row['us_triton']:7.1f} us (1 split {row['us_triton_1split']:7.1f})"
                           f"  torch {row['us_torch']:7.1f} us  "
                           f"max err vs fp32: triton {err_t:.2e} torch-bf16 {err_r:.2e}")
    (out / "kernel.json").write_text(json.dumps(res, indent=2))


def artifacts(out: Path, summary: list[str]) -> None:
    from torchinferno.kernels import v4_artifacts as va
    from torchinferno.models.deepseek_v4.config import small_deepseek_v4_config

    t = time.perf_counter()
    d = va.prepare(small_deepseek_v4_config(), out / "v4-kernels", torch.bfloat16, (1,), device="cuda", log=summary.append)
    summary.append(f"artifacts: prepared {d.name} in {time.perf_counter() - t:.1f} s")
    model = v4("small", torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (100,), generator=g).tolist() for _ in range(8)]
    base = run_mode(model, "graphs", prompts, 48)
    tuned = run_mode(model, "graphs", prompts, 48, artifacts=str(out / "v4-kernels"))
    summary.append(f"artifacts: small B=8 graphs default tiles {base['ms_per_step']:.2f} ms/step, tuned "
                   f"{tuned['ms_per_step']:.2f} ms/step, tokens equal {base['tokens'] == tuned['tokens']}")


def _peak(fn) -> tuple[float, float]:
    """-> (ms per call, peak MiB allocated above what was live before the call)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return _time(fn, iters=10) / 1000, peak


def _prefill_inputs(Q: int, kind: str, H=64, D=512, W=128, topk=512, seed=0) -> tuple[dict, int | None]:
    """A fresh prompt of Q tokens at one layer: q [Q, H, D], keys [Q, D], entries + visibility/selection."""
    from torchinferno.models.deepseek_v4.compressor import visible_entries

    g = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(Q, H, D, generator=g, device=DEV).to(torch.bfloat16)
    keys = torch.randn(Q, D, generator=g, device=DEV).to(torch.bfloat16)
    pos = torch.arange(Q, device=DEV)
    ent = vis = width = None
    if kind != "sliding":
        rate = 4 if kind == "csa" else 128
        n = Q // rate
        ent = torch.randn(n, D, generator=g, device=DEV).to(torch.bfloat16)
        vis = visible_entries(pos, n, rate)
        if kind == "csa":
            width = min(topk, n)
            if topk < n:
                scores = torch.randn(Q, n, generator=g, device=DEV).masked_fill(~vis, float("-inf"))
                idx = torch.topk(scores, topk, dim=-1).indices
                vis = torch.zeros_like(vis).scatter_(1, idx, True) & vis
    sinks = torch.randn(H, generator=g, device=DEV)
    return dict(q=q, pos=pos, keys=keys, lo=0, ent=ent, vis=vis, sinks=sinks, scale=D**-0.5, window=W), width


def _oracle_err(a: dict, got: torch.Tensor, chunk: int = 256) -> tuple[float, float]:
    """(max abs, relative Frobenius) error of ``got`` vs the fp32 reference, computed ``chunk`` queries at a time."""
    from torchinferno.kernels import sparse_sink_prefill as spp

    num = den = mx = 0.0
    f32 = {**a, "keys": a["keys"].float(), "ent": None if a["ent"] is None else a["ent"].float()}
    for i in range(0, a["q"].shape[0], chunk):
        sl = slice(i, i + chunk)
        want = spp.reference(**{**f32, "q": a["q"][sl].float(), "pos": a["pos"][sl],
                                "vis": None if a["vis"] is None else a["vis"][sl]})
        d = got[sl].float() - want
        num, den, mx = num + float(d.square().sum()), den + float(want.square().sum()), max(mx, float(d.abs().max()))
    return mx, (num / max(den, 1e-30)) ** 0.5


def prefill(out: Path, summary: list[str], sizes=(512, 2048, 4096), H: int = 64, D: int = 512,
            model_tokens: int = 2048) -> None:
    from torchinferno.kernels import sparse_sink_prefill as spp

    res = []
    for Q in sizes:
        for kind in ("sliding", "csa", "hca"):
            a, width = _prefill_inputs(Q, kind, H, D)
            row = {"Q": Q, "kind": kind, "entries": 0 if a["ent"] is None else a["ent"].shape[0], "width": width}
            kern = lambda: spp.sparse_sink_prefill(**a, width=width)  # noqa: E731
            row["ms_kernel"], row["mib_kernel"] = _peak(kern)
            row["max_err_kernel"], row["rel_err_kernel"] = _oracle_err(a, kern())
            win = lambda: spp.window_slots(a["pos"], 0, a["window"])  # noqa: E731
            ents = (lambda: spp.entry_slots(a["vis"], width)) if a["vis"] is not None else (lambda: None)
            row["ms_slot_lists"] = _time(lambda: (win(), ents()), iters=10) / 1000
            try:
                ref = lambda: spp.reference(**a)  # noqa: E731
                row["ms_torch"], row["mib_torch"] = _peak(ref)
                row["max_err_torch"], row["rel_err_torch"] = _oracle_err(a, ref())
            except torch.OutOfMemoryError:
                row["ms_torch"] = row["mib_torch"] = "OOM"
            torch.cuda.empty_cache()
            res.append(row)
            t = row["ms_torch"]
            summary.append(
                f"prefill {kind:7s} Q={Q:4d} n={row['entries']:4d}: kernel {row['ms_kernel']:7.2f} ms "
                f"{row['mib_kernel']:7.0f} MiB (slots {row['ms_slot_lists']:.2f} ms) rel err {row['rel_err_kernel']:.1e}"
                + ("  torch OOM" if t == "OOM" else f"  torch {t:7.2f} ms {row['mib_torch']:7.0f} MiB rel err "
                   f"{row['rel_err_torch']:.1e}  x{t / row['ms_kernel']:.1f}"))
            (out / "prefill.json").write_text(json.dumps(res, indent=2))
    a, width = _prefill_inputs(sizes[-1], "csa", H, D)
    sweep = []
    for cfg in ({"BLOCK_H": 16, "BLOCK_N": 32, "num_warps": 4}, {"BLOCK_H": 16, "BLOCK_N": 64, "num_warps": 4},
                {"BLOCK_H": 16, "BLOCK_N": 32, "num_warps": 8}, {"BLOCK_H": 32, "BLOCK_N": 32, "num_warps": 8},
                {"BLOCK_H": 32, "BLOCK_N": 16, "num_warps": 4}, {"BLOCK_H": 64, "BLOCK_N": 16, "num_warps": 8}):
        try:
            ms = _time(lambda: spp.sparse_sink_prefill(**a, width=width, config=cfg), iters=10) / 1000
            sweep.append({**cfg, "ms": ms})
        except Exception as e:  # a tile that does not fit
            sweep.append({**cfg, "error": type(e).__name__})
    summary.append(f"prefill tiles (csa Q={sizes[-1]}): " + "  ".join(
        f"H{c['BLOCK_H']}/N{c['BLOCK_N']}/w{c['num_warps']} " + (f"{c['ms']:.2f} ms" if "ms" in c else c["error"])
        for c in sweep))
    (out / "prefill_tiles.json").write_text(json.dumps(sweep, indent=2))
    model = v4("small", torch.bfloat16)
    ids = torch.randint(0, 256, (model_tokens,), generator=torch.Generator().manual_seed(0)).to(DEV)
    pos = torch.arange(model_tokens, device=DEV)
    attns = [m for m in model.modules() if isinstance(m, V4Attention)]
    outs = {}
    for on in (True, False):
        for m in attns:
            m.sparse_kernel = on
        with torch.no_grad():
            ms, mib = _peak(lambda: model(ids, pos))
            outs[on] = model.compute_logits(model(ids, pos)).float()
        summary.append(f"prefill model small bf16 T={model_tokens} sparse_kernel={on}: {ms:.1f} ms, peak {mib:.0f} MiB")
    d = (outs[True] - outs[False]).norm() / outs[False].norm()
    agree = float((outs[True].argmax(-1) == outs[False].argmax(-1)).float().mean())
    summary.append(f"prefill model small: kernel vs torch logits rel diff {float(d):.1e}, argmax agreement {agree:.4f}")


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    stages = (sys.argv[2] if len(sys.argv) > 2 else "kernel,models,artifacts").split(",")
    summary: list[str] = [f"device {torch.cuda.get_device_name()} torch {torch.__version__}"]
    print(summary[0], flush=True)
    for st in stages:
        n0 = len(summary)
        try:
            {"models": models, "kernel": kernel, "artifacts": artifacts, "prefill": prefill}[st](out, summary)
        except Exception as e:  # one stage failing must not hide the others' results
            import traceback

            traceback.print_exc()
            summary.append(f"{st}: FAILED {type(e).__name__}: {str(e)[:300]}")
        (out / "summary.txt").write_text("\n".join(summary) + "\n")
        print("\n".join(summary[n0:]), flush=True)  # as each stage ends: a timeout keeps what finished


if __name__ == "__main__":
    main()
