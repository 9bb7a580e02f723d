"""The flags ``vllm bench latency|throughput|serve`` and ``vllm serve`` accept, kept as data.

Basis: **vLLM 0.11.x** — ``vllm/benchmarks/latency.py``, ``vllm/benchmarks/throughput.py`` and
``vllm/benchmarks/serve.py`` (their ``add_cli_args``, plus ``vllm/benchmarks/datasets.py``'s
``add_dataset_parser`` for serve) and the subset of ``EngineArgs.add_cli_args`` that a benchmark
plan uses. Only flags that exist across 0.10.x-0.11.x are listed; a newer vLLM accepts more, an
older one may lack e.g. ``--burstiness`` (0.7+) or ``--save-detailed`` (0.8+).

``check_argv`` parses a planned argv with an ``argparse`` parser built from this table, so a
typo, an unknown flag, a flag without its value or a value for a switch fails the plan (and
the tests) instead of failing on the GPU box.
"""

from __future__ import annotations

import argparse

__all__ = ["VLLM_VERSION_BASIS", "FLAGS", "check_argv", "VllmArgvError"]

VLLM_VERSION_BASIS = "vLLM 0.11.x (vllm/benchmarks/{latency,throughput,serve}.py add_cli_args + EngineArgs)"

SWITCH, VALUE, VALUES = "switch", "value", "values"  # store_true / one value / nargs

# EngineArgs.add_cli_args (subset): shared by `bench latency`, `bench throughput` and `serve`.
ENGINE_ARGS: dict[str, str] = {
    "--model": VALUE, "--tokenizer": VALUE, "--revision": VALUE, "--trust-remote-code": SWITCH,
    "--dtype": VALUE, "--seed": VALUE, "--max-model-len": VALUE, "--quantization": VALUE,
    "--load-format": VALUE, "--download-dir": VALUE, "--served-model-name": VALUES,
    "--tensor-parallel-size": VALUE, "--pipeline-parallel-size": VALUE, "--data-parallel-size": VALUE,
    "--distributed-executor-backend": VALUE, "--gpu-memory-utilization": VALUE, "--kv-cache-dtype": VALUE,
    "--block-size": VALUE, "--swap-space": VALUE, "--max-num-seqs": VALUE, "--max-num-batched-tokens": VALUE,
    "--enable-prefix-caching": SWITCH, "--no-enable-prefix-caching": SWITCH,
    "--enable-chunked-prefill": SWITCH, "--no-enable-chunked-prefill": SWITCH,
    "--enforce-eager": SWITCH, "--max-logprobs": VALUE, "--enable-lora": SWITCH, "--disable-log-stats": SWITCH,
}

LATENCY: dict[str, str] = {
    **ENGINE_ARGS,
    "--input-len": VALUE, "--output-len": VALUE, "--batch-size": VALUE, "--n": VALUE,
    "--use-beam-search": SWITCH, "--num-iters-warmup": VALUE, "--num-iters": VALUE, "--profile": SWITCH,
    "--output-json": VALUE, "--disable-detokenize": SWITCH,
}

THROUGHPUT: dict[str, str] = {
    **ENGINE_ARGS,
    "--backend": VALUE, "--dataset-name": VALUE, "--dataset": VALUE, "--dataset-path": VALUE,
    "--input-len": VALUE, "--output-len": VALUE, "--n": VALUE, "--num-prompts": VALUE,
    "--hf-max-batch-size": VALUE, "--output-json": VALUE, "--async-engine": SWITCH,
    "--disable-frontend-multiprocessing": SWITCH, "--disable-detokenize": SWITCH, "--lora-path": VALUE,
    "--prefix-len": VALUE, "--random-range-ratio": VALUE, "--hf-subset": VALUE, "--hf-split": VALUE,
    "--profile": SWITCH, "--prefix-repetition-prefix-len": VALUE, "--prefix-repetition-suffix-len": VALUE,
    "--prefix-repetition-num-prefixes": VALUE, "--prefix-repetition-output-len": VALUE,
}

SERVE_CLIENT: dict[str, str] = {
    # datasets.add_dataset_parser
    "--seed": VALUE, "--num-prompts": VALUE, "--dataset-name": VALUE, "--no-stream": SWITCH,
    "--dataset-path": VALUE, "--no-oversample": SWITCH, "--custom-output-len": VALUE,
    "--sharegpt-output-len": VALUE, "--sonnet-input-len": VALUE, "--sonnet-output-len": VALUE,
    "--sonnet-prefix-len": VALUE, "--random-input-len": VALUE, "--random-output-len": VALUE,
    "--random-range-ratio": VALUE, "--random-prefix-len": VALUE, "--hf-subset": VALUE, "--hf-split": VALUE,
    "--hf-output-len": VALUE, "--prefix-repetition-prefix-len": VALUE, "--prefix-repetition-suffix-len": VALUE,
    "--prefix-repetition-num-prefixes": VALUE, "--prefix-repetition-output-len": VALUE,
    # serve.add_cli_args
    "--label": VALUE, "--backend": VALUE, "--base-url": VALUE, "--host": VALUE, "--port": VALUE,
    "--endpoint": VALUE, "--header": VALUES, "--max-concurrency": VALUE, "--model": VALUE, "--tokenizer": VALUE,
    "--tokenizer-mode": VALUE, "--use-beam-search": SWITCH, "--logprobs": VALUE, "--request-rate": VALUE,
    "--burstiness": VALUE, "--trust-remote-code": SWITCH, "--disable-tqdm": SWITCH, "--num-warmups": VALUE,
    "--profile": SWITCH, "--save-result": SWITCH, "--save-detailed": SWITCH, "--append-result": SWITCH,
    "--metadata": VALUES, "--result-dir": VALUE, "--result-filename": VALUE, "--ignore-eos": SWITCH,
    "--percentile-metrics": VALUE, "--metric-percentiles": VALUE, "--goodput": VALUES,
    "--request-id-prefix": VALUE, "--top-p": VALUE, "--top-k": VALUE, "--min-p": VALUE, "--temperature": VALUE,
    "--served-model-name": VALUE, "--lora-modules": VALUES, "--ramp-up-strategy": VALUE,
    "--ramp-up-start-rps": VALUE, "--ramp-up-end-rps": VALUE, "--ready-check-timeout-sec": VALUE,
}

# `vllm serve MODEL ...` (the API server for a planned serve benchmark).
SERVER: dict[str, str] = {
    **ENGINE_ARGS,
    "--host": VALUE, "--port": VALUE, "--api-key": VALUE, "--uvicorn-log-level": VALUE,
}

FLAGS: dict[str, dict[str, str]] = {
    "bench latency": LATENCY, "bench throughput": THROUGHPUT, "bench serve": SERVE_CLIENT, "serve": SERVER,
}

# Values with fixed choices in 0.11.x that a plan might set.
CHOICES: dict[str, dict[str, tuple[str, ...]]] = {
    "bench throughput": {"--backend": ("vllm", "hf", "mii", "vllm-chat"),
                         "--dataset-name": ("sharegpt", "random", "sonnet", "burstgpt", "hf", "prefix_repetition")},
    "bench serve": {"--backend": ("vllm", "openai", "openai-chat", "openai-audio", "openai-embeddings"),
                    "--dataset-name": ("sharegpt", "burstgpt", "sonnet", "random", "random-mm", "hf", "custom",
                                       "prefix_repetition", "spec_bench")},
}


class VllmArgvError(ValueError):
    """A planned argv that vLLM's CLI would reject."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # raise instead of printing usage and exiting
        raise VllmArgvError(message)


def _parser(sub: str) -> _Parser:
    p = _Parser(prog=f"vllm {sub}", add_help=False, allow_abbrev=False)
    if sub == "serve":
        p.add_argument("model_tag", nargs="?")
    for flag, kind in FLAGS[sub].items():
        choices = CHOICES.get(sub, {}).get(flag)
        if kind == SWITCH:
            p.add_argument(flag, action="store_true")
        elif kind == VALUES:
            p.add_argument(flag, nargs="+", choices=choices)
        else:
            p.add_argument(flag, choices=choices)
    return p


def check_argv(argv: list[str]) -> str:
    """Validate ``["vllm", "bench", "latency", ...]`` / ``["vllm", "serve", MODEL, ...]``.

    Returns the subcommand (``"bench latency"``, ...); raises ``VllmArgvError`` naming the problem.
    """
    if len(argv) < 2 or argv[0] != "vllm":
        raise VllmArgvError(f"not a vllm command: {argv[:3]}")
    if argv[1] == "bench":
        if len(argv) < 3 or f"bench {argv[2]}" not in FLAGS:
            raise VllmArgvError(f"unknown vllm bench subcommand {argv[2:3]} (known: latency, throughput, serve)")
        sub, rest = f"bench {argv[2]}", argv[3:]
    elif argv[1] == "serve":
        sub, rest = "serve", argv[2:]
    else:
        raise VllmArgvError(f"unknown vllm subcommand {argv[1]!r}")
    if not all(isinstance(x, str) for x in rest):
        raise VllmArgvError(f"every argv element must be a string: {rest}")
    try:
        _parser(sub).parse_args(rest)
    except VllmArgvError as e:
        raise VllmArgvError(f"vllm {sub}: {e}") from None
    return sub
