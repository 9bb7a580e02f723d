"""The flags of ``bench-serve`` and the ``ServeBenchConfig`` they make (used by the CLI and by the suites, which
plan ``bench-serve`` command lines and run them in process)."""

from __future__ import annotations

import argparse
import math

__all__ = ["add_bench_serve_args", "add_serve_client_args", "bench_serve_parser", "rate", "serve_config_from_args"]


def rate(v: str) -> float:
    try:
        r = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid rate {v!r} (a number of requests/s, or inf)") from None
    if not r > 0:
        raise argparse.ArgumentTypeError(f"rate must be > 0 or inf, got {v}")
    return r


def add_serve_client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model name as served (default: the first of GET /v1/models)")
    p.add_argument("--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"])
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", type=rate, default=math.inf, help="requests/s (Poisson/gamma arrivals) or inf (all at t=0)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps; 1 = Poisson, <1 burstier, >1 more uniform")
    p.add_argument("--max-concurrency", type=int, default=None, help="cap on requests in flight")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=128, help="max_tokens per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos so every request generates --output-len tokens")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--num-warmups", type=int, default=0, help="untimed requests before the run")
    p.add_argument("--metric-percentiles", default="50,90,99", help="percentiles to report (default 50,90,99)")
    p.add_argument("--prompt-format", default="auto", choices=["auto", "tokens", "text"],
                   help="auto: token-id prompts for /v1/completions, text for chat")
    p.add_argument("--api-key", default=None)
    p.add_argument("--label", default=None)
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--http-client", default="auto", choices=["auto", "aiohttp", "httpx"],
                   help="library for the timed streams: auto = aiohttp when installed (as vllm bench serve; "
                        "httpx saturates its core at a few thousand chunks/s), else httpx")


def add_bench_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    add_serve_client_args(p)
    p.add_argument("--result-dir", default=None)
    p.add_argument("--result-filename", default=None)
    p.add_argument("--json-output", default=None, help="write the result JSON here (overrides --result-dir/--result-filename)")


def bench_serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torchinferno bench-serve")
    add_bench_serve_args(p)
    return p


def serve_config_from_args(a, base_url: str):
    from torchinferno.bench.serve_client import ServeBenchConfig
    from torchinferno.bench.stats import parse_percentiles
    from torchinferno.errors import ConfigError

    try:
        pcts = parse_percentiles(a.metric_percentiles)
    except ValueError as e:
        raise ConfigError(f"--metric-percentiles: {e}") from None
    return ServeBenchConfig(
        base_url=base_url, num_prompts=a.num_prompts, input_len=a.input_len, output_len=a.output_len, model=a.model,
        endpoint=a.endpoint, request_rate=a.request_rate, burstiness=a.burstiness, max_concurrency=a.max_concurrency,
        seed=a.seed, ignore_eos=a.ignore_eos, temperature=a.temperature, num_warmups=a.num_warmups, percentiles=pcts,
        api_key=a.api_key, label=a.label, disable_tqdm=a.disable_tqdm, prompt_format=a.prompt_format,
        http_client=a.http_client,
    ).validate()
