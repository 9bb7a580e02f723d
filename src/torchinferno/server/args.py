"""The flags of ``serve`` / ``openai-server`` / ``python -m torchinferno.openai_server`` and what they build.

``add_server_args`` declares them; ``model_spec_from_args`` and ``engine_config_from_args`` turn them into
the typed configs the engine takes (``engine.assembly.ModelSpec``, ``engine.config.EngineConfig``).
"""

from __future__ import annotations

import argparse
import sys

from torchinferno.engine.assembly import DEFAULT_MODEL, QUANTIZATIONS, TINY_MODEL, ModelSpec, tiny_kind_family
from torchinferno.engine.config import MIXED_GRAPH_MODES
from torchinferno.errors import ConfigError
from torchinferno.kernels.cpu_linear import KERNEL_HELP, KERNELS

__all__ = ["add_server_args", "model_spec_from_args", "engine_config_from_args", "served_name", "disagg_config_from_args"]


def add_server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_pos", nargs="?", default=None, metavar="MODEL",
                   help=f"registry name, HF dir, .gguf or hub id (default: {DEFAULT_MODEL})")
    p.add_argument("--model", default=None, help=f"same as MODEL; '{TINY_MODEL}' = a tiny random model of --model-kind's family")
    p.add_argument("--model-kind", default=None,
                   help="family (llama3, deepseek, dsv4, ... or the tiny-llama / tiny-deepseek / tiny-dsv4 spellings): "
                        "without MODEL (or with --model tiny) serve a tiny random model of it; with a checkpoint, "
                        "check that the checkpoint is of this family")
    p.add_argument("--model-size", default="debug",
                   help="named size of the --model-kind random model (e.g. llama3-8b: full-size random weights for "
                        "benchmarks without a checkpoint; default debug)")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--generation-config", default="auto", metavar="auto|vllm|DIR",
                   help="default sampling for fields a request leaves out: auto = the checkpoint's "
                        "generation_config.json (temperature, top_p, top_k, min_p, max_new_tokens), vllm = the API's "
                        "own defaults, DIR = that folder's generation_config.json")
    p.add_argument("--tokenizer", default=None, help="byte | PATH (default: the checkpoint's tokenizer.json, else byte)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16", "auto"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="longest prompt + completion (default: the model's context length, capped by the KV pool)")
    p.add_argument("--cache-backend", default="paged", choices=["paged", "dense"],
                   help="paged: block pool with prefix reuse; dense: one max-length block per sequence")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-cache-memory", default=None,
                   help="KV pool size, e.g. 512MiB (default: on CUDA what --gpu-memory-utilization leaves after weights "
                        "and activations; on CPU max-num-seqs full-length sequences, capped by the RAM available)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of the GPU's memory this server may use (weights + activations + KV pool); default 0.9")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="requests in one step (default: 256 on CUDA, 64 on CPU)")
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="KV cache storage: auto (the model's dtype), bfloat16, float16, float32, fp8 / fp8_e4m3 "
                        "(float8_e4m3fn, unscaled: half the bytes per decode step; GQA families) or fp8_e5m2")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens in one step (default: 8192 on CUDA, 512 on CPU)")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--enforce-eager", action="store_true",
                   help="never replay decode steps from CUDA graphs (default: graphs on CUDA when the attention backend allows)")
    p.add_argument("--cuda-graph-prefill-tokens", type=int, default=512, metavar="N",
                   help="with CUDA graphs, replay the prefill of one fresh prompt of up to N tokens from a per-length "
                        "graph (a small eager prefill is host-bound); 0: eager prefill")
    p.add_argument("--cuda-graph-piecewise-tokens", type=int, default=512, metavar="N",
                   help="with CUDA graphs, run every other step of up to N tokens (decodes mixed with prefill chunks, "
                        "several prompts) as per-token-count graphs around eager attention; 0: such steps eager")
    p.add_argument("--cuda-graph-mixed-mode", choices=MIXED_GRAPH_MODES, default="piecewise",
                   help="how those steps replay: piecewise (attention eager between graphs) or full (one graph per "
                        "token bucket, attention inside it on padded metadata; falls back to piecewise when the "
                        "capture fails). Default: piecewise")
    p.add_argument("--graph-prefill-alone", action=argparse.BooleanOptionalAction, default=True,
                   help="run a lone waiting prompt that a prefill graph replays in a step of its own, the decodes "
                        "waiting one step, rather than in an eager step mixed with them (default: on)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="schedule and launch step k+1 before step k's tokens reach the host (overlaps host work "
                        "with the device; same outputs). Default: on for CUDA, off on CPU")
    p.add_argument("--batch-invariant", action="store_true",
                   help="a request's tokens and logprobs are bitwise the same whatever else is batched with it "
                        "(greedy and seeded; CPU and CUDA; slower; turns off chunked prefill, prefix caching and CUDA graphs)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every route but /health")
    p.add_argument("--max-request-body-bytes", type=int, default=16 * 1024 * 1024, metavar="N",
                   help="larger request bodies get 413 (default 16 MiB)")
    p.add_argument("--max-choices-per-request", type=int, default=256, metavar="N",
                   help="at most N engine requests (prompts x n) from one HTTP request; more get 400 (default 256)")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="N > 1: start N worker processes, each a torch.distributed rank holding 1/N of every layer "
                        "(gloo on CPU, NCCL on CUDA: one device per rank)")
    p.add_argument("--pipeline-parallel-size", type=int, default=1,
                   help="N > 1: start N worker processes, each a stage of consecutive layers (activations sent at "
                        "stage boundaries; no micro-batch overlap yet)")
    p.add_argument("--data-parallel-size", type=int, default=1, metavar="N",
                   help="N > 1: N engine-core processes (each a full replica, tensor-parallel itself with "
                        "--tensor-parallel-size) behind this one API server; --router-policy picks the replica per request")
    p.add_argument("--router-policy", default="cache-aware", choices=["round-robin", "least-loaded", "cache-aware"],
                   help="with --data-parallel-size > 1: round-robin, least-loaded (requests in flight, then KV usage) or "
                        "cache-aware (longest prefix a replica was sent, unless loads are unbalanced; default)")
    p.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "sjf", "priority"],
                   help="order of the waiting queue: fcfs (arrival; default), sjf (shortest prompt first) or priority "
                        "(the request's 'priority' field, lower first; ties by arrival)")
    p.add_argument("--llama-parallelism", default=None, choices=["pipeline", "tensor"],
                   help="how --tensor-parallel-size N devices split the model: tensor (every layer split, the default) "
                        "or pipeline (N stages of layers, as --pipeline-parallel-size N)")
    p.add_argument("--single-request-admission-wait-ms", type=float, default=None, metavar="MS",
                   help="accepted for the original's command lines; no effect: the scheduler admits waiting requests "
                        "at every step, never waiting for a batch to fill (what 0 asks for)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="accepted for vLLM-style command lines; harmless: TorchInferno never runs code shipped with a "
                        "checkpoint (models are built from our own family code)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--log-level", default="warning")
    p.add_argument("--no-prepack", action="store_true", help="do not pre-pack CPU bf16 weights (for the CPU GEMV kernel)")
    p.add_argument("--cpu-gemv", default="auto", choices=list(KERNELS), help=KERNEL_HELP)
    p.add_argument("--quantization", default="none", choices=list(QUANTIZATIONS),
                   help="fp8: FP8-E4M3 weights and per-token activations (W8A8) for every linear but the head")
    p.add_argument("--kernel-artifacts", default=None, metavar="DIR",
                   help="deepseek-v4: load the kernel tiles prepare-deepseek-v4-kernels wrote under DIR (never compiles "
                        "or tunes; a missing / mismatching artifact falls back to torch with one notice line)")
    p.add_argument("--engine-in-process", action="store_true",
                   help="run the engine loop in a thread of the server process instead of its own process "
                        "(debugging and profiling only: HTTP and the engine then share one interpreter)")
    p.add_argument("--step-log", default=None, metavar="FILE",
                   help="write one JSON line per engine step (time, duration, batch shape, queues) to FILE: for "
                        "diagnosing a server and calibrating the simulator")
    p.add_argument("--disaggregation-mode", default="none", choices=["none", "prefill-decode"],
                   help="prefill-decode: a prefill engine core and a decode engine core in two processes; each prompt's "
                        "live KV moves from one to the other over torch.distributed (gloo on CPU, NCCL across GPUs); "
                        "--tensor-parallel-size N runs N ranks per role (rank i's KV shard goes to decode rank i)")
    p.add_argument("--prefill-devices", default=None, metavar="DEV",
                   help="device(s) of the prefill role (default: --device), e.g. cpu, cuda:0, or with "
                        "--tensor-parallel-size N a comma list of N GPUs such as cuda:0,cuda:1,cuda:2,cuda:3")
    p.add_argument("--decode-devices", default=None, metavar="DEV",
                   help="device(s) of the decode role (default: --device), as --prefill-devices; both roles may "
                        "share one GPU")
    p.add_argument("--disaggregation-profile", action="store_true",
                   help="synchronize the device around KV pack / transfer / unpack to time them exactly (profiling "
                        "only: it adds synchronization); the timings go to --disaggregation-record")
    p.add_argument("--disaggregation-record", default=None, metavar="FILE",
                   help="append one disaggregated_runtime_integrity JSON line per completed request to FILE: "
                        "cumulative and per-request KV transfer counts/bytes, role topology, transport")
    p.add_argument("--disaggregation-timeout", type=float, default=60.0, metavar="S",
                   help="a KV transfer (or the roles' rendezvous) that takes longer fails (default 60 s)")
    p.add_argument("--shutdown-grace-period", type=float, default=30.0, metavar="S",
                   help="on SIGTERM: stop admitting, let in-flight requests finish for up to S seconds, then abort the "
                        "rest (finish_reason 'abort') and exit 0")


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


def model_spec_from_args(args: argparse.Namespace) -> ModelSpec:
    """The model to serve; a checkpoint's family is checked against ``--model-kind`` (from config.json only)."""
    if args.tensor_parallel_size < 1:
        raise ConfigError(f"--tensor-parallel-size must be >= 1 (got {args.tensor_parallel_size})")
    if args.llama_parallelism == "pipeline" and args.tensor_parallel_size > 1:  # the original's spelling
        if args.pipeline_parallel_size not in (1, args.tensor_parallel_size):
            raise ConfigError("--llama-parallelism pipeline splits --tensor-parallel-size devices into stages; "
                              "give --pipeline-parallel-size alone instead")
        args.pipeline_parallel_size, args.tensor_parallel_size = args.tensor_parallel_size, 1
    if args.pipeline_parallel_size < 1:
        raise ConfigError(f"--pipeline-parallel-size must be >= 1 (got {args.pipeline_parallel_size})")
    if args.pipeline_parallel_size > 1 and args.tensor_parallel_size > 1:
        raise ConfigError("--tensor-parallel-size and --pipeline-parallel-size together are not supported yet")
    if args.single_request_admission_wait_ms:  # 0 is what we do anyway
        print(f"note: --single-request-admission-wait-ms {args.single_request_admission_wait_ms:g} has no effect: "
              "the scheduler admits waiting requests at every step", file=sys.stderr, flush=True)
    given = args.model or args.model_pos
    common = dict(dtype=args.dtype, device=args.device, quantization=args.quantization, prepack=not args.no_prepack,
                  cache_dir=args.cache_dir, kernel_artifacts=getattr(args, "kernel_artifacts", None),
                  cpu_gemv=getattr(args, "cpu_gemv", "auto"))
    family = _tiny_family(given, args.model_kind)
    if family is not None:
        spec = ModelSpec(model_kind=family, size=args.model_size, **common)
        _check_parallel(spec, args)
        return spec
    spec = ModelSpec(model=given or DEFAULT_MODEL, **common)
    _check_parallel(spec, args)
    if args.model_kind:
        from torchinferno.checkpoint.safetensors_io import read_config
        from torchinferno.models.registry import family_for_hf_config

        actual = family_for_hf_config(read_config(spec.checkpoint_dir())).name
        if tiny_kind_family(args.model_kind) != actual:
            raise ConfigError(f"--model-kind {args.model_kind} does not match {spec.model}, a {actual} "
                              "checkpoint (leave --model-kind out to take the family from config.json)")
    return spec


def _check_parallel(spec: ModelSpec, args: argparse.Namespace) -> None:
    """A world the model cannot be split over is refused here, in one line, before any process starts."""
    if args.pipeline_parallel_size > 1:
        from torchinferno.parallel.checks import check_spec

        check_spec(spec, args.pipeline_parallel_size, "pipeline")
    elif args.tensor_parallel_size > 1:
        from torchinferno.parallel.checks import check_spec

        check_spec(spec, args.tensor_parallel_size)


def served_name(args: argparse.Namespace, spec: ModelSpec) -> str:
    if args.served_model_name:
        return args.served_model_name
    if spec.model_kind is None:
        return spec.model
    given = args.model or args.model_pos
    kind = args.model_kind or spec.model_kind
    return TINY_MODEL if given == TINY_MODEL else kind if kind.startswith("tiny-") else f"tiny-{kind}"


def engine_config_from_args(args: argparse.Namespace, model_max_len: int | None):
    """The engine's config. ``max_model_len`` is passed only when asked for (the engine caps the model's context
    by the KV pool); the dense backend needs a length for its one-block-per-sequence layout."""
    from torchinferno.engine.config import EngineConfig

    max_len = args.max_model_len
    block = args.block_size
    if args.cache_backend == "dense":
        max_len = max_len or min(model_max_len or 4096, 4096)
        block = max_len
    return EngineConfig(block_size=block, kv_cache_memory=args.kv_cache_memory, max_num_seqs=args.max_num_seqs,
                        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=max_len,
                        enable_prefix_caching=not args.no_prefix_caching and args.cache_backend == "paged",
                        enforce_eager=args.enforce_eager, async_scheduling=args.async_scheduling,
                        cuda_graph_prefill_tokens=getattr(args, "cuda_graph_prefill_tokens", 512),
                        graph_prefill_alone=getattr(args, "graph_prefill_alone", True),
                        cuda_graph_piecewise_tokens=getattr(args, "cuda_graph_piecewise_tokens", 512),
                        cuda_graph_mixed_mode=getattr(args, "cuda_graph_mixed_mode", "piecewise"),
                        kv_cache_dtype=args.kv_cache_dtype, gpu_memory_utilization=args.gpu_memory_utilization,
                        batch_invariant=args.batch_invariant, tensor_parallel_size=args.tensor_parallel_size,
                        pipeline_parallel_size=args.pipeline_parallel_size,
                        scheduling_policy=getattr(args, "scheduling_policy", "fcfs"))


def disagg_config_from_args(args: argparse.Namespace):
    """The prefill/decode pair's config, or None without ``--disaggregation-mode prefill-decode``."""
    if getattr(args, "disaggregation_mode", "none") == "none":
        for flag in ("prefill_devices", "decode_devices", "disaggregation_record"):
            if getattr(args, flag, None):
                raise ConfigError(f"--{flag.replace('_', '-')} needs --disaggregation-mode prefill-decode")
        return None
    if args.engine_in_process:
        raise ConfigError("--disaggregation-mode prefill-decode needs engine-core processes (leave out --engine-in-process)")
    if args.pipeline_parallel_size > 1:
        raise ConfigError("--disaggregation-mode prefill-decode: --pipeline-parallel-size is not supported per role "
                          "(--tensor-parallel-size N runs N ranks per role)")
    from torchinferno.disagg.client import DisaggConfig
    from torchinferno.disagg.topology import role_devices

    prefill, decode = args.prefill_devices or args.device, args.decode_devices or args.device
    tp = args.tensor_parallel_size
    if tp > 1 and args.device in ("cuda", "cuda:0") and not (args.prefill_devices or args.decode_devices):
        # The README's eight-GPU topology: --tensor-parallel-size 4 -> prefill on cuda:0-3, decode on cuda:4-7.
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() < 2 * tp:
            raise ConfigError(f"--disaggregation-mode prefill-decode --tensor-parallel-size {tp} needs {2 * tp} GPUs "
                              f"(this host has {torch.cuda.device_count()}; or give --prefill-devices/--decode-devices)")
        prefill = ",".join(f"cuda:{i}" for i in range(tp))
        decode = ",".join(f"cuda:{i}" for i in range(tp, 2 * tp))
    role_devices(prefill, tp, "--prefill-devices")  # one line now, before any process
    role_devices(decode, tp, "--decode-devices")
    return DisaggConfig(prefill_device=prefill, decode_device=decode,
                        timeout_s=args.disaggregation_timeout, profile=args.disaggregation_profile,
                        record_path=args.disaggregation_record)
