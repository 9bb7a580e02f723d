"""GPU benchmarks: ``perf-smoke`` (paged decode attention, reference vs Triton) and ``bench-gpu``.

``bench-gpu`` runs in one process on one GPU and reports, against ceilings measured in the same
run (device copy bandwidth counting read + write; bf16 matmul rate of one 8192^3 product (burst)
and of products back to back for ~50 ms (sustained: the ceiling of a prefill, which runs that long
and on a power-capped card at a lower clock)), with the SM clock, power and clock-limit reasons
sampled through NVML per section (``bench/gpu_clocks.py``), for a Llama-3-8B-shaped model with
random bf16 weights built with ``TritonPagedAttention``:

(a) batch-1 decode step time at contexts 128 and 4096 (CUDA-graph replay of a whole step:
    forward + logits) and its fraction of the bandwidth bound ``(weight bytes + KV bytes read) /
    bandwidth``; the same step device only (queued behind a spin kernel: the host's issue time
    drops out), a device-resident greedy decode loop and the eager step. Reported for the
    fused decode step the engine installs on CUDA (``models/llama3/cuda_decode.py``), after the
    module path (a') measured the same way;
(b) batch-64 decode throughput (graph loop), same accounting;
(c) 2048-token prefill time and model TFLOP/s (linear FLOPs of every token, logits of the last
    token, causal attention FLOPs);
(d) offline engine throughput: random 1024-in / 1024-out prompts with ignore_eos through
    ``LLMEngine`` (paged continuous batching) as it runs on CUDA by default (decode steps
    replayed from CUDA graphs, ``engine/graph_runner.py``), with graphs + ``async_scheduling``
    (engine mode ``async``), the same with an FP8 KV cache (mode ``async-fp8``), with FP8 W8A8
    linears (``async-w8``; ``kernels/fp8_linear.py``, swapped in place after the bf16 modes, with
    the logits' deviation from bf16 reported) and both (``async-w8-fp8``), and with
    ``enforce_eager`` (mode ``eager``);
(e) transformers' eager ``generate`` on the same weights (its LlamaForCausalLM sharing our
    tensors), batch 1 and 64, decode tok/s as ``B * (N - 1) / (t(N) - t(1))``.

Every section checks a wall-clock budget and is skipped (and said so) rather than run partly,
except the engine run, which stops at its deadline and reports what finished.
"""

from __future__ import annotations

import json
import time

import torch

from torchinferno.bench.generate_bench import weight_bytes_per_step
from torchinferno.bench.gpu_clocks import ClockSampler, fmt_clocks
from torchinferno.bench.gpu_decode import DecodeBench, build_random_model
from torchinferno.bench.gpu_engine import ENGINE_MODES, engine_throughput, quantize_model_fp8
from torchinferno.bench.gpu_peers import hf_agreement, hf_agreement_fp32_small, hf_decode_tok_s, hf_peer
from torchinferno.bench.gpu_timing import _fmt_profile, cuda_time_ms, graph_time_ms, profile_kernels


def model_flops_prefill(cfg, tokens: int) -> float:
    """Linear FLOPs for every token (logits for the last only) + causal attention FLOPs."""
    d, L, i = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size
    hd, h, kv = cfg.head_dim_, cfg.num_attention_heads, cfg.num_key_value_heads
    per_layer = d * (h + 2 * kv) * hd + h * hd * d + 3 * d * i
    linear = 2 * per_layer * L * tokens + 2 * d * cfg.vocab_size
    attn = 2 * 2 * L * h * hd * tokens * (tokens + 1) / 2
    return linear + attn


def prefill_runner(model, tokens: int):
    """A callable running one ``tokens``-token prompt (random ids) through ``model`` into a fresh paged cache,
    logits of the last token: the work (c) times. Static shapes, so it can be graph-captured."""
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

    return run


def measure_prefill(model, tokens: int, bw: float, clock=None) -> dict:
    """(c)'s figures; ``clock``: a ``ClockSampler`` whose summary of the timed replays joins the result."""
    import contextlib

    dev = next(model.parameters()).device
    run = prefill_runner(model, tokens)
    phase = "c: prefill timing"  # the timed prefills only, back to back (~0.6 s): no capture or host-only work
    run()
    with clock.phase(phase) if clock is not None else contextlib.nullcontext():
        ms = cuda_time_ms(run, iters=10, warmup=2)
    # The same forward replayed from one CUDA graph (static shapes): launch gaps removed.
    graph_ms = graph_time_ms(run, calls=1, iters=10)
    flops = model_flops_prefill(model.config, tokens)
    prof = profile_kernels(run)
    cfg = model.config
    gemm_flops = flops - 2 * 2 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim_ * tokens * (tokens + 1) / 2
    return {"tokens": tokens, "ms": ms, "flops": flops, "tflop_s": flops / ms / 1e9, "profile": prof,
            "graph_ms": graph_ms, "graph_tflop_s": flops / graph_ms / 1e9,
            "clocks": clock.summary(phase) if clock is not None else {},
            "gemm_tflop_s": gemm_flops / prof["groups_ms"].get("gemm", float("nan")) / 1e9,
            "attention_variants": prefill_attention_variants(cfg, tokens, dev),
            "gemm_shapes": prefill_gemm_shapes(model, tokens)}


def prefill_gemm_shapes(model, tokens: int) -> dict:
    """TFLOP/s of each distinct linear shape at ``tokens`` rows: ``F.linear`` (weight [N, K], as the
    model runs it) vs the same product with a pre-transposed [K, N] weight, each over every layer's
    weight in turn (graph-replayed)."""
    import torch.nn.functional as F

    by_shape: dict[tuple, list[torch.Tensor]] = {}
    for mod in model.modules():
        if type(mod) is torch.nn.Linear and mod.weight.shape[0] < 100_000:  # the head runs on one row
            by_shape.setdefault(tuple(mod.weight.shape), []).append(mod.weight)
    out = {}
    for (n, k), ws in by_shape.items():
        ws = ws[:4]
        x = torch.randn(tokens, k, device=ws[0].device, dtype=ws[0].dtype)
        wts = [w.t().contiguous() for w in ws]
        flops = 2 * tokens * n * k * len(ws)
        tn = graph_time_ms(lambda: [F.linear(x, w) for w in ws], calls=1)
        nn_ = graph_time_ms(lambda: [x @ wt for wt in wts], calls=1)
        out[f"{n}x{k}"] = {"linear_tflop_s": flops / tn / 1e9, "pretransposed_tflop_s": flops / nn_ / 1e9}
    return out


def prefill_attention_variants(cfg, tokens: int, dev) -> dict:
    """Device ms of one layer's causal prefill attention through each SDPA route, GQA shapes of ``cfg``."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    h, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim_
    q = torch.randn(tokens, h, hd, device=dev, dtype=torch.bfloat16)
    k = torch.randn(tokens, kv, hd, device=dev, dtype=torch.bfloat16)
    v = torch.randn(tokens, kv, hd, device=dev, dtype=torch.bfloat16)
    qt, kt, vt = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    rep = h // kv

    def expanded():
        return F.scaled_dot_product_attention(qt, k.repeat_interleave(rep, 1).transpose(0, 1)[None],
                                              v.repeat_interleave(rep, 1).transpose(0, 1)[None], is_causal=True)

    def route(backend):
        def fn():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=backend != SDPBackend.CUDNN_ATTENTION)
        return fn

    out = {}
    ref = expanded().float()
    for name, fn in (("expand_kv+default", expanded), ("flash_enable_gqa", route(SDPBackend.FLASH_ATTENTION)),
                     ("cudnn_native_gqa", route(SDPBackend.CUDNN_ATTENTION)), ("efficient", route(SDPBackend.EFFICIENT_ATTENTION))):
        try:
            err = float((fn().float() - ref).norm() / ref.norm())
            out[name] = {"ms": graph_time_ms(fn, calls=10, iters=10), "rel_err_vs_expanded": err}
        except Exception as e:  # a backend not available for these shapes on this build
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:120]}"}
    return out


TARGETS = {"a_fraction_of_bound": 0.85, "b_vs_transformers": 10.0, "c_tflop_s": 650.0, "d_output_tok_s": 10000.0}


def run_bench_gpu(size: str = "llama3-8b", contexts=(128, 4096), batch: int = 64, batch_ctx: int = 1024,
                  prefill_tokens: int = 2048, engine_requests: int = 256, engine_in: int = 1024, engine_out: int = 1024,
                  engine_modes=("graphs", "async"), hf: bool = True, hf_new_tokens: int = 32, budget_s: float = 540.0,
                  json_path: str | None = None, log=print, sections=("a", "b", "c", "d", "e")) -> dict:
    """Run the chosen sections (default: all) in one process (see the module docstring); the ceilings
    are always measured first. Returns and optionally writes the report."""
    from torchinferno.bench.ceilings import copy_bandwidth, matmul_rate, read_bandwidth, sustained_matmul_rate

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

    clock = ClockSampler(period=0.02).start()
    bw = copy_bandwidth(dev, nbytes=4 * 1024**3, iters=10)
    rbw = read_bandwidth(dev, nbytes=4 * 1024**3, iters=10)
    with clock.phase("matmul burst"):
        mm = matmul_rate(dev, torch.bfloat16, n=8192, iters=10)
    with clock.phase("matmul sustained"):
        mm_s = sustained_matmul_rate(dev, torch.bfloat16, n=8192, seconds=0.05, iters=10)
    rep["ceilings"] = {"copy_gb_s": bw / 1e9, "read_gb_s": rbw / 1e9, "bf16_matmul_tflop_s": mm / 1e12,
                       "bf16_matmul_sustained_tflop_s": mm_s / 1e12}
    log(f"ceilings: copy {bw / 1e9:.0f} GB/s (read+write), read-only (sum) {rbw / 1e9:.0f} GB/s (info), "
        f"bf16 matmul {mm / 1e12:.0f} TFLOP/s (one 8192^3 product), sustained {mm_s / 1e12:.0f} TFLOP/s (~50 ms of "
        "products back to back)")
    if clock.available:
        log(f"    sustained matmul: {fmt_clocks(clock.summary('matmul sustained'))}")
    model = build_random_model(size, dev)
    wbytes = weight_bytes_per_step(model)
    rep["weight_bytes_per_step"] = wbytes
    log(f"model {size}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B params, {wbytes / 1e9:.2f} GB read per decode step")
    save()

    # (a), (b) decode
    clock.set_phase("a, b: decode")
    rep["sections"] = list(sections)
    bench = (DecodeBench(model, max_batch=batch, max_ctx=max(max(contexts), batch_ctx) + 64, buckets=(1, batch))
             if {"a", "b"} & set(sections) else None)
    rep["decode_batch1"] = []
    rep["decode_batch1_module_path"] = []
    if "a" in sections:  # the module path first (13 kernels a layer), then the fused step the engine uses
        for ctx in contexts:
            r = bench.measure(1, ctx, wbytes, bw)
            rep["decode_batch1_module_path"].append(r)
            log(f"(a') batch 1 ctx {ctx}, module path: graph step {r['step_ms']:.3f} ms (loop {r['loop_ms_per_step']:.3f} ms)"
                f" -> {100 * r['fraction_of_bound']:.1f}% of bound; profile (eager): {_fmt_profile(r['profile'])}")
        fused = bench.set_fused_step(True)
        rep["decode_batch1_fused_step"] = fused
        for ctx in contexts:
            r = bench.measure(1, ctx, wbytes, bw)
            rep["decode_batch1"].append(r)
            log(f"(a) batch 1 ctx {ctx}{' (fused step)' if fused else ''}: graph step {r['step_ms']:.3f} ms (device only "
                f"{r['step_device_ms']:.3f} ms, loop {r['loop_ms_per_step']:.3f} ms, eager {r['eager_step_ms']:.3f} ms); "
                f"bound {r['bound_ms']:.3f} ms -> {100 * r['fraction_of_bound']:.1f}% of bound "
                f"({100 * r['device_fraction_of_bound']:.1f}% device only, {100 * r['loop_fraction_of_bound']:.1f}% loop)")
            log(f"    profile (eager step): {_fmt_profile(r['profile'])}; weights through GEMMs at {r['gemm_gb_s']:.0f} GB/s")
        if fused and bench.set_fused_step(True, pdl=False):  # what programmatic dependent launch contributes
            r = bench.measure(1, contexts[0], wbytes, bw)
            rep["decode_batch1_fused_no_pdl"] = r
            log(f"(a'') batch 1 ctx {contexts[0]}, fused step without PDL: graph step {r['step_ms']:.3f} ms (loop "
                f"{r['loop_ms_per_step']:.3f} ms) -> {100 * r['fraction_of_bound']:.1f}% of bound")
        bench.set_fused_step(False)  # (b) times the module path
    if "b" in sections:
        r = bench.measure(batch, batch_ctx, wbytes, bw)
        rep["decode_batch"] = r
        log(f"(b) batch {batch} ctx {batch_ctx}: graph step {r['step_ms']:.3f} ms -> {r['tok_s']:.0f} tok/s (loop), eager step "
            f"{r['eager_step_ms']:.3f} ms; {100 * r['fraction_of_bound']:.1f}% of bound")
        log(f"    profile (eager step): {_fmt_profile(r['profile'])}")
    del bench
    torch.cuda.empty_cache()
    save()

    # (c) prefill
    clock.set_phase("c")
    if "c" in sections:
        rep["prefill"] = measure_prefill(model, prefill_tokens, bw, clock)
        _log_prefill(rep["prefill"], rep["ceilings"], log)
        save()

    # (e) transformers peer
    clock.set_phase("e: transformers")
    if hf and "e" in sections and left() > 120:
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
            if "decode_batch" in rep:
                rep["b_vs_transformers"] = rep["decode_batch"]["tok_s"] / rep["hf"][1]["tok_s"]
            if rep["decode_batch1"]:
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
    clock.set_phase("d: engine")
    rep["engine"] = []
    # FP8 weights replace the bf16 ones in place: those modes run last
    modes = sorted(engine_modes, key=lambda m: ENGINE_MODES[m][3]) if "d" in sections else []
    for mode in modes:
        graphs, async_sched, kv_dtype, w8 = ENGINE_MODES[mode]
        if left() < 60:
            rep["skipped"].append(f"engine {mode}")
            continue
        if w8 and "fp8_weights" not in rep:
            rep["fp8_weights"] = quantize_model_fp8(model, log)
            if "c" in sections:  # for information: (c)'s target is about the bf16 model
                rep["prefill_fp8"] = measure_prefill(model, prefill_tokens, bw)
                log("    FP8 W8A8 model:")
                _log_prefill(rep["prefill_fp8"], rep["ceilings"], log)
        # A first run keeps time for a second one; each stops at its deadline.
        deadline = min(left() - 100, 240.0) if mode != modes[-1] else left() - 30
        try:
            r = engine_throughput(model, engine_requests, engine_in, engine_out, deadline, graphs, log=log,
                                  async_scheduling=async_sched, kv_cache_dtype=kv_dtype)
            rep["engine"].append({**r, "mode": mode, "weights": "fp8-w8a8" if w8 else "bfloat16"})
        except Exception as e:
            rep["engine"].append({"graphs": graphs, "async_scheduling": async_sched, "error": f"{type(e).__name__}: {e}"})
            log(f"(d) engine graphs={graphs} async={async_sched} failed: {type(e).__name__}: {e}")
        save()
    rep["wall_s"] = time.perf_counter() - t_start
    clock.stop()
    rep["clocks"] = clock.summary() if clock.available else {"unavailable": clock.error}
    save()
    log(format_table(rep))
    return rep


def _log_prefill(r: dict, ceilings: dict, log) -> None:
    burst, sus = ceilings["bf16_matmul_tflop_s"], ceilings.get("bf16_matmul_sustained_tflop_s", float("nan"))
    log(f"(c) prefill {r['tokens']} tokens: {r['ms']:.2f} ms, {r['tflop_s']:.0f} TFLOP/s ({100 * r['tflop_s'] / burst:.0f}% "
        f"of the burst matmul rate, {100 * r['tflop_s'] / sus:.0f}% of the sustained one)")
    log(f"    graph-replayed prefill: {r['graph_ms']:.2f} ms, {r['graph_tflop_s']:.0f} TFLOP/s")
    if r.get("clocks"):
        log(f"    during the timed prefills: {fmt_clocks(r['clocks'])}")
    log(f"    profile: {_fmt_profile(r['profile'])}; GEMMs alone at {r['gemm_tflop_s']:.0f} TFLOP/s")
    log("    prefill GEMMs: " + ", ".join(f"{k}: linear {v['linear_tflop_s']:.0f} / pre-transposed "
                                         f"{v['pretransposed_tflop_s']:.0f} TFLOP/s" for k, v in r["gemm_shapes"].items()))
    log("    prefill attention per layer: " + ", ".join(
        f"{k} {v['ms']:.3f} ms (err {v['rel_err_vs_expanded']:.1e})" if "ms" in v else f"{k} {v['error']}"
        for k, v in r["attention_variants"].items()))


def format_table(rep: dict) -> str:
    """The summary table (markdown) with each figure, its ceiling/peer and the target."""
    c = rep.get("ceilings", {})
    lines = ["| figure | measured | ceiling / peer | target |", "|---|---|---|---|",
             f"| copy bandwidth (read+write) | {c.get('copy_gb_s', 0):.0f} GB/s | | |",
             f"| bf16 matmul 8192^3, one product (burst) | {c.get('bf16_matmul_tflop_s', 0):.0f} TFLOP/s | | |",
             f"| bf16 matmul 8192^3, ~50 ms back to back (sustained) | "
             f"{c.get('bf16_matmul_sustained_tflop_s', float('nan')):.0f} TFLOP/s | | |"]
    for r in rep.get("decode_batch1", []):
        lines.append(f"| (a) batch-1 decode step, ctx {r['context']} (graph) | {r['step_ms']:.3f} ms (device only "
                     f"{r['step_device_ms']:.3f}, loop {r['loop_ms_per_step']:.3f}) | bound {r['bound_ms']:.3f} ms"
                     f" = {100 * r['fraction_of_bound']:.1f}% of bound ({100 * r['device_fraction_of_bound']:.1f}% device "
                     f"only, {100 * r['loop_fraction_of_bound']:.1f}% loop) | >= 85% |")
    if "decode_batch" in rep:
        r = rep["decode_batch"]
        hf = rep.get("hf", [None, None])[1] if rep.get("hf") else None
        peer = f"transformers {hf['tok_s']:.0f} tok/s = {rep['b_vs_transformers']:.1f}x" if hf else "transformers n/a"
        lines.append(f"| (b) batch-{r['batch']} decode, ctx {r['context']} | {r['tok_s']:.0f} tok/s ({r['step_ms']:.2f} ms/step)"
                     f" | {peer}; {100 * r['fraction_of_bound']:.0f}% of bound | >= 10x |")
    if "prefill" in rep:
        r = rep["prefill"]
        burst, sus = c.get("bf16_matmul_tflop_s", float("nan")), c.get("bf16_matmul_sustained_tflop_s", float("nan"))
        lines.append(f"| (c) prefill {r['tokens']} tokens (eager) | {r['ms']:.2f} ms, {r['tflop_s']:.0f} TFLOP/s | "
                     f"{100 * r['tflop_s'] / burst:.0f}% of matmul burst {burst:.0f}, {100 * r['tflop_s'] / sus:.0f}% of "
                     f"sustained {sus:.0f} | >= 650 TFLOP/s |")
        if "graph_ms" in r:
            lines.append(f"| (c) prefill {r['tokens']} tokens (CUDA graph) | {r['graph_ms']:.2f} ms, "
                         f"{r['graph_tflop_s']:.0f} TFLOP/s | | >= 650 TFLOP/s |")
    for r in rep.get("engine", []):
        if "error" in r:
            lines.append(f"| (d) engine graphs={r['graphs']} async={r.get('async_scheduling', False)} | "
                         f"failed: {r['error'][:60]} | | |")
            continue
        done = "complete" if r["complete"] else f"stopped at deadline, {r['finished']}/{r['requests']} finished"
        lines.append(f"| (d) engine {r['requests']}x{r['input_len']}/{r['output_len']}, graphs={r['graphs']}, "
                     f"async={r.get('async_scheduling', False)}, weights {r.get('weights', 'bfloat16')}, "
                     f"kv {r.get('kv_cache_dtype', 'bfloat16')} | "
                     f"{r['output_tok_s']:.0f} output tok/s ({done}) | | >= 10000 |")
    for h in rep.get("hf", []) or []:
        lines.append(f"| (e) transformers generate, batch {h['batch']} | {h['tok_s']:.0f} tok/s | | |")
    return "\n".join(lines)
