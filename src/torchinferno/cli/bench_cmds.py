"""Benchmark commands: ``bench-generate``."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-generate", help="decode tok/s vs transformers and vs the bandwidth bound, same run")
    p.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16", "auto"],
                   help="auto: bfloat16, and a GGUF model keeps its quantized blocks (--quantization gguf)")
    p.add_argument("--quantization", default="none", choices=["none", "gguf", "q8_0", "q4_0", "q4_1"],
                   help="gguf: the GGUF's own Q8_0/Q4_0/Q4_1 blocks; q8_0/q4_0/q4_1: quantize so (CPU, native)")
    p.add_argument("--compare-llamacpp", action="store_true",
                   help="also time llama.cpp's llama-bench (batch 1, same thread count) on the same weights, "
                        "alternating with ours for --rounds pairs (BF16 GGUF for a bf16 run, the model's GGUF "
                        "for a quantized one)")
    p.add_argument("--rounds", type=int, default=3, help="paired rounds of --compare-llamacpp (default 3)")
    p.add_argument("--accuracy", action="store_true",
                   help="a quantized run: greedy-token agreement and perplexity vs the bf16 model of the same "
                        "checkpoint")
    p.add_argument("--device", default="cpu")
    p.add_argument("--compare-hf", action="store_true", help="also time transformers' generate on the same weights")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--json-output", default=None, help="write the report as JSON here")
    p.add_argument("--no-prepack", action="store_true", help="do not pre-pack CPU bf16 weights")
    from torchinferno.cli.common import add_cpu_gemv_arg

    add_cpu_gemv_arg(p)
    p.add_argument("--cpu-step", default="native", choices=["native", "python"],
                   help="CPU decode step: native (the whole step in one C call where the model's linears allow) "
                        "or python (the family's eager ops); an A/B of the two")
    p.set_defaults(func=cmd_bench_generate)


def cmd_bench_generate(a) -> int:
    from torchinferno.cli.common import check_device
    from torchinferno.kernels.cpu_decode_step import use_step
    from torchinferno.kernels.cpu_gemv import amx_allowed
    from torchinferno.kernels.cpu_linear import resolve_kernel

    check_device(a.device)
    resolve_kernel(a.cpu_gemv)  # before AMX is touched: a kernel this machine lacks fails here, in one line
    # every runner built below (ours and the paired rounds) takes this CPU step and AMX choice
    with use_step(a.cpu_step), amx_allowed(a.cpu_gemv == "amx"):
        return _bench_generate(a)


def _bench_generate(a) -> int:
    import torch

    from torchinferno.bench.generate_bench import run_bench
    from torchinferno.kernels.cpu_linear import use_kernel

    print(f"bench-generate {a.model} dtype={a.dtype} device={a.device} threads={torch.get_num_threads()} "
          f"prompt={a.prompt_tokens} new={a.new_tokens} cpu-step={a.cpu_step} cpu-gemv={a.cpu_gemv}")
    kept: list = []
    with use_kernel(a.cpu_gemv):  # run_bench's prepack_linears(model) packs for this kernel
        rep = run_bench(a.model, a.batch_sizes, a.new_tokens, a.dtype, a.device, a.compare_hf, a.prompt_tokens,
                        a.cache_dir, prepack=not a.no_prepack, quantization=a.quantization, keep_model=kept)
    read = "" if rep.read_bandwidth_gb_s is None else f"; read bandwidth (the bound): {rep.read_bandwidth_gb_s:.1f} GB/s"
    print(f"copy bandwidth (read+write): {rep.bandwidth_gb_s:.1f} GB/s{read}; "
          f"weight bytes per decode step: {rep.weight_bytes_per_step / 1e6:.1f} MB")
    quant = _quantization_of(kept[0])
    extra = {}
    if a.compare_llamacpp:
        from torchinferno.bench.llamacpp import compare_rounds
        from torchinferno.env import read_env

        cache = Path(a.cache_dir).expanduser() if a.cache_dir else read_env().cache_dir
        extra["llamacpp"] = compare_rounds(kept[0], a.model, quant, cache, a.new_tokens, a.prompt_tokens, a.rounds)
    if a.accuracy:
        extra["accuracy"] = _accuracy(a, kept[0], quant)
    if a.json_output:
        data = {**asdict(rep), **extra, "cpu_step": a.cpu_step}
        for r, rr in zip(rep.rows, data["rows"]):
            rr["ratio"] = r.ratio
        with open(a.json_output, "w") as f:
            json.dump(data, f, indent=2)
    return 0


def _quantization_of(model) -> str:
    """"none", or the block format(s) the built model's linears run in (e.g. "q4_1+q8_0")."""
    from torchinferno.kernels.cpu_quant_linear import QuantLinear

    fmts = sorted({m.kernel for m in model.modules() if isinstance(m, QuantLinear)})
    return "+".join(fmts) if fmts else "none"


def _accuracy(a, model, quant: str) -> dict | None:
    from torchinferno.bench.quant_accuracy import compare, format_accuracy
    from torchinferno.engine.assembly import ModelSpec, build_model, tokenizer_spec
    from torchinferno.text.tokenizer import load_tokenizer

    if quant == "none":
        print("accuracy: the run is not quantized; nothing to compare")
        return None
    spec = ModelSpec(model=a.model, dtype="bfloat16", device=a.device, cache_dir=a.cache_dir)
    ref = build_model(spec)
    tok = load_tokenizer(tokenizer_spec(spec, None, ref.checkpoint_dir))
    rep = compare(ref, model, tok)
    print(format_accuracy(rep, "bf16", quant))
    return asdict(rep)
