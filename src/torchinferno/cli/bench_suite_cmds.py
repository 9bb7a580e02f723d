"""Serving benchmarks: ``bench-serve``, ``vllm-bench-suite``, ``vllm-bench-plot``, ``llama-bench-suite``,
``openai-microbench``, ``openai-server-microbench``.

Thin: each command parses flags into a config and calls into ``torchinferno.bench``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from torchinferno.bench.serve_args import add_bench_serve_args, rate as _rate, serve_config_from_args
from torchinferno.bench.suite_common import DEFAULT_SUITE_MODEL, DEFAULT_SUITE_TP


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-serve", help="online serving benchmark against an OpenAI server (vllm bench serve compatible JSON)")
    add_bench_serve_args(p)
    p.set_defaults(func=cmd_bench_serve)
    _register_suites(sub)
    _register_microbenches(sub)


def cmd_bench_serve(a) -> int:
    from torchinferno.bench.serve_client import format_serve_result, result_path, run_serve_bench

    cfg = serve_config_from_args(a, a.base_url)
    if a.result_dir and not a.json_output:
        Path(a.result_dir).mkdir(parents=True, exist_ok=True)
    res = run_serve_bench(cfg)
    print(format_serve_result(res))
    path = result_path(cfg, res, a.result_dir, a.result_filename, a.json_output)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=2))
        print(f"wrote {path}")
    return 0 if res["completed"] == res["num_prompts"] else 1


# ---------------------------------------------------------------------------------- suites
def _conc(v: str):
    if v.lower() in ("none", "unlimited"):
        return None
    try:
        c = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid concurrency {v!r} (an integer >= 1, or none)") from None
    if c < 1:
        raise argparse.ArgumentTypeError(f"concurrency must be >= 1, got {c}")
    return c


def _add_suite_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="suite directory (plan, results, report)")
    p.add_argument("--run", action="store_true", help="execute the plan (default: only write commands.json)")
    p.add_argument("--benchmarks", nargs="+", default=["latency", "throughput", "serve"],
                   choices=["latency", "throughput", "serve"])
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8, help="latency benchmark batch")
    p.add_argument("--num-prompts", type=int, default=100, help="throughput and serve prompts")
    p.add_argument("--request-rate", type=_rate, nargs="+", default=[math.inf], help="one serve run per rate (x concurrency)")
    p.add_argument("--max-concurrency", type=_conc, nargs="+", default=[None], help="one serve run per value (none = uncapped)")
    p.add_argument("--base-url", default=None, help="benchmark this running server instead of starting one")
    p.add_argument("--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"])
    p.add_argument("--num-iters", type=int, default=10)
    p.add_argument("--num-iters-warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-ignore-eos", action="store_true", help="let serve requests stop at EOS")


def _suite_kwargs(a) -> dict:
    return dict(out_dir=a.dir, benchmarks=list(dict.fromkeys(a.benchmarks)), input_len=a.input_len,
                output_len=a.output_len, batch_size=a.batch_size, num_prompts=a.num_prompts,
                request_rates=list(dict.fromkeys(a.request_rate)), max_concurrency=list(dict.fromkeys(a.max_concurrency)),
                num_iters=a.num_iters, num_iters_warmup=a.num_iters_warmup, seed=a.seed, base_url=a.base_url,
                endpoint=a.endpoint, ignore_eos=not a.no_ignore_eos)


def _register_suites(sub) -> None:
    p = sub.add_parser("vllm-bench-suite", help="plan (and with --run, run) vllm bench latency/throughput/serve")
    _add_suite_args(p)
    p.add_argument("--model", default=DEFAULT_SUITE_MODEL, help=f"HF id or path, as vLLM takes it (default: {DEFAULT_SUITE_MODEL})")
    p.add_argument("--tensor-parallel-size", type=int, default=DEFAULT_SUITE_TP, help=f"default: {DEFAULT_SUITE_TP}")
    p.add_argument("--port", type=int, default=8000, help="port of the planned `vllm serve` (without --base-url)")
    p.add_argument("--vllm-executable", default=None, help="vllm executable (default: `vllm` on PATH)")
    p.set_defaults(func=cmd_vllm_suite)

    p = sub.add_parser("vllm-bench-plot", help="rebuild summary.json / performance.csv / performance.html from result JSON")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="one or more result directories (plotted together)")
    p.add_argument("--output-dir", default=None, help="where to write the report (default: the first DIR)")
    p.add_argument("--title", default="Benchmark report")
    p.set_defaults(func=cmd_vllm_plot)

    p = sub.add_parser("llama-bench-suite", help="vLLM-shaped latency/throughput/serve benchmarks on TorchInferno's engine")
    _add_suite_args(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--model", default=None,
                   help=f"registry name, HF dir, .gguf or hub id (default: {DEFAULT_SUITE_MODEL} on "
                        f"cuda:0..cuda:{DEFAULT_SUITE_TP - 1}, the README's plan; planning needs no weights)")
    g.add_argument("--model-kind", default=None, help="a tiny random model of this family (e.g. llama3)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--devices", nargs="+", default=None,
                   help=f"devices, more than one = parallel run (default: {DEFAULT_SUITE_TP} CUDA devices for the "
                        "default model, else cpu)")
    p.add_argument("--parallelism", default="tensor", choices=["pipeline", "tensor"])
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.set_defaults(func=cmd_llama_suite)


def cmd_vllm_suite(a) -> int:
    from torchinferno.bench.suite_common import SuiteConfig
    from torchinferno.bench.vllm_suite import vllm_suite

    cfg = SuiteConfig(model=a.model, tensor_parallel_size=a.tensor_parallel_size, **_suite_kwargs(a))
    return vllm_suite(cfg, a.run, a.port, a.vllm_executable)


def cmd_vllm_plot(a) -> int:
    from torchinferno.bench.report import console_table, write_report
    from torchinferno.bench.results import load_results

    results = load_results(a.dirs)
    out = Path(a.output_dir or a.dirs[0])
    status = None
    st_path = Path(a.dirs[0]) / "run_status.json"
    if st_path.is_file():
        try:
            status = json.loads(st_path.read_text())
        except ValueError:
            status = None
    paths = write_report(out, results, a.title, status if isinstance(status, dict) else None, [str(d) for d in a.dirs])
    print(console_table(results))
    print(f"report: {paths['html']} ({len(results)} result file(s); + {paths['csv'].name}, {paths['summary'].name})")
    return 0


def cmd_llama_suite(a) -> int:
    from torchinferno.bench.native_suite import NativeSuiteConfig, native_suite

    cfg = NativeSuiteConfig(model=a.model, model_kind=a.model_kind, dtype=a.dtype, devices=a.devices,
                            parallelism=a.parallelism, max_num_seqs=a.max_num_seqs, **_suite_kwargs(a))
    return native_suite(cfg, a.run)


# ---------------------------------------------------------------------------------- microbenches
def _register_microbenches(sub) -> None:
    p = sub.add_parser("openai-microbench", help="dispatch/streaming/admission overheads: direct vs batcher vs concurrent")
    p.add_argument("--backend", default="synthetic", choices=["synthetic", "model"])
    p.add_argument("--compare-batcher", action="store_true", help="also force single requests through the async batcher")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompt-mode", default="random", choices=["random", "self-consistency"],
                   help="self-consistency: every request shares one prompt (prefix reuse)")
    p.add_argument("--phase-timings", action="store_true", help="engine phase split: schedule / forward / update / rest")
    p.add_argument("--profile-breakdown", action="store_true", help="sample every thread's stack: time per component")
    p.add_argument("--single-requests", type=int, default=3, help="requests in the single-request cases")
    p.add_argument("--step-ms", type=float, default=2.0, help="synthetic: fixed cost per step")
    p.add_argument("--per-seq-us", type=float, default=30.0, help="synthetic: cost per sequence per step")
    p.add_argument("--prefill-per-token-us", type=float, default=5.0, help="synthetic: cost per prefilled token")
    p.add_argument("--spin", action="store_true", help="synthetic: burn CPU holding the GIL instead of sleeping")
    p.add_argument("--model", default=None, help="model backend: registry name / path (default smollm2-135m-instruct)")
    p.add_argument("--model-kind", default=None, help="model backend: tiny random model of this family")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="model backend: ranks each engine spawns (gloo on CPU, NCCL on CUDA); see --llama-parallelism")
    p.add_argument("--llama-parallelism", default=None, choices=["pipeline", "tensor"],
                   help="how --tensor-parallel-size ranks split the model: every layer (tensor, the default) or "
                        "stages of layers (pipeline)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="accepted for vLLM-style command lines; harmless: checkpoint code is never run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-output", default=None)
    p.set_defaults(func=cmd_openai_microbench)

    p = sub.add_parser("openai-server-microbench", help="sequential streaming + non-streaming requests against one server")
    p.add_argument("--base-url", default=None, help="target this server (default: launch `torchinferno serve` locally)")
    p.add_argument("--model", default=None, help="served model name, or the model to launch")
    p.add_argument("--model-kind", default=None, help="launch a tiny random model of this family")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--api-key", default=None)
    p.add_argument("--json-output", default=None)
    p.set_defaults(func=cmd_openai_server_microbench)


def cmd_openai_microbench(a) -> int:
    from torchinferno.bench.microbench import MicrobenchConfig, run_microbench
    from torchinferno.bench.synthetic_engine import SyntheticCost

    pipeline = a.llama_parallelism == "pipeline"
    cfg = MicrobenchConfig(
        backend=a.backend, concurrency=a.concurrency, prompt_tokens=a.prompt_tokens, max_tokens=a.max_tokens,
        prompt_mode=a.prompt_mode, compare_batcher=a.compare_batcher, phase_timings=a.phase_timings,
        profile_breakdown=a.profile_breakdown, single_requests=a.single_requests, seed=a.seed,
        cost=SyntheticCost(a.step_ms, a.per_seq_us, a.prefill_per_token_us, a.spin),
        model=a.model, model_kind=a.model_kind, dtype=a.dtype, device=a.device,
        tensor_parallel_size=1 if pipeline else a.tensor_parallel_size,
        pipeline_parallel_size=a.tensor_parallel_size if pipeline else 1)
    ranks = "" if a.tensor_parallel_size == 1 else f" ranks={a.tensor_parallel_size} ({a.llama_parallelism or 'tensor'})"
    print(f"openai-microbench: backend={a.backend} concurrency={a.concurrency} prompt={a.prompt_tokens} "
          f"max_tokens={a.max_tokens} prompt-mode={a.prompt_mode}{ranks}")
    out = run_microbench(cfg)
    if "batcher_overhead_ms_per_token" in out:
        print(f"batcher overhead vs direct: {out['batcher_overhead_ms_per_token']:+.3f} ms/token, "
              f"{out['batcher_overhead_ttft_ms']:+.2f} ms TTFT")
    if a.json_output:
        Path(a.json_output).write_text(json.dumps(out, indent=2))
        print(f"wrote {a.json_output}")
    return 0


def cmd_openai_server_microbench(a) -> int:
    from torchinferno.bench.server_microbench import ServerMicrobenchConfig, format_server_microbench, run_server_microbench

    def run(base_url: str, model: str | None) -> dict:
        return run_server_microbench(ServerMicrobenchConfig(base_url=base_url, warmup=a.warmup, iters=a.iters,
                                                            prompt_tokens=a.prompt_tokens, max_tokens=a.max_tokens,
                                                            model=model, api_key=a.api_key))

    if a.base_url:
        out = run(a.base_url, a.model)
    else:
        from torchinferno.bench.local_server import LocalServer, free_port, torchinferno_serve_argv

        port = free_port()
        max_len = a.prompt_tokens + a.max_tokens + 64
        argv = torchinferno_serve_argv(a.model, a.model_kind, port, a.device, a.dtype,
                                       ["--max-model-len", str(max_len), "--max-num-seqs", "4"])
        print("launching: " + " ".join(argv))
        with LocalServer(argv, port) as srv:
            out = run(srv.base_url, None)
        out["launched"] = argv
    print(format_server_microbench(out))
    if a.json_output:
        Path(a.json_output).write_text(json.dumps(out, indent=2))
        print(f"wrote {a.json_output}")
    return 0
