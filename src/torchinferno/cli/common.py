"""Flags shared by several commands and the glue that turns them into objects."""

from __future__ import annotations

import argparse

from torchinferno.core.sampling_params import SamplingParams

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_MODEL_KIND = "dsv4"  # the README's default family for the offline workbench commands (tiny random)


def add_model_args(p: argparse.ArgumentParser, positional: bool = True) -> None:
    if positional:
        p.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                       help=f"registry name, HF dir, .gguf file or hub id (default: {DEFAULT_MODEL})")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "auto"],
                   help="auto: bfloat16, and a GGUF model on CPU keeps its quantized blocks (--quantization gguf)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--tokenizer", default=None, help="byte | PATH (default: the model's tokenizer.json, else byte)")
    p.add_argument("--cache-dir", default=None, help="model cache (default ~/.cache/torchinferno)")
    p.add_argument("--variant", default=None, help="model variant from the family registry (default: the family's default)")
    p.add_argument("--no-prepack", action="store_true",
                   help="keep plain nn.Linear weights on CPU (default: pre-pack bf16 weights for the CPU GEMV kernel)")
    add_cpu_gemv_arg(p)
    add_quantization_arg(p)


def add_cpu_gemv_arg(p: argparse.ArgumentParser) -> None:
    from torchinferno.kernels.cpu_linear import KERNEL_HELP, KERNELS

    p.add_argument("--cpu-gemv", default="auto", choices=list(KERNELS), help=KERNEL_HELP)


def add_quantization_arg(p: argparse.ArgumentParser) -> None:
    from torchinferno.engine.assembly import QUANTIZATIONS

    p.add_argument("--quantization", default="none", choices=list(QUANTIZATIONS),
                   help="fp8: FP8-E4M3 weights and per-token activations (W8A8) for every linear but the head; "
                        "FP8 tensor cores on CUDA sm89+, a torch reference elsewhere (slow on CPU). "
                        "gguf: a GGUF model's own Q8_0/Q4_0/Q4_1 blocks; q8_0/q4_0/q4_1: quantize any model so; "
                        "both multiplied natively on CPU (AVX512-VNNI), never dequantized")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--stop-token-ids", type=int, nargs="*", default=[])
    p.add_argument("--ignore-eos", action="store_true")


def sampling_from_args(a: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=a.max_new_tokens, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, min_p=a.min_p,
        seed=a.seed, stop=a.stop, stop_token_ids=a.stop_token_ids, ignore_eos=a.ignore_eos,
    ).validate()


def check_device(device: str) -> None:
    from torchinferno.engine.assembly import check_device as _check

    _check(device)


def load_model_and_tokenizer(a: argparse.Namespace):
    """(model, tokenizer) from --model/--dtype/--device/--tokenizer/--cache-dir, through the shared assembly."""
    from torchinferno.engine.assembly import ModelSpec, build_model, tokenizer_spec
    from torchinferno.text.tokenizer import load_tokenizer

    spec = ModelSpec(model=a.model, dtype=a.dtype, device=a.device, quantization=getattr(a, "quantization", "none"),
                     prepack=not getattr(a, "no_prepack", False), cache_dir=a.cache_dir, variant=a.variant,
                     cpu_gemv=getattr(a, "cpu_gemv", "auto"))
    model = build_model(spec)
    return model, load_tokenizer(tokenizer_spec(spec, a.tokenizer, model.checkpoint_dir))


from torchinferno.engine.assembly import TINY_MODEL, tiny_kind_family  # noqa: E402,F401  (re-exported for commands)
