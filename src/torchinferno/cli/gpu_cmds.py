"""GPU commands: ``perf-smoke`` (paged decode attention: reference vs specialized) and ``bench-gpu``."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("perf-smoke", help="paged decode attention: torch reference vs specialized kernel (time, max error)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (Triton kernel on CUDA, torch path elsewhere)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=None, help="default: --heads (no GQA)")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--value-dim", type=int, default=None, help="default: --head-dim")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--kv-cache-dtype", default="auto", help="cache storage: auto (= --dtype) or fp8 (float8_e4m3fn)")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--sweep", action="store_true", help="also time a grid of Triton tilings and split counts (CUDA)")
    p.add_argument("--json-output", default=None)
    p.set_defaults(func=cmd_perf_smoke)

    b = sub.add_parser("bench-gpu", help="one-process GPU benchmark of a Llama-3-8B-shaped model vs same-run ceilings")
    b.add_argument("--size", default="llama3-8b", help="llama3 size name (random bf16 weights)")
    b.add_argument("--contexts", type=int, nargs="+", default=[128, 4096], help="batch-1 decode contexts")
    b.add_argument("--batch", type=int, default=64)
    b.add_argument("--batch-context", type=int, default=1024)
    b.add_argument("--prefill-tokens", type=int, default=2048)
    b.add_argument("--engine-requests", type=int, default=256)
    b.add_argument("--engine-input", type=int, default=1024)
    b.add_argument("--engine-output", type=int, default=1024)
    b.add_argument("--engine-modes", nargs="*", default=["graphs", "async"], choices=["graphs", "async", "eager", "async-fp8", "async-w8", "async-w8-fp8"],
                   help="engine runs: decode steps replayed from CUDA graphs, graphs + async scheduling, the eager "
                        "runner, graphs + async scheduling with an FP8 KV cache (async-fp8), FP8 W8A8 linears (async-w8) "
                        "or both (async-w8-fp8; FP8-weight modes run last, the bf16 weights are replaced) (none: skip)")
    b.add_argument("--sections", nargs="+", default=["a", "b", "c", "d", "e"], choices=["a", "b", "c", "d", "e"],
                   help="which figures to measure (default: all; the ceilings are always measured)")
    b.add_argument("--no-hf", action="store_true", help="skip the transformers peer")
    b.add_argument("--no-gemv-experiment", action="store_true",  # accepted so earlier recorded commands run
                   help=argparse.SUPPRESS)
    b.add_argument("--budget-s", type=float, default=540.0, help="wall-clock budget; sections past it are skipped")
    b.add_argument("--json-output", default=None)
    b.set_defaults(func=cmd_bench_gpu)


def cmd_perf_smoke(a) -> int:
    from torchinferno.bench.perf_smoke import perf_smoke
    from torchinferno.cli.common import check_device

    check_device(a.device)
    res = perf_smoke(a.device, a.batch, a.heads, a.kv_heads or a.heads, a.seq_len, a.head_dim, a.value_dim,
                     a.block_size, a.dtype, a.iters, a.sweep, a.kv_cache_dtype)
    print(json.dumps({k: v for k, v in res.items() if k != "rows"} | {"rows": res["rows"][:3]}))
    if a.json_output:
        with open(a.json_output, "w") as f:
            json.dump(res, f, indent=2)
    return 0 if res["ok"] else 1  # a kernel that is fast but wrong fails the smoke


def cmd_bench_gpu(a) -> int:
    import torch

    from torchinferno.errors import ConfigError

    if not torch.cuda.is_available():
        raise ConfigError("bench-gpu needs a CUDA device (none is visible here)")
    from torchinferno.bench.gpu_bench import run_bench_gpu

    rep = run_bench_gpu(a.size, tuple(a.contexts), a.batch, a.batch_context, a.prefill_tokens, a.engine_requests,
                        a.engine_input, a.engine_output, tuple(a.engine_modes), not a.no_hf,
                        budget_s=a.budget_s,
                        json_path=a.json_output, sections=tuple(a.sections))
    print(json.dumps(rep, default=str))
    return 0
