"""Flags shared by several commands and the glue that turns them into objects."""

from __future__ import annotations

import argparse

from torchinferno.core.sampling_params import SamplingParams

DEFAULT_MODEL = "smollm2-135m-instruct"


def add_model_args(p: argparse.ArgumentParser, positional: bool = True) -> None:
    if positional:
        p.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                       help=f"registry name, HF dir, .gguf file or hub id (default: {DEFAULT_MODEL})")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--tokenizer", default=None, help="byte | PATH (default: the model's tokenizer.json, else byte)")
    p.add_argument("--cache-dir", default=None, help="model cache (default ~/.cache/torchinferno)")
    p.add_argument("--variant", default=None, help="model variant from the family registry (default: the family's default)")
    p.add_argument("--no-prepack", action="store_true",
                   help="keep plain nn.Linear weights on CPU (default: pre-pack bf16 weights for the CPU GEMV kernel)")
    add_quantization_arg(p)


def add_quantization_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quantization", default="none", choices=["none", "fp8"],
                   help="fp8: FP8-E4M3 weights and per-token activations (W8A8) for every linear but the head; "
                        "FP8 tensor cores on CUDA sm89+, a torch reference elsewhere (slow on CPU)")


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
    import torch

    from torchinferno.errors import ConfigError

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device} requested but CUDA is not available (valid here: cpu)")
    if not (device == "cpu" or device.startswith("cuda")):
        raise ConfigError(f"unknown device '{device}' (valid: cpu, cuda, cuda:N)")


def load_model_and_tokenizer(a: argparse.Namespace):
    """(model, tokenizer) from --model/--dtype/--device/--tokenizer/--cache-dir."""
    from pathlib import Path

    from torchinferno.checkpoint.auto import load_model_auto
    from torchinferno.kernels.fp8_linear import quantize_model
    from torchinferno.text.tokenizer import load_tokenizer

    check_device(a.device)
    model = load_model_auto(a.model, device=a.device, dtype=a.dtype, variant=a.variant, cache_dir=a.cache_dir)
    quantize_model(model, getattr(a, "quantization", "none"))
    if not getattr(a, "no_prepack", False):
        from torchinferno.kernels.cpu_linear import prepack_linears

        prepack_linears(model)  # no-op unless the weights are bf16 on a CPU with oneDNN bf16
    spec = a.tokenizer
    if spec is None:
        spec = str(model.checkpoint_dir) if (Path(model.checkpoint_dir) / "tokenizer.json").exists() else "byte"
    return model, load_tokenizer(spec)


TINY_MODEL = "tiny"
"""``--model tiny``: a tiny random model (of ``--model-kind``'s family, default llama3) instead of a checkpoint."""


def tiny_kind_family(model_kind: str) -> str:
    """The family name behind a ``--model-kind`` spelling: a family name or alias (``llama3``, ``deepseek``,
    ``dsv4``, ...) or the original's ``tiny-<family>`` form (``tiny-llama``, ``tiny-llama3``,
    ``tiny-deepseek``, ``tiny-dsv4``). Unknown names raise ``ConfigError`` listing the valid ones."""
    from torchinferno.errors import ConfigError
    from torchinferno.models.registry import get_family

    try:
        return get_family(model_kind.removeprefix("tiny-")).name
    except ConfigError as e:
        raise ConfigError(f"--model-kind {model_kind}: {e}; each also spelled tiny-<name>") from None
