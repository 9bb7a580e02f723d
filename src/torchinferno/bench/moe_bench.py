"""``bench-moe``: the fused MoE on CUDA vs the grouped torch reference, at a DeepSeek-V2-Lite-like shape.

Two sections, each beside a same-run bound:

* ``layer``: one MoE block (router + routed experts + shared experts) at decode batches (1, 8, 64, 256 tokens)
  with the path policy's A/Bs beside it (shared experts inside the fused MoE / as their own MLP; up to 8 tokens the
  per-token kernels vs the grouped GEMMs, whichever the policy did not pick)
  and a prefill of 2048 tokens, at the V2-Lite-like shape and at DeepSeek-V3's (256 experts top-8 in 8 groups
  keeping 4, hidden 7168, one shared expert). Fused: captured in a CUDA graph (which also proves the step has no host sync)
  and replayed; reference: the grouped loop eagerly (it syncs per layer). Bound: bytes actually read (router,
  the experts the routing hits, shared experts) / copy bandwidth; prefill: FLOPs / sustained matmul rate.
* ``model``: the whole V2-Lite-like model (``deepseek_v32`` size ``v2-lite-shape``, random bf16): a decode step
  at each batch (context 128 per sequence): replayed from CUDA graphs (``CudaGraphDecodeRunner``: paged MLA decode
  + fused MoE, no host sync), the same module path eagerly, and eagerly with the torch MoE; a 2048-token prefill
  (eager, device-only behind a spin, and replayed from a CUDA graph);
  transformers' eager ``DeepseekV3ForCausalLM`` on the same tensors (``--no-hf`` skips it). ``--model-shape v3-scaled``
  runs the same section on DeepSeek-V3's layer shape with fewer layers (``bench.moe_models.build_model_shape``);
  ``--quantization fp8-block`` builds that model in block FP8 layer by layer (``kernels.fp8_block_stream``: 8 V3
  layers fit an H200) and times it without the torch MoE and transformers (the build's time and peak memory are
  reported).

Active bytes per decode step: every layer's non-expert weights, the experts the step's routing hits (measured
from the router on that step's input) and the LM head; KV bytes are small at context 128 and are added.
"""

from __future__ import annotations

import re
import time

import torch

from torchinferno.bench.ceilings import copy_bandwidth, sustained_matmul_rate
from torchinferno.bench.gpu_timing import cuda_time_ms, device_time_ms, graph_time_ms
from torchinferno.bench.moe_models import (  # noqa: F401 - re-exported: the bench's model builders
    MODEL_SHAPES,
    active_bytes,
    active_weights,
    build_model_shape,
    build_random,
    build_v2_lite,
)
from torchinferno.bench.moe_layer_bench import LAYER_SHAPES, layer_rows  # noqa: F401 - the layer section

def _routing_hits(model, ids, positions, caches, meta) -> list[int]:
    """Experts hit per MoE layer on this step's input (hooks on the routers)."""
    hits = []

    def hook(m, _inp, out):  # routed columns only (a fused MoE's router appends the shared experts after them)
        hits.append(int(torch.unique(out[1][:, : m.top_k]).numel()))

    handles = [m.register_forward_hook(hook) for n, m in model.named_modules() if n.endswith("mlp.gate")]
    with torch.no_grad():
        model(ids, positions, caches, meta)
    for h in handles:
        h.remove()
    return hits


def model_rows(model, dev, batches=(1, 8, 64, 256), ctx: int = 128, prefill: int = 2048, bw=None, mm=None,
               log=print, torch_moe: bool = True) -> dict:
    """Decode steps (graph-replayed, eager, eager with the torch MoE unless ``torch_moe`` is False: ``torch_ms`` None)
    at each batch and one prefill, beside the bytes/FLOPs bounds (module docstring)."""
    from torchinferno.kernels.cuda_graphs import CudaGraphDecodeRunner
    from torchinferno.models.common.attention_metadata import build_attention_metadata
    from torchinferno.models.common.moe import set_moe_backend
    from torchinferno.models.common.step_model import step_model

    cfg = model.config
    bs = 16
    spec = model.family.kv_spec(cfg)
    max_b = max(batches)
    blocks_per = -(-(ctx + 8) // bs)
    caches = spec.allocate(max_b * blocks_per + 1, bs, torch.bfloat16, dev)
    for layer in caches:
        for t in layer:
            t.normal_()
    out = {"decode": [], "prefill": None}
    set_moe_backend(model, "auto")
    lean = step_model(model, dev)  # the family's batch-1 decode-GEMV step where it has one, as the engine runs it
    out["lean_step"] = type(getattr(lean, "step", None)).__name__ if lean is not model else None
    if lean is not model and 1 in batches:  # the A/B: batch 1 through the module path, graph-replayed too
        mod = CudaGraphDecodeRunner(model, caches, bs, blocks_per, batch_sizes=(1,))
        mod.capture()
        ids, pos, meta = _b1_inputs(dev, bs, blocks_per, ctx)
        def replay_module_path():
            with torch.no_grad():
                return mod.run(ids, pos, meta.slot_mapping, meta.block_tables, meta.seq_lens, meta.seq_lens_list)

        out["module_path_b1_ms"] = cuda_time_ms(replay_module_path, iters=20, warmup=3)
        out["module_path_b1_device_ms"] = device_time_ms(replay_module_path, iters=20, warmup=3)
        log(f"  batch 1 through the module path (no {out['lean_step']}): {out['module_path_b1_ms']:.3f} ms "
            f"(device {out['module_path_b1_device_ms']:.3f})")
        del mod
    runner = CudaGraphDecodeRunner(lean, caches, bs, blocks_per, batch_sizes=batches)
    runner.capture()  # graphs where the model supports them (paged MLA + fused MoE), else the eager padded path
    out["graphs"] = runner.use_graphs
    log(f"  decode steps {'replayed from CUDA graphs' if runner.use_graphs else 'eager (model not capturable)'}")
    for B in batches:
        table = [list(range(1 + b * blocks_per, 1 + (b + 1) * blocks_per)) for b in range(B)]
        meta = build_attention_metadata([1] * B, [ctx] * B, table, bs, device=dev)
        ids = torch.randint(0, cfg.vocab_size, (B,), device=dev)
        pos = torch.full((B,), ctx, device=dev)
        hits = _routing_hits(model, ids, pos, caches, meta)
        nbytes = active_bytes(model, hits) + B * ctx * spec.bytes_per_token(torch.bfloat16)
        row = {"batch": B, "active_bytes": nbytes, "experts_hit_mean": sum(hits) / max(1, len(hits))}

        def step(ids=ids, pos=pos, meta=meta):
            with torch.no_grad():
                return lean.compute_logits(lean(ids, pos, caches, meta))

        def replay(ids=ids, pos=pos, meta=meta):
            with torch.no_grad():
                return runner.run(ids, pos, meta.slot_mapping, meta.block_tables, meta.seq_lens, meta.seq_lens_list)

        row["fused_ms"] = cuda_time_ms(replay, iters=20, warmup=3)  # as issued: input copies + replay
        row["fused_device_ms"] = device_time_ms(replay, iters=20, warmup=3)  # host issue time taken out
        row["fused_eager_ms"] = cuda_time_ms(step, iters=10, warmup=2)  # the module path, eagerly
        row["torch_ms"] = None
        if torch_moe:
            set_moe_backend(model, "torch")
            row["torch_ms"] = cuda_time_ms(step, iters=5, warmup=1)  # grouped reference MoE (host sync per layer)
            set_moe_backend(model, "auto")
        if bw:
            row["bound_ms"] = nbytes / bw * 1e3
            row["pct_of_bound"] = 100 * row["bound_ms"] / row["fused_ms"]
        row["tok_s"] = B / row["fused_ms"] * 1e3
        log(f"  model decode B={B:4d}: fused {row['fused_ms']:8.2f} ms (device {row['fused_device_ms']:.2f}; "
            f"{row['tok_s']:8.0f} tok/s)  eager {row['fused_eager_ms']:8.2f} ms  torch MoE {_ms(row['torch_ms'])}  "
            f"bound {row.get('bound_ms', 0):.2f} ms ({row.get('pct_of_bound', 0):.1f}%)  hit {row['experts_hit_mean']:.0f}")
        out["decode"].append(row)
    if prefill:
        out["prefill"] = prefill_row(model, dev, prefill, mm, log, torch_moe)
    # Kernel tables and launch counts last, after every timing: with them first, session 22's run 55 read the batch-1
    # graph replay at 2.05 ms wall for 1.78 ms of device time (probe_ds_prefill, no profiler, same call: 1.82 ms);
    # with them last, run 62's wall sat 0.03 ms above the device time.
    out["kernels_b1"] = _kernel_table(_eager_decode_step(lean, caches, bs, blocks_per, ctx), "batch-1 eager step", log)
    out["launches_b1"] = step_launches(model, log)  # the module path's, per layer (torch.profiler too)
    return out


def prefill_row(model, dev, prefill: int = 2048, mm=None, log=print, torch_moe: bool = True,
                kernels: bool = True) -> dict:
    """One ``prefill``-token serving prefill (every token through the layers, the last token's logits): eager wall
    (and with the torch MoE unless ``torch_moe`` is False), device time behind a spin, graph-replayed, the weight
    GEMMs' FLOPs as % of the matmul rate ``mm``; ``kernels``: its torch.profiler kernel table too."""
    from torchinferno.models.common.attention_metadata import build_attention_metadata, positions_for
    from torchinferno.models.common.moe import set_moe_backend

    cfg, bs = model.config, 16
    spec = model.family.kv_spec(cfg)
    ids = torch.randint(0, cfg.vocab_size, (prefill,), device=dev)
    pos = positions_for([prefill], [0]).to(dev)
    pcaches = spec.allocate(-(-prefill // bs) + 1, bs, torch.bfloat16, dev)
    meta = build_attention_metadata([prefill], [0], [list(range(1, 1 + -(-prefill // bs)))], bs, device=dev)

    def run():  # a serving prefill: every token through the layers, logits of the last one only
        with torch.no_grad():
            return model.compute_logits(model(ids, pos, pcaches, meta)[-1:])

    row = {"tokens": prefill}
    row["torch_ms"] = None
    for backend in ("auto", "torch") if torch_moe else ("auto",):
        set_moe_backend(model, backend)
        row[f"{'fused' if backend == 'auto' else 'torch'}_ms"] = cuda_time_ms(run, iters=3, warmup=1)
    set_moe_backend(model, "auto")
    # the same forward queued behind a 40 ms spin: its device time without the host's issue time (an eager
    # 2048-token forward issues for ~20-30 ms on the H100 hosts), so wall vs device says which one bounds it
    row["fused_device_ms"] = device_time_ms(run, iters=3, warmup=0, hold_us=40_000.0)
    # the same forward replayed from a CUDA graph (no issue time at all); a failed capture means the prefill
    # syncs with the host somewhere, and is reported as such
    try:
        row["fused_graph_ms"] = graph_time_ms(run, calls=2, iters=3, fallback=False)
    except Exception as e:  # noqa: BLE001 - reported beside the eager figures
        row["fused_graph_ms"], row["graph_error"] = None, f"{type(e).__name__}: {str(e)[:200]}"
    active_params = active_weights(model, [cfg.num_experts_per_tok] * _n_moe(model))[1]
    # the weight GEMMs (attention's score FLOPs left out); the LM head (in active_params when untied) for the
    # last token only, as run() applies it (counting it for all 2048 tokens overstated runs <= 54 by ~16%)
    head = cfg.vocab_size * cfg.hidden_size
    flops = 2 * (prefill * (active_params - (head if model.lm_head is not None else 0)) + head)
    row["flops_weights"] = flops
    if mm:
        row["pct_of_matmul_rate"] = 100 * flops / mm / (row["fused_ms"] * 1e-3)
        if row["fused_graph_ms"]:
            row["graph_pct_of_matmul_rate"] = 100 * flops / mm / (row["fused_graph_ms"] * 1e-3)
    graph = (f"graph-replayed {row['fused_graph_ms']:.1f} ms ({row.get('graph_pct_of_matmul_rate', 0):.0f}%)"
             if row["fused_graph_ms"] else f"graph capture failed ({row['graph_error']})")
    log(f"  model prefill {prefill}: fused MoE {row['fused_ms']:.1f} ms (device {row['fused_device_ms']:.1f}; "
        f"{graph})  torch MoE {_ms(row['torch_ms'], 1)}  "
        f"weight-GEMM FLOPs at {row.get('pct_of_matmul_rate', 0):.0f}% of the sustained bf16 matmul rate (eager)")
    if kernels:
        row["kernels"] = _kernel_table(run, f"prefill {prefill}", log)
    return row


def _ms(v: float | None, digits: int = 2) -> str:
    return "skipped" if v is None else f"{v:8.{digits}f} ms"


def _kernel_table(fn, label: str, log=print) -> dict:
    """Device time per kernel of one ``fn()`` (torch.profiler; ``gpu_timing.profile_kernels``), logged as the top
    kernels: where the time goes, for the next fusion."""
    from torchinferno.bench.gpu_timing import _fmt_profile, profile_kernels

    try:
        p = profile_kernels(fn, warmup=1)
    except Exception as e:  # noqa: BLE001 - a diagnostic; report why it is missing
        log(f"  {label} kernel profile skipped: {type(e).__name__}: {e}")
        return {"error": f"{type(e).__name__}: {e}"}
    log(f"  {label} {_fmt_profile(p)}")
    log("    top: " + "; ".join(f"{n[:60]} {ms:.3f}" for n, ms in p["top"].items()))
    return p


def _b1_inputs(dev, bs: int, blocks_per: int, ctx: int):
    """(ids [1], positions [1], metadata) of one decode token at position ``ctx`` over the first sequence's blocks."""
    from torchinferno.models.common.attention_metadata import build_attention_metadata

    meta = build_attention_metadata([1], [ctx], [list(range(1, 1 + blocks_per))], bs, device=dev)
    return torch.zeros(1, dtype=torch.long, device=dev), torch.full((1,), ctx, device=dev), meta


def _eager_decode_step(model, caches, bs: int, blocks_per: int, ctx: int):
    """A function running one eager batch-1 decode step (model forward + head) over the first sequence's blocks."""
    ids, pos, meta = _b1_inputs(next(model.parameters()).device, bs, blocks_per, ctx)

    def step():
        with torch.no_grad():
            return model.compute_logits(model(ids, pos, caches, meta))

    return step


def step_launches(model, log=print) -> dict:
    """Kernel launches of one eager batch-1 decode step, per layer (``bench.launch_count``, torch.profiler)."""
    from torchinferno.bench.launch_count import decode_step_launches, summary

    try:
        s = summary(decode_step_launches(model, batch=1, ctx=128, cuda_profiler=True))
    except Exception as e:  # noqa: BLE001 - a diagnostic; report why it is missing
        log(f"  launch count skipped: {type(e).__name__}: {e}")
        return {"error": f"{type(e).__name__}: {e}"}
    per = {k: v for k, v in s["per_layer"].items() if k != "kernels"}
    last = max((k for k in per if k.startswith("layer")), key=lambda k: int(k[5:]), default=None)
    log(f"  batch-1 eager step: {s['per_layer'].get('kernels', 0)} device kernels, launches per layer "
        f"{sorted({v for k, v in per.items() if k.startswith('layer')})}; {last}: {s['ops'].get(last)}")
    return s


def _n_moe(model) -> int:
    return sum(1 for n, _ in model.named_modules() if n.endswith("mlp.gate"))


def hf_peer(model):
    """transformers' eager ``DeepseekV3ForCausalLM`` whose parameters are our tensors (no copy)."""
    import transformers

    fam = model.family
    dev = next(model.parameters()).device
    d = fam.config_to_hf(model.config)
    hf_cfg = transformers.DeepseekV3Config(**{k: v for k, v in d.items() if k not in ("architectures", "model_type")})
    hf_cfg._attn_implementation = "eager"
    hf_cfg._experts_implementation = "eager"
    with torch.device("meta"):
        hf = transformers.DeepseekV3ForCausalLM(hf_cfg)
    # transformers keeps routed experts fused in memory ([E, 2I, D] / [E, D, I], our layout): pass ours as they are
    state = {n: t for n, t in fam.export_weights(model) if not re.search(r"\.experts\.\d+\.", n)}
    state.update({n: t.detach() for n, t in model.state_dict().items() if re.search(r"\.experts\.(gate_up|down)_proj$", n)})
    hf.load_state_dict(state, strict=True, assign=True)
    hf.model.rotary_emb = type(hf.model.rotary_emb)(config=hf_cfg).to(dev)
    left = [n for n, t in list(hf.named_parameters()) + list(hf.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"transformers peer has unmaterialized tensors: {left[:4]}")
    return hf.eval()


def hf_rows(model, batches=(1, 64), ctx: int = 128, new_tokens: int = 8, log=print) -> list[dict]:
    """transformers eager generate step time per batch, on our tensors."""
    from torchinferno.bench.gpu_peers import hf_decode_tok_s

    hf = hf_peer(model)
    rows = []
    for B in batches:
        r = hf_decode_tok_s(hf, B, ctx, new_tokens, model.config.vocab_size, repeats=1)
        log(f"  transformers eager B={B:4d}: {r['step_ms']:8.2f} ms/step ({r['tok_s']:8.0f} tok/s)")
        rows.append(r)
    del hf
    return rows


def run_bench_moe(sections=("layer", "model"), batches=(1, 8, 64, 256), prefill: int = 2048, hf: bool = True,
                  layers: int | None = None, layer_shapes=("v2-lite", "v3"), log=print,
                  layer_batches: tuple[int, ...] | None = None, model_shape: str = "v2-lite",
                  quantization: str = "none") -> dict:
    """``layer_batches``: token counts of the layer section (default: ``batches``); ``model_shape``: the model
    section's :data:`MODEL_SHAPES` entry (:func:`build_model_shape`); ``quantization``: the model section's weights,
    ``none`` (bf16) or ``fp8-block`` (built layer by layer; the transformers peer and the torch MoE reference, a
    per-128-group loop over every hit expert, are skipped: bf16-only / minutes at this size)."""
    dev = torch.device("cuda")
    t0 = time.perf_counter()
    bw = copy_bandwidth(dev)
    mm = sustained_matmul_rate(dev)
    log(f"ceilings: copy bandwidth {bw / 1e9:.0f} GB/s, sustained bf16 matmul {mm / 1e12:.0f} TFLOP/s")
    rep: dict = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "copy_bw": bw, "matmul": mm}
    if "layer" in sections:
        rep["layer"] = {}
        for name in layer_shapes:
            E, k, D, inter, shared, G, TG = LAYER_SHAPES[name]
            log(f"MoE layer {name} (E={E} top-{k}, D={D}, I={inter}, {shared} shared, groups {TG}/{G}; bf16):")
            rep["layer"][name] = layer_rows(dev, E, k, D, inter, shared, layer_batches or batches, prefill, bw, mm, log,
                                            G, TG)
            torch.cuda.empty_cache()
    if "model" in sections:
        torch.cuda.empty_cache()
        t1 = time.perf_counter()
        model = build_model_shape(dev, model_shape, layers, quantization)
        torch.cuda.synchronize(dev)
        build_s = time.perf_counter() - t1
        n = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
        nbytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
        log(f"{model_shape} model ({model.config.num_hidden_layers} layers, {quantization}): {n / 1e9:.2f} B weights, "
            f"{nbytes / 1e9:.1f} GB, built in {build_s:.1f} s ({time.perf_counter() - t0:.0f} s so far)")
        rep["model_shape"], rep["quantization"] = model_shape, quantization
        rep["build"] = {"seconds": build_s, "weights": n, "bytes": nbytes,
                        "allocated": torch.cuda.memory_allocated(dev)}
        stats = getattr(model, "fp8_block_build", None)
        if stats is not None:
            rep["build"]["stream"] = stats.summary()
            log(f"  layer-by-layer build: peak {(stats.cuda_peak_bytes or 0) / 1e9:.1f} GB allocated (model "
                f"{rep['build']['allocated'] / 1e9:.1f} GB, largest layer in bf16 {stats.max_piece_bytes / 1e9:.1f} "
                f"GB, whole model in bf16 {stats.total_piece_bytes / 1e9:.1f} GB), {len(stats.swapped)} modules "
                "swapped")
        fp8 = quantization != "none"
        if fp8:
            log("  torch MoE reference and transformers peer skipped (fp8-block: the reference loops per 128-group "
                "over every hit expert; transformers runs bf16 only)")
        rep["model"] = model_rows(model, dev, batches=batches, prefill=prefill, bw=bw, mm=mm, log=log,
                                  torch_moe=not fp8)
        if hf and not fp8:
            try:
                rep["hf"] = hf_rows(model, batches=tuple(b for b in batches if b in (1, 8, 64)), log=log)
            except Exception as e:  # noqa: BLE001 - the peer is optional; report why it is missing
                log(f"  transformers peer skipped: {type(e).__name__}: {e}")
                rep["hf_error"] = f"{type(e).__name__}: {e}"
    rep["wall_s"] = time.perf_counter() - t0
    return rep


