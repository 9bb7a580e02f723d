"""Build a model + tokenizer + engine + app from CLI flags, and run uvicorn."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from torchinferno.cli.common import TINY_MODEL, add_quantization_arg, tiny_kind_family
from torchinferno.errors import ConfigError

DEFAULT_MODEL = "smollm2-135m-instruct"


def add_server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_pos", nargs="?", default=None, metavar="MODEL",
                   help=f"registry name, HF dir, .gguf or hub id (default: {DEFAULT_MODEL})")
    p.add_argument("--model", default=None, help=f"same as MODEL; '{TINY_MODEL}' = a tiny random model of --model-kind's family")
    p.add_argument("--model-kind", default=None,
                   help="family (llama3, deepseek, dsv4, ... or the tiny-llama / tiny-deepseek / tiny-dsv4 spellings): "
                        "without MODEL (or with --model tiny) serve a tiny random model of it; with a checkpoint, "
                        "check that the checkpoint is of this family")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--tokenizer", default=None, help="byte | PATH (default: the checkpoint's tokenizer.json, else byte)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--cache-backend", default="paged", choices=["paged", "dense"],
                   help="paged: block pool with prefix reuse; dense: one max-length block per sequence")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-cache-memory", default=None, help="KV pool size, e.g. 512MiB (default: sized for max-num-seqs)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="KV cache storage: auto (the model's dtype), bfloat16, float16, float32, fp8 / fp8_e4m3 "
                        "(float8_e4m3fn, unscaled: half the bytes per decode step; GQA families) or fp8_e5m2")
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--enforce-eager", action="store_true",
                   help="never replay decode steps from CUDA graphs (default: graphs on CUDA when the attention backend allows)")
    p.add_argument("--async-scheduling", action="store_true",
                   help="schedule and launch step k+1 before step k's tokens reach the host (overlaps host work "
                        "with the device; same outputs)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--llama-parallelism", default=None, choices=["pipeline", "tensor"],
                   help="how a multi-device model is split; one device (the only size supported yet) runs unsplit either way")
    p.add_argument("--single-request-admission-wait-ms", type=float, default=None, metavar="MS",
                   help="accepted for the original's command lines; no effect: the scheduler admits waiting requests "
                        "at every step, never waiting for a batch to fill (what 0 asks for)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="accepted for vLLM-style command lines; harmless: TorchInferno never runs code shipped with a "
                        "checkpoint (models are built from our own family code)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--log-level", default="warning")
    p.add_argument("--no-prepack", action="store_true", help="do not pre-pack CPU bf16 weights (for the CPU GEMV kernel)")
    add_quantization_arg(p)


def build(args: argparse.Namespace):
    """-> (app, ServerConfig, AsyncEngine)."""
    from torchinferno.cli.common import check_device
    from torchinferno.engine.async_engine import AsyncEngine
    from torchinferno.engine.config import EngineConfig
    from torchinferno.engine.llm_engine import LLMEngine
    from torchinferno.server.app import ServerConfig, create_app
    from torchinferno.text.tokenizer import load_tokenizer

    if args.tensor_parallel_size != 1:
        raise ConfigError("--tensor-parallel-size > 1 is not supported yet (valid: 1)")
    check_device(args.device)
    if args.single_request_admission_wait_ms:  # 0 is what we do anyway
        print(f"note: --single-request-admission-wait-ms {args.single_request_admission_wait_ms:g} has no effect: "
              "the scheduler admits waiting requests at every step", file=sys.stderr, flush=True)
    model_spec = args.model or args.model_pos
    tiny_family = _tiny_family(model_spec, args.model_kind)
    if tiny_family is not None:
        from torchinferno.checkpoint.auto import default_attention_backend, resolve_dtype
        from torchinferno.models.registry import get_family
        from torchinferno.testing import tiny_model

        fam = get_family(tiny_family)
        backend = default_attention_backend(fam, fam.size("debug"), args.device)
        model = tiny_model(tiny_family, dtype=resolve_dtype(args.dtype), device=args.device, attention_backend=backend)
        kind = args.model_kind or tiny_family
        default_name = TINY_MODEL if model_spec == TINY_MODEL else kind if kind.startswith("tiny-") else f"tiny-{kind}"
        root, name, tok_spec = f"random:{tiny_family}", args.served_model_name or default_name, args.tokenizer or "byte"
    else:
        from torchinferno.checkpoint.auto import load_model_auto

        model_spec = model_spec or DEFAULT_MODEL
        model = load_model_auto(model_spec, device=args.device, dtype=args.dtype, cache_dir=args.cache_dir)
        if args.model_kind and tiny_kind_family(args.model_kind) != model.family.name:
            raise ConfigError(f"--model-kind {args.model_kind} does not match {model_spec}, a {model.family.name} "
                              "checkpoint (leave --model-kind out to take the family from config.json)")
        root = str(model.checkpoint_dir)
        name = args.served_model_name or model_spec
        tok_spec = args.tokenizer or (root if (Path(root) / "tokenizer.json").exists() else "byte")
    from torchinferno.kernels.fp8_linear import quantize_model

    quantize_model(model, args.quantization)
    if not args.no_prepack:
        from torchinferno.kernels.cpu_linear import prepack_linears

        prepack_linears(model)  # no-op unless bf16 weights on a CPU with oneDNN bf16
    tokenizer = load_tokenizer(tok_spec)
    max_len = args.max_model_len or min(model.config.max_position_embeddings, 4096)
    block = max_len if args.cache_backend == "dense" else args.block_size
    cfg = EngineConfig(block_size=block, kv_cache_memory=args.kv_cache_memory, max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=max_len,
                       enable_prefix_caching=not args.no_prefix_caching and args.cache_backend == "paged",
                       enforce_eager=args.enforce_eager, async_scheduling=args.async_scheduling,
                       kv_cache_dtype=args.kv_cache_dtype)
    engine = LLMEngine(model, tokenizer, cfg)
    if engine.device.type == "cuda":  # kernel compiles at startup, not in the first requests' latency
        w = engine.warmup()
        print(f"warmed up in {w.seconds:.1f} s ({w.requests} throwaway requests of {w.prompt_len} tokens)", flush=True)
    async_engine = AsyncEngine(engine)
    scfg = ServerConfig(model_name=name, root=root, max_model_len=engine.config.max_model_len or max_len, api_key=args.api_key)
    return create_app(async_engine, tokenizer, scfg), scfg, async_engine


def _tiny_family(model_spec: str | None, model_kind: str | None) -> str | None:
    """The family of the tiny random model to serve, or None to load the checkpoint ``model_spec``.

    ``--model-kind K`` alone or with ``--model tiny`` -> K's family; ``--model tiny`` alone -> llama3;
    a ``tiny-*`` kind next to a real checkpoint is a contradiction (error)."""
    if model_spec == TINY_MODEL:
        return tiny_kind_family(model_kind) if model_kind else "llama3"
    if model_spec is None and model_kind:
        return tiny_kind_family(model_kind)
    if model_kind and model_kind.startswith("tiny-"):
        raise ConfigError(f"--model-kind {model_kind} is a tiny random model, but a checkpoint was given ({model_spec}); "
                          f"use --model {TINY_MODEL} for the random model")
    return None


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    app, cfg, engine = build(args)
    print(f"serving '{cfg.model_name}' on http://{args.host}:{args.port} (max_model_len {cfg.max_model_len})", flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        engine.shutdown()
    return 0
