"""GPU benchmarks: ``perf-smoke`` (paged decode attention, reference vs Triton) and ``bench-gpu``.

``bench-gpu`` runs in one process on one GPU and reports, against ceilings measured in the same
run (device copy bandwidth counting read + write, bf16 matmul rate), for a Llama-3-8B-shaped
model with random bf16 weights built with ``TritonPagedAttention``:

(a) batch-1 decode step time at contexts 128 and 4096 (CUDA-graph replay of a whole step:
    forward + logits) and its fraction of the bandwidth bound ``(weight bytes + KV bytes read) /
    bandwidth``; also a device-resident greedy decode loop and the eager step;
(b) batch-64 decode throughput (graph loop), same accounting;
(c) 2048-token prefill time and model TFLOP/s (linear FLOPs of every token, logits of the last
    token, causal attention FLOPs);
(d) offline engine throughput: random 1024-in / 1024-out prompts with ignore_eos through
    ``LLMEngine`` (paged continuous batching), eager runner, then the same with decode steps
    replayed from CUDA graphs (``GraphModelRunner`` below, a subclass used only here);
(e) transformers' eager ``generate`` on the same weights (its LlamaForCausalLM sharing our
    tensors), batch 1 and 64, decode tok/s as ``B * (N - 1) / (t(N) - t(1))``.

Every section checks a wall-clock budget and is skipped (and said so) rather than run partly,
except the engine run, which stops at its deadline and reports what finished.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from torchinferno.bench.generate_bench import weight_bytes_per_step


# ------------------------------------------------------------------------------------- timing
def cuda_time_ms(fn, iters: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of ``fn()`` measured with CUDA events around each call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def graph_time_ms(fn, calls: int = 20, iters: int = 10) -> float:
    """Device milliseconds per ``fn()`` with launch overhead removed: ``calls`` calls captured in one
    CUDA graph, replays timed with events. Falls back to ``cuda_time_ms`` when capture fails."""
    try:
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(calls):
                fn()
    except Exception:
        torch.cuda.synchronize()
        return cuda_time_ms(fn, iters=iters)
    return cuda_time_ms(g.replay, iters=iters, warmup=2) / calls


def wall_time_ms(fn, iters: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


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
               block_size=16, dtype="bfloat16", iters=50, sweep=False, log=print) -> dict:
    """Paged decode attention: torch reference vs the specialized kernel (time, max error, GB/s)."""
    from torchinferno.checkpoint.auto import resolve_dtype
    from torchinferno.kernels import api
    from torchinferno.models.common.attention import gather_kv

    dt = resolve_dtype(dtype)
    dv = value_dim or head_dim
    dev = torch.device(device)
    torch.manual_seed(0)
    kc, vc, bt = _paged_cache(batch, seq_len, kv_heads, head_dim, dv, block_size, dt, dev)
    q = torch.randn(batch, heads, head_dim, device=dev, dtype=dt)
    lens = torch.full((batch,), seq_len, dtype=torch.int32, device=dev)
    scale = head_dim ** -0.5
    lens_list = [seq_len] * batch
    exact = api.paged_attention_reference(q.double(), kc.double(), vc.double(), [1] * batch, lens_list, bt, scale)

    def sdpa_gather():  # what TorchAttention's decode path does
        k = gather_kv(kc, bt, seq_len).transpose(1, 2)
        v = gather_kv(vc, bt, seq_len).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), k, v, scale=scale,
                                                                enable_gqa=heads != kv_heads).squeeze(2)

    candidates = {
        "reference (torch fp32)": lambda: api.paged_attention_reference(q, kc, vc, [1] * batch, lens_list, bt, scale),
        "torch SDPA over gathered blocks": sdpa_gather,
        "specialized (api)": lambda: api.batched_paged_decode_attention(q, kc, vc, bt, lens, scale, seq_lens_list=lens_list),
    }
    if sweep and dev.type == "cuda":
        from torchinferno.kernels.triton import decode_attention as da

        base = da.choose_num_splits(batch, kv_heads, bt.shape[1] * block_size, dev)
        for bn in (32, 64, 128):
            for w in (4, 8):
                for st in (2, 3):
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
        rows.append({"name": name, "ms": ms, "ms_with_launch": launch_ms, "max_abs_err": err, "kv_gb_s": kv_bytes / ms / 1e6})
    ok = [r for r in rows if "ms" in r]
    spec = next(r for r in ok if r["name"] == "specialized (api)")
    ref = next(r for r in ok if r["name"].startswith("reference"))
    result = {"device": str(dev), "batch": batch, "heads": heads, "kv_heads": kv_heads, "seq_len": seq_len,
              "head_dim": head_dim, "value_dim": dv, "block_size": block_size, "dtype": dtype, "kv_bytes": kv_bytes,
              "rows": rows, "speedup_vs_reference": ref["ms"] / spec["ms"]}
    log(f"perf-smoke B={batch} H={heads} Hkv={kv_heads} L={seq_len} D={head_dim} Dv={dv} page={block_size} {dtype} on {dev}")
    log("  (time: device time per call from CUDA-graph replays; 'with launch': eager call incl. Python launch cost)")
    for r in sorted(rows, key=lambda r: r.get("ms", 1e9)):
        if "ms" in r:
            log(f"  {r['name']:<44} {r['ms'] * 1e3:9.1f} us (with launch {r['ms_with_launch'] * 1e3:8.1f} us)  "
                f"max err {r['max_abs_err']:.2e}  KV {r['kv_gb_s']:7.0f} GB/s")
        else:
            log(f"  {r['name']:<44} failed: {r['error']}")
    log(f"  specialized is {result['speedup_vs_reference']:.1f}x the reference")
    return result


# ------------------------------------------------------------------------------------- model
def build_random_model(size: str = "llama3-8b", device="cuda", dtype=torch.bfloat16, seed: int = 0):
    """A family model of a named size with random weights, built on meta and materialized on ``device``."""
    from torchinferno.models.common.attention_triton import TritonPagedAttention
    from torchinferno.models.common.module_utils import materialize
    from torchinferno.models.registry import get_family

    fam = get_family("llama3")
    cfg = fam.size(size)
    model = fam.build(cfg, device="meta", variant="v1", attention_backend=TritonPagedAttention)
    materialize(model, device, dtype)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.8, 1.2, generator=g)
            else:
                p.normal_(0.0, 0.02, generator=g)
    model.eval()
    model.family = fam
    return model


def model_flops_prefill(cfg, tokens: int) -> float:
    """Linear FLOPs for every token (logits for the last only) + causal attention FLOPs."""
    d, L, i = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size
    hd, h, kv = cfg.head_dim_, cfg.num_attention_heads, cfg.num_key_value_heads
    per_layer = d * (h + 2 * kv) * hd + h * hd * d + 3 * d * i
    linear = 2 * per_layer * L * tokens + 2 * d * cfg.vocab_size
    attn = 2 * 2 * L * h * hd * tokens * (tokens + 1) / 2
    return linear + attn


class DecodeBench:
    """Static paged cache + CudaGraphDecodeRunner over one model; device-resident greedy loop."""

    def __init__(self, model, max_batch: int, max_ctx: int, block_size: int = 16, buckets=(1, 64)):
        from torchinferno.kernels.cuda_graphs import CudaGraphDecodeRunner

        self.model = model
        self.bs = block_size
        self.dev = next(model.parameters()).device
        spec = model.family.kv_spec(model.config)
        self.max_blocks = -(-max_ctx // block_size) + 1
        self.caches = spec.allocate(max_batch * self.max_blocks + 1, block_size, torch.bfloat16, self.dev)
        for layer in self.caches:
            for t in layer:
                t.normal_()
        self.kv_bytes_per_token = spec.bytes_per_token(torch.bfloat16)
        self.runner = CudaGraphDecodeRunner(model, self.caches, block_size, self.max_blocks, batch_sizes=buckets)
        self.runner.capture()

    def inputs(self, batch: int, ctx: int):
        perm = torch.randperm(batch * self.max_blocks, device=self.dev) + 1
        bt = perm.view(batch, self.max_blocks).to(torch.int32)
        pos = torch.full((batch,), ctx, dtype=torch.long, device=self.dev)
        ids = torch.randint(0, self.model.config.vocab_size, (batch,), device=self.dev)
        return ids, pos, bt

    def slots(self, bt, pos):
        return bt.gather(1, (pos // self.bs).view(-1, 1)).view(-1).long() * self.bs + pos % self.bs

    def step(self, ids, pos, bt):
        return self.runner.run(ids, pos, self.slots(bt, pos), bt, (pos + 1).to(torch.int32))

    def loop(self, ids, pos, bt, steps: int):
        """Greedy decode ``steps`` tokens with no host sync inside the loop."""
        for _ in range(steps):
            ids = self.step(ids, pos, bt).argmax(-1)
            pos = pos + 1
        return ids

    def measure(self, batch: int, ctx: int, weight_bytes: int, bw: float, loop_steps: int = 32) -> dict:
        ids, pos, bt = self.inputs(batch, ctx)
        step_ms = cuda_time_ms(lambda: self.step(ids, pos, bt), iters=30)
        loop_ms = cuda_time_ms(lambda: self.loop(ids, pos, bt, loop_steps), iters=3, warmup=1) / loop_steps
        graphs = self.runner.use_graphs
        self.runner.use_graphs = False
        saved, self.runner.graphs = self.runner.graphs, {}
        eager_ms = cuda_time_ms(lambda: self.step(ids, pos, bt), iters=10)
        prof = profile_kernels(lambda: self.step(ids, pos, bt))
        self.runner.graphs, self.runner.use_graphs = saved, graphs
        kv_read = batch * (ctx + 1) * self.kv_bytes_per_token
        bound_ms = (weight_bytes + kv_read) / bw * 1e3
        return {"batch": batch, "context": ctx, "step_ms": step_ms, "loop_ms_per_step": loop_ms, "eager_step_ms": eager_ms,
                "tok_s": batch / loop_ms * 1e3, "bytes": weight_bytes + kv_read, "bound_ms": bound_ms,
                "fraction_of_bound": bound_ms / step_ms, "loop_fraction_of_bound": bound_ms / loop_ms, "profile": prof,
                "gemm_gb_s": weight_bytes / prof["groups_ms"].get("gemm", float("nan")) / 1e6}


def measure_prefill(model, tokens: int, bw: float) -> dict:
    from torchinferno.models.common.attention_metadata import build_attention_metadata

    spec = model.family.kv_spec(model.config)
    dev = next(model.parameters()).device
    bs = 16
    nb = -(-tokens // bs)
    caches = spec.allocate(nb + 1, bs, torch.bfloat16, dev)
    meta = build_attention_metadata([tokens], [0], [list(range(1, nb + 1))], bs, dev)
    ids = torch.randint(0, model.config.vocab_size, (tokens,), device=dev)
    pos = torch.arange(tokens, device=dev)

    def run():
        with torch.inference_mode():
            h = model(ids, pos, caches, meta)
            return model.compute_logits(h[-1:])

    ms = cuda_time_ms(run, iters=10, warmup=2)
    flops = model_flops_prefill(model.config, tokens)
    prof = profile_kernels(run)
    cfg = model.config
    gemm_flops = flops - 2 * 2 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim_ * tokens * (tokens + 1) / 2
    del caches
    return {"tokens": tokens, "ms": ms, "flops": flops, "tflop_s": flops / ms / 1e9, "profile": prof,
            "gemm_tflop_s": gemm_flops / prof["groups_ms"].get("gemm", float("nan")) / 1e9}


_KERNEL_GROUPS = (
    ("attention", ("_decode_stage", "_prefill_kernel", "flash", "fmha", "attention", "sdpa", "cudnn")),
    ("gemm", ("gemm", "gemv", "cutlass", "nvjet", "xmma", "sm90", "splitk", "cublas", "dot_kernel")),
    ("rms_norm", ("_rms_norm",)), ("rotary", ("_rotary",)), ("swiglu", ("_swiglu",)), ("kv_append", ("_kv_append",)),
)


def profile_kernels(fn, warmup: int = 2) -> dict:
    """Device time of one ``fn()`` per kernel group (from torch.profiler's CUDA kernel events)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    groups: dict[str, float] = {}
    counts: dict[str, int] = {}
    top: dict[str, float] = {}
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        name = ev.name
        us = ev.device_time_total  # for a device event: the kernel's own duration
        low = name.lower()
        grp = next((g for g, keys in _KERNEL_GROUPS if any(k in low for k in keys)), "other")
        groups[grp] = groups.get(grp, 0.0) + us / 1e3
        counts[grp] = counts.get(grp, 0) + 1
        top[name[:80]] = top.get(name[:80], 0.0) + us / 1e3
    total = sum(groups.values())
    return {"kernel_ms": total, "groups_ms": groups, "kernel_counts": counts,
            "top": dict(sorted(top.items(), key=lambda kv: -kv[1])[:8])}


def _fmt_profile(p: dict) -> str:
    parts = [f"{g} {ms:.2f} ms/{p['kernel_counts'][g]}" for g, ms in sorted(p["groups_ms"].items(), key=lambda kv: -kv[1])]
    return f"kernels {p['kernel_ms']:.2f} ms: " + ", ".join(parts)


GEMV_CONFIGS = ({"block_n": 8, "block_k": 512, "num_warps": 4}, {"block_n": 8, "block_k": 1024, "num_warps": 4},
                {"block_n": 16, "block_k": 512, "num_warps": 8}, {"block_n": 4, "block_k": 1024, "num_warps": 4},
                {"block_n": 16, "block_k": 256, "num_warps": 4})


@torch.inference_mode()
def gemv_experiment(model, bench: "DecodeBench", weight_bytes: int, bw: float, contexts, log=print) -> dict:
    """Batch-1 linears: cuBLAS vs the Triton GEMV (graph-timed per weight shape), then batch-1 decode
    steps with the best GEMV config swapped into the model (the swap is undone before returning)."""
    from torchinferno.kernels.cuda_graphs import CudaGraphDecodeRunner
    from torchinferno.kernels.triton.gemv import gemv, swap_linear_for_gemv

    shapes: dict[tuple, int] = {}
    weights = {}
    for mod in model.modules():
        if type(mod) is torch.nn.Linear:
            key = tuple(mod.weight.shape)
            shapes[key] = shapes.get(key, 0) + 1
            weights[key] = mod.weight
    rows, totals = [], {"cublas": 0.0}
    for key, count in shapes.items():
        w = weights[key]
        x = torch.randn(1, w.shape[1], device=w.device, dtype=w.dtype)
        row = {"shape": key, "count": count, "cublas_us": 1e3 * graph_time_ms(lambda: torch.nn.functional.linear(x, w))}
        ref = torch.nn.functional.linear(x, w).float()
        totals["cublas"] += row["cublas_us"] * count
        for i, cfg in enumerate(GEMV_CONFIGS):
            err = float((gemv(x, w, None, **cfg).float() - ref).norm() / ref.norm())
            us = 1e3 * graph_time_ms(lambda cfg=cfg: gemv(x, w, None, **cfg))
            row[f"cfg{i}_us"], row[f"cfg{i}_err"] = us, err
            totals[f"cfg{i}"] = totals.get(f"cfg{i}", 0.0) + us * count
        nbytes = w.numel() * w.element_size()
        best = min(range(len(GEMV_CONFIGS)), key=lambda i: row[f"cfg{i}_us"])
        log(f"    gemv {key} x{count}: cuBLAS {row['cublas_us']:.1f} us ({nbytes / row['cublas_us'] / 1e3:.0f} GB/s), "
            f"best triton cfg{best} {row[f'cfg{best}_us']:.1f} us ({nbytes / row[f'cfg{best}_us'] / 1e3:.0f} GB/s, "
            f"rel err {row[f'cfg{best}_err']:.1e})")
        rows.append(row)
    # Per weight shape, keep whichever of cuBLAS / the best Triton config was faster.
    choice: dict[tuple, dict | None] = {}
    for row in rows:
        best = min(range(len(GEMV_CONFIGS)), key=lambda i: row[f"cfg{i}_us"])
        choice[row["shape"]] = GEMV_CONFIGS[best] if row[f"cfg{best}_us"] < 0.97 * row["cublas_us"] else None
    mixed = sum(min(row["cublas_us"], *(row[f"cfg{i}_us"] for i in range(len(GEMV_CONFIGS)))) * row["count"] for row in rows)
    res = {"rows": rows, "layer_totals_us": totals, "choice": {str(k): v for k, v in choice.items()}, "decode_batch1": []}
    log(f"    linear time per step: cuBLAS {totals['cublas'] / 1e3:.3f} ms, per-shape best {mixed / 1e3:.3f} ms")
    undo = swap_linear_for_gemv(model, lambda lin: choice.get(tuple(lin.weight.shape)))
    saved = bench.runner
    try:
        bench.runner = CudaGraphDecodeRunner(model, bench.caches, bench.bs, bench.max_blocks, batch_sizes=(1,))
        bench.runner.capture()
        for ctx in contexts:
            r = bench.measure(1, ctx, weight_bytes, bw)
            r.pop("profile", None)
            res["decode_batch1"].append(r)
            log(f"(a') batch 1 ctx {ctx} with Triton GEMV: graph step {r['step_ms']:.3f} ms (loop {r['loop_ms_per_step']:.3f}"
                f" ms) -> {100 * r['fraction_of_bound']:.1f}% of bound")
    finally:
        undo()
        bench.runner = saved
    return res


# ------------------------------------------------------------------------------------- transformers peer
def hf_peer(model):
    """transformers' LlamaForCausalLM whose parameters are our tensors (no copy)."""
    import transformers

    fam = model.family
    hf_cfg = transformers.LlamaConfig(**fam.config_to_hf(model.config))
    try:
        hf_cfg._attn_implementation = "sdpa"
    except Exception:  # pragma: no cover - older/newer config API
        pass
    with torch.device("meta"):
        hf = transformers.LlamaForCausalLM(hf_cfg)
    hf.load_state_dict(dict(fam.export_weights(model)), strict=True, assign=True)
    dev = next(model.parameters()).device
    hf.model.rotary_emb = type(hf.model.rotary_emb)(config=hf_cfg).to(dev)  # its buffers were built on meta
    meta_left = [n for n, t in list(hf.named_parameters()) + list(hf.named_buffers()) if t.is_meta]
    if meta_left:
        raise RuntimeError(f"transformers peer has unmaterialized tensors: {meta_left[:4]}")
    return hf.eval()


def hf_decode_tok_s(hf, batch: int, prompt_len: int, new_tokens: int, vocab: int, repeats: int = 2) -> dict:
    dev = next(hf.parameters()).device
    ids = torch.randint(0, vocab, (batch, prompt_len), device=dev)
    mask = torch.ones_like(ids)

    def run(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                        pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    run(2)
    t_full = min(run(new_tokens) for _ in range(repeats))
    t_one = min(run(1) for _ in range(repeats))
    return {"batch": batch, "prompt": prompt_len, "new_tokens": new_tokens, "tok_s": batch * (new_tokens - 1) / (t_full - t_one),
            "step_ms": (t_full - t_one) / (new_tokens - 1) * 1e3}


def hf_agreement(model, hf, tokens: int = 64, cache_dtype=torch.bfloat16) -> dict:
    """Same weights, same prompt: our last-position logits vs transformers'."""
    from torchinferno.models.common.attention_metadata import build_attention_metadata

    dev = next(model.parameters()).device
    ids = torch.randint(0, model.config.vocab_size, (tokens,), device=dev)
    spec = model.family.kv_spec(model.config)
    caches = spec.allocate(tokens // 16 + 2, 16, cache_dtype, dev)
    meta = build_attention_metadata([tokens], [0], [list(range(1, tokens // 16 + 2))], 16, dev)
    with torch.inference_mode():
        ours = model.compute_logits(model(ids, torch.arange(tokens, device=dev), caches, meta))
        theirs = hf(ids[None]).logits[0].float()
    rel = float((ours - theirs).norm() / theirs.norm())
    agree = float((ours.argmax(-1) == theirs.argmax(-1)).float().mean())
    return {"rel_diff": rel, "argmax_agreement": agree}


def hf_agreement_fp32_small(size: str, device) -> dict:
    """Semantics check without bf16 noise: a reduced fp32 model of the same family/rope vs transformers."""
    import dataclasses

    from torchinferno.models.common.attention_triton import TritonPagedAttention
    from torchinferno.models.registry import get_family

    fam = get_family("llama3")
    cfg = dataclasses.replace(fam.size(size), hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                              num_attention_heads=8, num_key_value_heads=2)
    m = fam.build(cfg, device=device, variant="v1", attention_backend=TritonPagedAttention).float().eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.uniform_(0.8, 1.2) if "norm" in name else p.normal_(0.0, 0.05)
    m.family = fam
    return hf_agreement(m, hf_peer(m), tokens=48, cache_dtype=torch.float32)


# ------------------------------------------------------------------------------------- engine
def _graph_model_runner_cls():
    """A ModelRunner whose pure-decode steps replay CUDA graphs (defined lazily: engine import)."""
    from torchinferno.engine.model_runner import ModelRunner
    from torchinferno.engine.outputs import ModelRunnerOutput
    from torchinferno.kernels.cuda_graphs import DEFAULT_BUCKETS, CudaGraphDecodeRunner
    from torchinferno.text.sampling import sample

    class GraphModelRunner(ModelRunner):
        def __init__(self, model, kv_cache, max_model_len: int, buckets=DEFAULT_BUCKETS):
            super().__init__(model, kv_cache)
            bs = kv_cache.block_size
            self.graph = CudaGraphDecodeRunner(model, kv_cache.tensors, bs, -(-max_model_len // bs), buckets)
            self.graph.capture()
            self.num_graph_steps = 0

        @torch.inference_mode()
        def execute(self, sched):
            reqs = sched.scheduled
            plain = all(s.num_tokens == 1 and s.sample and s.sampling_params.logprobs is None
                        and s.sampling_params.seed is None for s in reqs)
            if not reqs or not plain or self.graph.bucket_for(len(reqs)) is None:
                return super().execute(sched)
            self.forget(sched.finished_ids)
            bs = self.kv_cache.block_size
            n = len(reqs)
            pos = [s.num_computed_tokens for s in reqs]
            width = max(-(-(p + 1) // bs) for p in pos)
            table = [s.block_ids[:width] + [0] * (width - min(width, len(s.block_ids))) for s in reqs]
            slots = [s.block_ids[p // bs] * bs + p % bs for s, p in zip(reqs, pos)]
            host = torch.tensor([[s.token_ids[0] for s in reqs], pos, slots, [p + 1 for p in pos]], dtype=torch.long)
            dev = host.to(self.device, non_blocking=True)
            bt = torch.tensor(table, dtype=torch.int32).to(self.device, non_blocking=True)
            logits = self.graph.run(dev[0], dev[1], dev[2], bt, dev[3].to(torch.int32))
            tokens = sample(logits, [s.sampling_params for s in reqs]).tolist()
            self.num_forward_calls += 1
            self.num_graph_steps += 1
            return ModelRunnerOutput(sampled_token_ids={s.request_id: t for s, t in zip(reqs, tokens)})

    return GraphModelRunner


def engine_throughput(model, num_requests: int, in_len: int, out_len: int, deadline_s: float, graphs: bool,
                      max_num_seqs: int = 256, max_batched_tokens: int = 8192, log=print) -> dict:
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.llm_engine import LLMEngine

    max_len = in_len + out_len
    kv_mem = max_num_seqs * (max_len + 16) * model.family.kv_spec(model.config).bytes_per_token(torch.bfloat16)
    engine = LLMEngine(model, None, block_size=16, kv_cache_memory=int(kv_mem * 1.02), max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_batched_tokens, max_model_len=max_len, enable_prefix_caching=False)
    t_setup = time.perf_counter()
    if graphs:
        engine.runner = _graph_model_runner_cls()(model, engine.kv_cache, max_len)
    setup_s = time.perf_counter() - t_setup
    exec_s = [0.0]
    inner = engine.runner.execute

    def timed_execute(sched):  # runner time includes the wait for the GPU (sampling syncs)
        t = time.perf_counter()
        try:
            return inner(sched)
        finally:
            exec_s[0] += time.perf_counter() - t

    engine.runner.execute = timed_execute
    g = torch.Generator().manual_seed(1)
    params = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True)
    for i in range(num_requests):
        engine.add_request(f"r{i}", torch.randint(0, model.config.vocab_size, (in_len,), generator=g).tolist(), params)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out_tokens = finished = steps = 0
    while engine.has_unfinished():
        if time.perf_counter() - t0 > deadline_s:
            break
        for o in engine.step():
            out_tokens += len(o.new_token_ids)
            finished += int(o.finished)
        steps += 1
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    st = engine.stats()
    res = {"graphs": graphs, "requests": num_requests, "finished": finished, "complete": finished == num_requests,
           "input_len": in_len, "output_len": out_len, "wall_s": wall, "output_tokens": out_tokens,
           "output_tok_s": out_tokens / wall, "total_tok_s": (st.num_computed_tokens) / wall, "steps": steps,
           "max_batch_seqs": st.max_batch_seqs, "preemptions": st.num_preemptions, "graph_setup_s": setup_s,
           "graph_steps": getattr(engine.runner, "num_graph_steps", 0), "runner_s": exec_s[0],
           "outside_runner_s": wall - exec_s[0]}
    log(f"  engine graphs={graphs}: {out_tokens} output tokens in {wall:.1f} s = {res['output_tok_s']:.0f} tok/s "
        f"({finished}/{num_requests} finished, {steps} steps, max batch {st.max_batch_seqs}); runner {exec_s[0]:.1f} s, "
        f"scheduler/output processing {wall - exec_s[0]:.1f} s")
    del engine
    torch.cuda.empty_cache()
    return res


# ------------------------------------------------------------------------------------- orchestration
TARGETS = {"a_fraction_of_bound": 0.85, "b_vs_transformers": 10.0, "c_tflop_s": 650.0, "d_output_tok_s": 10000.0}


def run_bench_gpu(size: str = "llama3-8b", contexts=(128, 4096), batch: int = 64, batch_ctx: int = 1024,
                  prefill_tokens: int = 2048, engine_requests: int = 256, engine_in: int = 1024, engine_out: int = 1024,
                  engine_modes=("graphs", "eager"), hf: bool = True, gemv_experiment_on: bool = True, hf_new_tokens: int = 32, budget_s: float = 540.0,
                  json_path: str | None = None, log=print) -> dict:
    """Run every section in one process (see the module docstring); returns and optionally writes the report."""
    from torchinferno.bench.ceilings import copy_bandwidth, matmul_rate

    t_start = time.perf_counter()
    left = lambda: budget_s - (time.perf_counter() - t_start)  # noqa: E731
    dev = torch.device("cuda")
    rep: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": torch.cuda.get_device_name(dev),
                 "torch": torch.__version__, "model": size, "dtype": "bfloat16", "targets": TARGETS, "skipped": []}
    try:
        import triton

        rep["triton"] = triton.__version__
    except ImportError:
        rep["triton"] = None

    def save():
        if json_path:
            with open(json_path, "w") as f:
                json.dump(rep, f, indent=2, default=str)

    bw = copy_bandwidth(dev, nbytes=4 * 1024**3, iters=10)
    mm = matmul_rate(dev, torch.bfloat16, n=8192, iters=10)
    rep["ceilings"] = {"copy_gb_s": bw / 1e9, "bf16_matmul_tflop_s": mm / 1e12}
    log(f"ceilings: copy {bw / 1e9:.0f} GB/s (read+write), bf16 matmul {mm / 1e12:.0f} TFLOP/s")
    model = build_random_model(size, dev)
    wbytes = weight_bytes_per_step(model)
    rep["weight_bytes_per_step"] = wbytes
    log(f"model {size}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B params, {wbytes / 1e9:.2f} GB read per decode step")
    save()

    # (a), (b) decode
    bench = DecodeBench(model, max_batch=batch, max_ctx=max(max(contexts), batch_ctx) + 64, buckets=(1, batch))
    rep["decode_batch1"] = []
    for ctx in contexts:
        r = bench.measure(1, ctx, wbytes, bw)
        rep["decode_batch1"].append(r)
        log(f"(a) batch 1 ctx {ctx}: graph step {r['step_ms']:.3f} ms (loop {r['loop_ms_per_step']:.3f} ms, eager "
            f"{r['eager_step_ms']:.3f} ms); bound {r['bound_ms']:.3f} ms -> {100 * r['fraction_of_bound']:.1f}% of bound")
        log(f"    profile (eager step): {_fmt_profile(r['profile'])}; weights through GEMMs at {r['gemm_gb_s']:.0f} GB/s")
    if gemv_experiment_on:
        try:
            rep["gemv_experiment"] = gemv_experiment(model, bench, wbytes, bw, contexts, log=log)
        except Exception as e:
            rep["gemv_experiment"] = {"error": f"{type(e).__name__}: {e}"}
            log(f"    gemv experiment failed: {rep['gemv_experiment']['error']}")
        save()
    r = bench.measure(batch, batch_ctx, wbytes, bw)
    rep["decode_batch"] = r
    log(f"(b) batch {batch} ctx {batch_ctx}: graph step {r['step_ms']:.3f} ms -> {r['tok_s']:.0f} tok/s (loop), eager step "
        f"{r['eager_step_ms']:.3f} ms; {100 * r['fraction_of_bound']:.1f}% of bound")
    log(f"    profile (eager step): {_fmt_profile(r['profile'])}")
    del bench
    torch.cuda.empty_cache()
    save()

    # (c) prefill
    r = measure_prefill(model, prefill_tokens, bw)
    rep["prefill"] = r
    log(f"(c) prefill {prefill_tokens} tokens: {r['ms']:.2f} ms, {r['tflop_s']:.0f} TFLOP/s "
        f"({100 * r['tflop_s'] / (mm / 1e12):.0f}% of the measured matmul rate)")
    log(f"    profile: {_fmt_profile(r['profile'])}; GEMMs alone at {r['gemm_tflop_s']:.0f} TFLOP/s")
    save()

    # (e) transformers peer
    if hf and left() > 120:
        try:
            peer = hf_peer(model)
            rep["hf_agreement"] = hf_agreement(model, peer)
            log(f"    transformers agreement: rel diff {rep['hf_agreement']['rel_diff']:.3e}, argmax agreement "
                f"{100 * rep['hf_agreement']['argmax_agreement']:.0f}%")
            rep["hf_agreement_fp32_small"] = hf_agreement_fp32_small(size, dev)
            log(f"    transformers agreement, fp32 {size}-shaped with 4 layers / hidden 512: rel diff "
                f"{rep['hf_agreement_fp32_small']['rel_diff']:.2e}")
            rep["hf"] = [hf_decode_tok_s(peer, 1, 128, hf_new_tokens, model.config.vocab_size),
                         hf_decode_tok_s(peer, batch, batch_ctx, hf_new_tokens, model.config.vocab_size)]
            for h in rep["hf"]:
                log(f"(e) transformers generate batch {h['batch']} prompt {h['prompt']}: {h['tok_s']:.0f} tok/s "
                    f"({h['step_ms']:.1f} ms/step)")
            rep["b_vs_transformers"] = rep["decode_batch"]["tok_s"] / rep["hf"][1]["tok_s"]
            rep["a_vs_transformers"] = rep["decode_batch1"][0]["tok_s"] / rep["hf"][0]["tok_s"]
            del peer
        except Exception as e:  # report, keep going: the engine section is independent
            rep["hf_error"] = f"{type(e).__name__}: {e}"
            log(f"(e) transformers peer failed: {rep['hf_error']}")
        torch.cuda.empty_cache()
    else:
        rep["skipped"].append("transformers peer")
    save()

    # (d) engine
    rep["engine"] = []
    for mode in engine_modes:
        graphs = mode == "graphs"
        if left() < 60:
            rep["skipped"].append(f"engine {mode}")
            continue
        # A first run keeps time for a second one; each stops at its deadline.
        deadline = min(left() - 100, 240.0) if mode != engine_modes[-1] else left() - 30
        try:
            rep["engine"].append(engine_throughput(model, engine_requests, engine_in, engine_out, deadline, graphs, log=log))
        except Exception as e:
            rep["engine"].append({"graphs": graphs, "error": f"{type(e).__name__}: {e}"})
            log(f"(d) engine graphs={graphs} failed: {type(e).__name__}: {e}")
        save()
    rep["wall_s"] = time.perf_counter() - t_start
    save()
    log(format_table(rep))
    return rep


def format_table(rep: dict) -> str:
    """The summary table (markdown) with each figure, its ceiling/peer and the target."""
    c = rep.get("ceilings", {})
    lines = [f"| figure | measured | ceiling / peer | target |", "|---|---|---|---|",
             f"| copy bandwidth (read+write) | {c.get('copy_gb_s', 0):.0f} GB/s | | |",
             f"| bf16 matmul 8192^3 | {c.get('bf16_matmul_tflop_s', 0):.0f} TFLOP/s | | |"]
    for r in rep.get("decode_batch1", []):
        lines.append(f"| (a) batch-1 decode step, ctx {r['context']} (graph) | {r['step_ms']:.3f} ms | bound {r['bound_ms']:.3f} ms"
                     f" = {100 * r['fraction_of_bound']:.1f}% of bound | >= 85% |")
    if "decode_batch" in rep:
        r = rep["decode_batch"]
        hf = rep.get("hf", [None, None])[1] if rep.get("hf") else None
        peer = f"transformers {hf['tok_s']:.0f} tok/s = {rep['b_vs_transformers']:.1f}x" if hf else "transformers n/a"
        lines.append(f"| (b) batch-{r['batch']} decode, ctx {r['context']} | {r['tok_s']:.0f} tok/s ({r['step_ms']:.2f} ms/step)"
                     f" | {peer}; {100 * r['fraction_of_bound']:.0f}% of bound | >= 10x |")
    if "prefill" in rep:
        r = rep["prefill"]
        lines.append(f"| (c) prefill {r['tokens']} tokens | {r['ms']:.2f} ms, {r['tflop_s']:.0f} TFLOP/s | "
                     f"matmul ceiling {c.get('bf16_matmul_tflop_s', 0):.0f} | >= 650 TFLOP/s |")
    for r in rep.get("engine", []):
        if "error" in r:
            lines.append(f"| (d) engine graphs={r['graphs']} | failed: {r['error'][:60]} | | |")
            continue
        done = "complete" if r["complete"] else f"stopped at deadline, {r['finished']}/{r['requests']} finished"
        lines.append(f"| (d) engine {r['requests']}x{r['input_len']}/{r['output_len']}, graphs={r['graphs']} | "
                     f"{r['output_tok_s']:.0f} output tok/s ({done}) | | >= 10000 |")
    for h in rep.get("hf", []) or []:
        lines.append(f"| (e) transformers generate, batch {h['batch']} | {h['tok_s']:.0f} tok/s | | |")
    return "\n".join(lines)
