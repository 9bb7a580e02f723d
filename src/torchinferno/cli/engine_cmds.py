"""Serving-engine commands: ``serve-smoke``."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve-smoke", help="N concurrent requests through the engine; greedy outputs must equal plain generation")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", default=None, help="registry name, HF dir, .gguf file or hub id (default: a tiny random model)")
    src.add_argument("--model-kind", default=None, help="family of the tiny random model (default: llama3)")
    p.add_argument("--size", default="debug", help="named size of the random model (default: debug)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--num-requests", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--kv-cache-memory", default=None, help="KV pool bytes, e.g. 64MiB (default: sized for the requests)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--cache-backend", default="paged", choices=["paged", "dense"],
                   help="paged: block pool with prefix reuse; dense: one max-length block per sequence (no prefix reuse)")
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="KV cache storage: auto (the model's dtype), bfloat16, float16, float32, fp8 / fp8_e4m3 "
                        "(float8_e4m3fn, unscaled: half the bytes per decode step; GQA families) or fp8_e5m2")
    p.add_argument("--enforce-eager", action="store_true",
                   help="never replay decode steps from CUDA graphs (default: graphs on CUDA when the attention backend allows)")
    p.add_argument("--async-scheduling", action="store_true",
                   help="schedule and launch step k+1 before step k's tokens reach the host (overlaps host work "
                        "with the device; same outputs)")
    p.set_defaults(func=cmd_serve_smoke)


def _random_model(kind: str, size: str, device: str, dtype, seed: int):
    """A tiny random model built with the attention backend a checkpoint would get on ``device``."""
    from torchinferno.checkpoint.auto import default_attention_backend
    from torchinferno.models.registry import get_family
    from torchinferno.testing import tiny_model

    fam = get_family(kind)
    backend = default_attention_backend(fam, fam.size(size), device)
    return tiny_model(kind, size, seed=seed, dtype=dtype, device=device, attention_backend=backend)


def _prompts(n: int, vocab: int, block_size: int, max_len: int, seed: int) -> list[list[int]]:
    """Ragged prompts; every other one starts with a shared two-block prefix (exercises reuse)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    hi = max(3, min(vocab, 1000))
    shared = torch.randint(0, hi, (2 * block_size,), generator=g).tolist()
    out = []
    for i in range(n):
        length = int(torch.randint(1, max(2, max_len), (1,), generator=g))
        own = torch.randint(0, hi, (length,), generator=g).tolist()
        out.append((shared + own)[:max_len] if i % 2 else own)
    return out


def cmd_serve_smoke(a) -> int:
    import time

    from torchinferno.checkpoint.auto import resolve_dtype
    from torchinferno.cli.common import check_device
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.config import EngineConfig
    from torchinferno.engine.generate import StaticGenerator
    from torchinferno.engine.llm_engine import LLMEngine
    from torchinferno.errors import ConfigError

    check_device(a.device)
    if a.num_requests < 1 or a.max_tokens < 1:
        raise ConfigError("--num-requests and --max-tokens must be >= 1")
    dtype = resolve_dtype(a.dtype)
    if a.model:
        from torchinferno.checkpoint.auto import load_model_auto

        model = load_model_auto(a.model, device=a.device, dtype=dtype, cache_dir=a.cache_dir)
        name = a.model
    else:
        from torchinferno.cli.common import tiny_kind_family

        kind = tiny_kind_family(a.model_kind) if a.model_kind else "llama3"
        model = _random_model(kind, a.size, a.device, dtype, a.seed)
        name = f"random {kind}:{a.size}"
    ctx = getattr(model.config, "max_position_embeddings", 2048)
    max_prompt = max(2, min(96, ctx - a.max_tokens))
    prompts = _prompts(a.num_requests, model.config.vocab_size, a.block_size, max_prompt, a.seed)
    params = SamplingParams(max_tokens=a.max_tokens, temperature=0.0, ignore_eos=True)

    ref_gen = StaticGenerator(model, len(prompts), max(len(p) for p in prompts) + a.max_tokens)
    ref = [r.token_ids for r in ref_gen.generate(prompts, params)]

    max_len = max(len(p) for p in prompts) + a.max_tokens
    dense = a.cache_backend == "dense"  # the paged layout with one max-length block per sequence
    block = max_len if dense else a.block_size
    cfg = EngineConfig(block_size=block, kv_cache_memory=a.kv_cache_memory,
                       max_num_batched_tokens=a.max_num_batched_tokens, max_num_seqs=a.max_num_seqs,
                       enforce_eager=a.enforce_eager, async_scheduling=a.async_scheduling, kv_cache_dtype=a.kv_cache_dtype,
                       max_model_len=max_len, enable_prefix_caching=not dense)
    if a.kv_cache_memory is None:
        per_req = -(-cfg.max_model_len // block)
        cfg.num_gpu_blocks = per_req * len(prompts)
    engine = LLMEngine(model, None, cfg)
    t0 = time.perf_counter()
    # Staggered arrivals: one request joins per step, so batches grow and shrink every step and
    # later requests can reuse the shared prefix cached by earlier ones.
    final = {}
    for i, p in enumerate(prompts):
        engine.add_request(f"smoke-{i}", p, params)
        final.update({o.request_id: o for o in engine.step() if o.finished})
    final.update(engine.run_to_completion())
    wall = time.perf_counter() - t0
    got = [final[f"smoke-{i}"].token_ids for i in range(len(prompts))]
    bad = [i for i, (x, y) in enumerate(zip(got, ref)) if x != y]
    s = engine.stats()
    verdict = "OK" if not bad else "MISMATCH"
    print(f"serve-smoke {verdict}: {len(prompts) - len(bad)}/{len(prompts)} requests equal plain generation "
          f"({name}, {a.device}, {s.num_forward_calls} forwards, max batch {s.max_batch_seqs} seqs/{s.max_batch_tokens} tokens, "
          f"graph steps {s.num_graph_steps}, preemptions {s.num_preemptions}, prefix hits {s.prefix_hits}/{s.prefix_queries} tokens, "
          f"{s.num_generated_tokens / wall:.1f} tok/s, {a.cache_backend} cache, {engine.describe()})"
          + (f"; mismatched requests: {bad}" if bad else ""))
    return 0 if not bad else 1
