"""MoE GPU commands: ``bench-moe`` (fused MoE vs the torch reference, V2-Lite-like shape) and ``tune-moe``
(tile search for the fused MoE GEMMs, written as data)."""

from __future__ import annotations

import argparse
import json


def _shape(text: str) -> tuple[int, int, int, int]:
    try:
        E, k, D, inter = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape wants E,top_k,hidden,moe_intermediate (e.g. 64,6,2048,1408), "
                                         f"got {text!r}") from None
    return E, k, D, inter


def register(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench-moe", help="fused MoE vs the torch reference on a DeepSeek-V2-Lite-like shape (CUDA)")
    b.add_argument("--sections", nargs="+", default=["layer", "model"], choices=["layer", "model"])
    b.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256], help="decode batch sizes")
    b.add_argument("--layer-batches", type=int, nargs="+", default=None,
                   help="token counts of the layer section (default: --batches)")
    b.add_argument("--prefill-tokens", type=int, default=2048)
    b.add_argument("--layers", type=int, default=None,
                   help="model layers (default: 16 for v2-lite, 4 for v3-scaled)")
    b.add_argument("--model-shape", default="v2-lite", choices=["v2-lite", "v3-scaled"],
                   help="the model section's shape: V2-Lite-like, or DeepSeek-V3's layers scaled down in depth")
    b.add_argument("--layer-shapes", nargs="+", default=["v2-lite", "v3"], choices=["v2-lite", "v3"],
                   help="MoE layer shapes of the layer section")
    b.add_argument("--quantization", default="none", choices=["none", "fp8-block"],
                   help="the model section's weights: bf16, or block FP8 built layer by layer (never the whole model "
                        "in bf16: v3-scaled fits 8 layers on an H200); fp8-block skips the transformers peer and the "
                        "torch MoE reference")
    b.add_argument("--no-hf", action="store_true", help="skip the transformers eager peer")
    b.add_argument("--json-output", default=None)
    b.set_defaults(func=cmd_bench_moe)

    t = sub.add_parser("tune-moe", help="search tile configs for the fused MoE GEMMs on the GPU; write them as data")
    t.add_argument("--shape", type=_shape, action="append", default=None,
                   help="E,top_k,hidden,moe_intermediate (repeatable; default 64,6,2048,1408 (V2-Lite) then "
                        "256,8,7168,2048 (V3))")
    t.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256, 2048])
    t.add_argument("--output", default=None, help="JSON file (default: the package's kernels/triton/fused_moe_configs.json)")
    t.add_argument("--budget-s", type=float, default=240.0)
    t.set_defaults(func=cmd_tune_moe)


def _need_cuda(cmd: str) -> None:
    import torch

    from torchinferno.errors import ConfigError

    if not torch.cuda.is_available():
        raise ConfigError(f"{cmd} needs a CUDA device (none is visible here)")


def cmd_bench_moe(a) -> int:
    _need_cuda("bench-moe")
    from torchinferno.bench.moe_bench import run_bench_moe

    rep = run_bench_moe(tuple(a.sections), tuple(a.batches), a.prefill_tokens, not a.no_hf, a.layers,
                        tuple(a.layer_shapes), layer_batches=tuple(a.layer_batches) if a.layer_batches else None,
                        model_shape=a.model_shape, quantization=a.quantization)
    if a.json_output:
        with open(a.json_output, "w") as f:
            json.dump(rep, f, indent=1, default=str)
    return 0


def cmd_tune_moe(a) -> int:
    _need_cuda("tune-moe")
    from torchinferno.bench.moe_tune import V2_LITE, V3, run_tune_moe

    run_tune_moe(tuple(a.shape or [V2_LITE, V3]), tuple(a.tokens), a.output, a.budget_s)
    return 0
