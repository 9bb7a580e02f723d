"""One assembly path for every entry point: load -> quantize -> pre-pack, the tokenizer, the engine.

``serve`` (in its engine-core process), the CLI commands, ``LLM`` and the benchmarks all build a model
from a ``ModelSpec`` with ``build_model`` and pick its tokenizer with ``tokenizer_spec``, so they run
the same model with the same defaults. Warm-up is the engine's (``LLMEngine.warmup`` /
``engine/warmup.py``), run by whoever owns the engine once it exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from torchinferno.errors import ConfigError

__all__ = ["ModelSpec", "build_model", "check_device", "tokenizer_spec", "tiny_kind_family", "DEFAULT_MODEL",
           "TINY_MODEL", "QUANTIZATIONS"]

DEFAULT_MODEL = "smollm2-135m-instruct"
TINY_MODEL = "tiny"
"""``--model tiny``: a tiny random model (of ``--model-kind``'s family, default llama3) instead of a checkpoint."""
QUANTIZATIONS = ("none", "fp8", "fp8-block", "gguf", "q8_0", "q4_0", "q4_1")
"""fp8: W8A8 per channel (kernels/fp8_linear); fp8-block: W8A8 with 128x128 weight blocks, DeepSeek's format, a
checkpoint's own FP8 blocks kept (kernels/fp8_block, fp8_block_moe for the routed experts); gguf: a GGUF model's own
Q8_0/Q4_0/Q4_1 blocks, q8_0/q4_0/q4_1: ggml's quantizers on any model, both multiplied natively on CPU
(kernels/cpu_quant_linear)."""
DTYPES = ("float32", "bfloat16", "float16", "auto")
"""auto: bfloat16, and a GGUF model on CPU keeps its quantized blocks (``--quantization gguf``)."""


def tiny_kind_family(model_kind: str) -> str:
    """The family name behind a ``--model-kind`` spelling: a family name or alias (``llama3``, ``deepseek``,
    ``dsv4``, ...) or the original's ``tiny-<family>`` form (``tiny-llama``, ``tiny-llama3``,
    ``tiny-deepseek``, ``tiny-dsv4``). Unknown names raise ``ConfigError`` listing the valid ones."""
    from torchinferno.models.registry import get_family

    try:
        return get_family(model_kind.removeprefix("tiny-")).name
    except ConfigError as e:
        raise ConfigError(f"--model-kind {model_kind}: {e}; each also spelled tiny-<name>") from None


def check_device(device: str) -> None:
    """Refuse, in one line, a device this host does not have or a spelling we do not know."""
    if not (device == "cpu" or device.startswith("cuda")):
        raise ConfigError(f"unknown device '{device}' (valid: cpu, cuda, cuda:N)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device} requested but CUDA is not available (valid here: cpu)")


@dataclass(frozen=True)
class ModelSpec:
    """What model to build and how (picklable: it is sent to the engine-core process).

    Exactly one of ``model`` (registry name, HF dir, ``.gguf`` file or hub id) and ``model_kind`` (a
    family name: a tiny random model of size ``size``, seeded with ``seed``) is set. ``quantization``
    is one of :data:`QUANTIZATIONS`; ``prepack`` pre-packs bf16 CPU linears for the GEMV kernel ``cpu_gemv``
    (``kernels.cpu_linear.KERNELS``; ``amx`` also allows AMX tiles in the process that builds the model).
    """

    model: str | None = None
    model_kind: str | None = None
    size: str = "debug"
    seed: int = 0
    dtype: str = "bfloat16"
    device: str = "cpu"
    quantization: str = "none"
    prepack: bool = True
    cache_dir: str | None = None
    variant: str | None = None
    kernel_artifacts: str | None = None  # prepare-deepseek-v4-kernels output, only loaded (kernels/v4_artifacts.py)
    cpu_gemv: str = "auto"

    def __post_init__(self) -> None:
        if (self.model is None) == (self.model_kind is None):
            raise ConfigError("give exactly one of a model (name, directory, .gguf, hub id) or a model kind")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(f"unknown quantization '{self.quantization}' (valid: {', '.join(QUANTIZATIONS)})")
        from torchinferno.kernels.cpu_linear import KERNELS

        if self.cpu_gemv not in KERNELS:
            raise ConfigError(f"unknown CPU GEMV kernel '{self.cpu_gemv}' (valid: {', '.join(KERNELS)})")

    @property
    def name(self) -> str:
        return self.model if self.model is not None else f"tiny-{self.model_kind}"

    def checkpoint_dir(self) -> Path | None:
        """The HF directory of ``model`` (pulled or converted once into the cache); None for a model kind."""
        if self.model is None:
            return None
        from torchinferno.checkpoint.zoo import resolve_model

        return Path(resolve_model(self.model, cache_dir=self.cache_dir))


def build_model(spec: ModelSpec) -> nn.Module:
    """Load (or build at random), quantize and pre-pack; the returned model has ``.family`` set. ``fp8-block`` on a
    checkpoint of a family in ``kernels.fp8_block_stream.STREAMED_FAMILIES`` (DeepSeek-V3/V3.2) loads and quantizes
    layer by layer (peak: the FP8 model + one layer in float); a tiny random model is built whole, then quantized."""
    from torchinferno.checkpoint.auto import default_attention_backend, load_model_auto, resolve_dtype
    from torchinferno.kernels.cpu_quant_linear import BLOCK_QUANTIZATIONS, quantize_block_linears
    from torchinferno.kernels.fp8_linear import quantize_model

    check_device(spec.device)
    spec = resolve_auto(spec)
    if spec.model_kind is not None:
        from torchinferno.models.registry import get_family
        from torchinferno.testing import tiny_model

        fam = get_family(spec.model_kind)
        backend = default_attention_backend(fam, fam.size(spec.size), spec.device)
        model = tiny_model(spec.model_kind, size=spec.size, seed=spec.seed, dtype=resolve_dtype(spec.dtype),
                           variant=spec.variant, device=spec.device, attention_backend=backend)
    else:
        model = None
        if spec.quantization == "fp8-block":  # layer by layer where the family allows: never the whole model in float
            from torchinferno.kernels.fp8_block_stream import load_model_fp8_block

            model = load_model_fp8_block(spec.model, device=spec.device, dtype=spec.dtype, variant=spec.variant,
                                         cache_dir=spec.cache_dir)
        if model is None:
            model = load_model_auto(spec.model, device=spec.device, dtype=spec.dtype, variant=spec.variant,
                                    cache_dir=spec.cache_dir)
    if spec.quantization in BLOCK_QUANTIZATIONS:
        quantize_block_linears(model, spec.quantization, getattr(model, "checkpoint_dir", None))
    elif getattr(model, "fp8_block_build", None) is None:  # a streamed fp8-block build is quantized already
        quantize_model(model, spec.quantization)
    if spec.prepack:
        from torchinferno.kernels.cpu_linear import prepack_linears

        prepack_linears(model, kernel=None if spec.cpu_gemv == "auto" else spec.cpu_gemv)  # no-op unless CPU bf16
        if spec.cpu_gemv == "amx":  # process-wide: this process (the engine core's) runs the model
            from torchinferno.kernels import cpu_gemv

            cpu_gemv.set_amx(True)
    if spec.kernel_artifacts is not None:
        from torchinferno.kernels import v4_artifacts

        v4_artifacts.apply(model, spec.kernel_artifacts)
    return model


def resolve_auto(spec: ModelSpec) -> ModelSpec:
    """``spec`` with ``dtype="auto"`` made concrete (bfloat16; on CPU a GGUF model keeps its blocks: quantization
    "gguf" unless one was asked), and a block quantization checked against the device. A GGUF conversion made
    before blocks were kept is redone once (registry models are re-extracted from pip's cache)."""
    from dataclasses import replace

    from torchinferno.kernels.cpu_quant_linear import BLOCK_QUANTIZATIONS

    quant = spec.quantization
    if spec.dtype == "auto":
        if quant == "none" and spec.device == "cpu" and spec.model is not None and _gguf_blocks(spec) is not None:
            quant = "gguf"
        spec = replace(spec, dtype="bfloat16", quantization=quant)
    if quant in BLOCK_QUANTIZATIONS and spec.device != "cpu":
        raise ConfigError(f"--quantization {quant} runs on CPU only (device {spec.device})")
    if quant == "gguf" and (spec.model is None or _gguf_blocks(spec) is None):
        raise ConfigError(f"--quantization gguf needs a GGUF model (a .gguf file or a registry name), not {spec.name}")
    return spec


def _gguf_blocks(spec: ModelSpec) -> Path | None:
    """The blocks file of a GGUF-converted ``spec.model`` (reconverting an older conversion once), else None."""
    from torchinferno.checkpoint.gguf_import import BLOCKS_FILE
    from torchinferno.checkpoint.zoo import MODEL_ZOO, pull

    ckpt = spec.checkpoint_dir()
    if ckpt is None or (ckpt / BLOCKS_FILE).is_file():
        return None if ckpt is None else ckpt / BLOCKS_FILE
    from torchinferno.checkpoint.build_once import MARKER

    marker = ckpt / MARKER
    if not marker.is_file() or "gguf" not in marker.read_text():
        return None  # not converted from a GGUF
    if spec.model in MODEL_ZOO:
        ckpt = pull(spec.model, cache_dir=spec.cache_dir, force=True)
    else:
        from torchinferno.checkpoint.build_once import build_once
        from torchinferno.checkpoint.gguf_import import convert_gguf
        from torchinferno.checkpoint.zoo import gguf_cache_dir

        src = Path(spec.model).expanduser().resolve()
        ckpt = build_once(gguf_cache_dir(src, spec.cache_dir), lambda out, _s: convert_gguf(src, out, progress=True),
                          info={"gguf": str(src)}, force=True)
    return ckpt / BLOCKS_FILE if (ckpt / BLOCKS_FILE).is_file() else None


def tokenizer_spec(spec: ModelSpec, tokenizer: str | None = None, checkpoint_dir: str | Path | None = None) -> str:
    """``tokenizer`` when given; else the checkpoint's ``tokenizer.json``; else the byte tokenizer.
    ``checkpoint_dir``: the spec's resolved directory when the caller already has it."""
    if tokenizer is not None:
        return tokenizer
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else spec.checkpoint_dir()
    if ckpt is not None and (ckpt / "tokenizer.json").exists():
        return str(ckpt)
    return "byte"
