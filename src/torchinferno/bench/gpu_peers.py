"""bench-gpu peers and experiments: transformers generate on the same tensors, logits agreement, GEMV swap."""

from __future__ import annotations

import time

import torch

from torchinferno.bench.gpu_timing import cuda_time_ms, graph_time_ms, profile_kernels, wall_time_ms  # noqa: F401


GEMV_CONFIGS = ({"block_n": 8, "block_k": 512, "num_warps": 4}, {"block_n": 8, "block_k": 1024, "num_warps": 4},
                {"block_n": 16, "block_k": 512, "num_warps": 8}, {"block_n": 4, "block_k": 1024, "num_warps": 4},
                {"block_n": 16, "block_k": 256, "num_warps": 4}, {"block_n": 4, "block_k": 2048, "num_warps": 8},
                {"block_n": 8, "block_k": 512, "num_warps": 4, "num_stages": 5}, {"block_n": 2, "block_k": 4096, "num_warps": 8})


@torch.inference_mode()
def gemv_experiment(model, bench, weight_bytes: int, bw: float, contexts, log=print) -> dict:
    """Batch-1 linears: cuBLAS vs the Triton GEMV (graph-timed per weight shape), then batch-1 decode
    steps with the best GEMV config swapped into the model (the swap is undone before returning)."""
    from torchinferno.kernels.cuda_graphs import CudaGraphDecodeRunner
    from torchinferno.kernels.triton.gemv import gemv, swap_linear_for_gemv

    # Every weight of each shape, timed in model order: one graph replays a call per layer, so
    # each call streams a different matrix from HBM (timing one matrix again and again would
    # measure L2 for the smaller ones).
    by_shape: dict[tuple, list[torch.Tensor]] = {}
    for mod in model.modules():
        if type(mod) is torch.nn.Linear:
            by_shape.setdefault(tuple(mod.weight.shape), []).append(mod.weight)
    rows, totals = [], {"cublas": 0.0}
    for key, ws in by_shape.items():
        count = len(ws)
        w = ws[0]
        x = torch.randn(1, w.shape[1], device=w.device, dtype=w.dtype)

        def over_layers(fn):
            return lambda: [fn(wi) for wi in ws]

        cub = over_layers(lambda wi: torch.nn.functional.linear(x, wi))
        row = {"shape": key, "count": count, "cublas_us": 1e3 * graph_time_ms(cub, calls=1) / count}
        ref = torch.nn.functional.linear(x, w).float()
        totals["cublas"] += row["cublas_us"] * count
        for i, cfg in enumerate(GEMV_CONFIGS):
            err = float((gemv(x, w, None, **cfg).float() - ref).norm() / ref.norm())
            us = 1e3 * graph_time_ms(over_layers(lambda wi, cfg=cfg: gemv(x, wi, None, **cfg)), calls=1) / count
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


def our_logits(model, ids: torch.Tensor, cache_dtype=torch.bfloat16) -> torch.Tensor:
    """``ids [T]`` -> logits ``[T, V]`` (fp32) of one paged prefill through our model."""
    from torchinferno.models.common.attention_metadata import build_attention_metadata

    tokens, dev = ids.shape[0], ids.device
    caches = model.family.kv_spec(model.config).allocate(tokens // 16 + 2, 16, cache_dtype, dev)
    meta = build_attention_metadata([tokens], [0], [list(range(1, tokens // 16 + 2))], 16, dev)
    with torch.inference_mode():
        return model.compute_logits(model(ids, torch.arange(tokens, device=dev), caches, meta)).float()


def logits_agreement(ours: torch.Tensor, theirs: torch.Tensor) -> dict:
    """Relative L2 difference and argmax agreement of two ``[T, V]`` logit tensors."""
    return {"rel_diff": float((ours - theirs).norm() / theirs.norm()),
            "argmax_agreement": float((ours.argmax(-1) == theirs.argmax(-1)).float().mean())}


def hf_agreement(model, hf, tokens: int = 64, cache_dtype=torch.bfloat16) -> dict:
    """Same weights, same prompt: our logits vs transformers'."""
    dev = next(model.parameters()).device
    ids = torch.randint(0, model.config.vocab_size, (tokens,), device=dev)
    ours = our_logits(model, ids, cache_dtype)
    with torch.inference_mode():
        theirs = hf(ids[None]).logits[0].float()
    return logits_agreement(ours, theirs)


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
