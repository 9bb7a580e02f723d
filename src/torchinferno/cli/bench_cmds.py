"""Benchmark commands: ``bench-generate``."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-generate", help="decode tok/s vs transformers and vs the bandwidth bound, same run")
    p.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--compare-hf", action="store_true", help="also time transformers' generate on the same weights")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--json-output", default=None, help="write the report as JSON here")
    p.add_argument("--no-prepack", action="store_true", help="do not pre-pack CPU bf16 weights")
    p.add_argument("--cpu-gemv", default="auto", choices=["auto", "onednn", "avx512bf16"],
                   help="kernel of the pre-packed CPU bf16 linears (auto: avx512bf16 where available, else onednn)")
    p.set_defaults(func=cmd_bench_generate)


def cmd_bench_generate(a) -> int:
    import torch

    from torchinferno.bench.generate_bench import run_bench
    from torchinferno.cli.common import check_device
    from torchinferno.kernels.cpu_linear import use_kernel

    check_device(a.device)
    print(f"bench-generate {a.model} dtype={a.dtype} device={a.device} threads={torch.get_num_threads()} "
          f"prompt={a.prompt_tokens} new={a.new_tokens}")
    with use_kernel(a.cpu_gemv):  # run_bench's prepack_linears(model) packs for this kernel
        rep = run_bench(a.model, a.batch_sizes, a.new_tokens, a.dtype, a.device, a.compare_hf, a.prompt_tokens,
                        a.cache_dir, prepack=not a.no_prepack)
    print(f"copy bandwidth (read+write): {rep.bandwidth_gb_s:.1f} GB/s; weight bytes per decode step: {rep.weight_bytes_per_step / 1e6:.1f} MB")
    if a.json_output:
        data = asdict(rep)
        for r, rr in zip(rep.rows, data["rows"]):
            rr["ratio"] = r.ratio
        with open(a.json_output, "w") as f:
            json.dump(data, f, indent=2)
    return 0
