"""CPU linears on GGUF block-quantized weights (Q8_0 / Q4_0 / Q4_1), multiplied natively by ``cpu_qgemv``.

A runtime transformation, like pre-packing: :func:`quantize_block_linears` swaps a model's CPU
``nn.Linear`` modules (and its logits head) for :class:`QuantLinear`, whose weight is held only as
GGUF blocks repacked for the kernel (no bf16 copy is kept for it). Two sources of blocks:

- ``--quantization gguf`` / ``--dtype auto`` on a GGUF model: the file's own blocks, losslessly
  (``convert_gguf`` keeps them beside the dequantized safetensors in :data:`BLOCKS_FILE`);
  linears whose GGUF type the kernel lacks (K-quants, F16...) stay bf16 and are pre-packed.
- ``--quantization q8_0|q4_0|q4_1`` on any model: ``gguf.quants.quantize`` (ggml's reference
  quantizers) of the loaded weights.

:class:`QuantLinear` is a :class:`PackedLinear` (its ``gemv`` is the plain 2-D call and ``min_rows``
is 1), so the lean CPU decode steps and ``step_model`` take it as they take a packed bf16 linear.
Numerics: the activation is quantized to int8 per block of 32 (llama.cpp's scheme; see
``cpu_qgemv.c``), so outputs differ from the dequantized model's by that rounding.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from torchinferno.checkpoint.gguf_import import BLOCKS_FILE
from torchinferno.errors import CheckpointError, ConfigError
from torchinferno.kernels import cpu_qgemv
from torchinferno.kernels.cpu_linear import PackedLinear
from torchinferno.kernels.module_swap import replace_linears

BLOCK_FORMATS = tuple(cpu_qgemv.GGUF_TYPES)  # "q4_0", "q4_1", "q8_0": --quantization quantizes to one of them
BLOCK_QUANTIZATIONS = ("gguf", *BLOCK_FORMATS)  # what this module adds to --quantization
# BLOCKS_FILE: HF name -> uint8 [N, K / 32 * block_bytes]; metadata "formats": {name: fmt}


class QuantLinear(PackedLinear):
    """y = x @ W^T (+ b), W as GGUF blocks of ``fmt`` in the kernel's layout. x [..., K] -> [..., N] (bf16 out)."""

    def __init__(self, raw: torch.Tensor, fmt: str, out_features: int, in_features: int,
                 bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16):
        nn.Module.__init__(self)  # not PackedLinear's: nothing to pack for oneDNN or the bf16 kernel
        fn = cpu_qgemv.load()
        if fn is None:
            raise ConfigError(f"quantized CPU GEMV is unavailable here ({cpu_qgemv.unavailable_reason()}); "
                              "use --quantization none")
        f = cpu_qgemv.GGUF_TYPES[fmt]
        if raw.dtype != torch.uint8 or tuple(raw.shape) != (out_features, in_features // 32 * f.block_bytes):
            raise CheckpointError(f"{fmt} blocks of shape {list(raw.shape)} ({raw.dtype}) do not hold a "
                                  f"[{out_features}, {in_features}] weight")
        self.out_features, self.in_features, self.kernel, self.min_rows = out_features, in_features, fmt, 1
        packed = cpu_qgemv.pack_blocks(raw, fmt)  # [ceil(N/16), K/32, WB + 64]
        self.register_buffer("packed_weight", packed, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().clone(), persistent=False)
        self.gemv = cpu_qgemv.make_qgemv(fn, packed, fmt, out_features, in_features, self.bias, out_dtype)

    @classmethod
    def from_weight(cls, w: torch.Tensor, fmt: str, bias: torch.Tensor | None = None) -> QuantLinear:
        """Quantize a float weight [N, K] with ggml's reference quantizer for ``fmt``; outputs in w's dtype."""
        return cls(cpu_qgemv.quantize_weight(w, fmt), fmt, w.shape[0], w.shape[1], bias, w.dtype)


_KERNEL_DTYPES = (torch.bfloat16, torch.float32)  # activations the kernel reads (and the outputs it writes)


def read_blocks(ckpt_dir: str | Path) -> dict[str, tuple[str, torch.Tensor]] | None:
    """HF name -> (format, raw blocks) from a converted GGUF's :data:`BLOCKS_FILE`; None if it has none."""
    from safetensors import safe_open

    path = Path(ckpt_dir) / BLOCKS_FILE
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as f:
        formats = json.loads((f.metadata() or {}).get("formats", "{}"))
        return {name: (formats[name], f.get_tensor(name)) for name in f.keys()}  # noqa: SIM118


def _merged_blocks(model: nn.Module, blocks: dict[str, tuple[str, torch.Tensor]]) -> dict[str, tuple[str, torch.Tensor]]:
    """Internal module name -> (format, raw) for llama3's merged projections (qkv, gate_up: rows concatenated in
    shard order); a module whose shards differ in format is left out (it stays float), one lacking a shard
    (kept in a format the kernel lacks) comes out short and is left out by the caller."""
    from torchinferno.models.llama3.weights import hf_to_internal

    shards: dict[str, dict[int, tuple[str, torch.Tensor]]] = {}
    for name, (fmt, raw) in blocks.items():
        if name == "lm_head.weight" or name == "model.embed_tokens.weight":
            continue
        internal, shard = hf_to_internal(model, name)
        shards.setdefault(internal.removesuffix(".weight"), {})[0 if shard is None else shard] = (fmt, raw)
    out = {}
    for mod, parts in shards.items():
        fmts = {fmt for fmt, _ in parts.values()}
        if len(fmts) == 1:
            out[mod] = (fmts.pop(), torch.cat([parts[i][1] for i in sorted(parts)]))
    return out


def quantize_block_linears(model: nn.Module, quantization: str, ckpt_dir: str | Path | None = None) -> int:
    """Swap CPU linears (and the head) for :class:`QuantLinear`; returns the count. See the module docstring.

    ``quantization`` "gguf" reads the blocks kept at conversion under ``ckpt_dir`` (ConfigError when there are
    none: not a GGUF model); a format name quantizes every CPU linear and the head. Only ``nn.Linear`` of exact
    type is swapped (as for pre-packing); run before ``prepack_linears`` (which then packs what is left).
    """
    if quantization not in BLOCK_QUANTIZATIONS:
        raise ConfigError(f"unknown block quantization '{quantization}' (valid: {', '.join(BLOCK_QUANTIZATIONS)})")
    if cpu_qgemv.load() is None:
        raise ConfigError(f"--quantization {quantization} needs the quantized CPU GEMV, unavailable here "
                          f"({cpu_qgemv.unavailable_reason()})")
    if quantization == "gguf":
        blocks = read_blocks(ckpt_dir) if ckpt_dir is not None else None
        if blocks is None:
            raise ConfigError(f"--quantization gguf: {ckpt_dir} has no GGUF blocks ({BLOCKS_FILE}); it is kept when "
                              "a .gguf or registry model is converted (reconvert, or pick q8_0/q4_0/q4_1)")
        by_module = _merged_blocks(model, blocks)
        tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
        head_blocks = blocks.get("model.embed_tokens.weight") if tied else blocks.get("lm_head.weight")

        def make(name: str, lin: nn.Linear) -> nn.Module | None:
            if name not in by_module or lin.weight.device.type != "cpu" or lin.weight.dtype not in _KERNEL_DTYPES:
                return None
            fmt, raw = by_module[name]
            if raw.shape[0] != lin.out_features:  # a merged module with a shard in another format: stays float
                return None
            return QuantLinear(raw, fmt, lin.out_features, lin.in_features, lin.bias, lin.weight.dtype)
    else:
        head_blocks = None

        def make(name: str, lin: nn.Linear) -> nn.Module | None:
            if lin.weight.device.type != "cpu" or lin.in_features % 32 or lin.weight.dtype not in _KERNEL_DTYPES:
                return None
            return QuantLinear.from_weight(lin.weight, quantization, lin.bias)

    count = _quantize_head(model, quantization, head_blocks)
    return count + len(replace_linears(model, make))


def _quantize_head(model: nn.Module, quantization: str, head_blocks: tuple[str, torch.Tensor] | None) -> int:
    """The logits projection into ``model.packed_head`` (tied or not), as ``prepack_linears`` does for bf16."""
    head = getattr(model, "lm_head", None)
    if not (getattr(model, "packed_head", False) is None and callable(getattr(model, "head_weight", None))
            and (head is None or type(head) is nn.Linear)):
        return 0
    w = model.head_weight()  # [V, D]
    if w.device.type != "cpu" or w.shape[1] % 32 or w.dtype not in _KERNEL_DTYPES:
        return 0
    if quantization == "gguf":
        if head_blocks is None:
            return 0
        model.packed_head = QuantLinear(head_blocks[1], head_blocks[0], w.shape[0], w.shape[1], None, w.dtype)
    else:
        model.packed_head = QuantLinear.from_weight(w, quantization)
    if head is not None:
        model.lm_head = None  # one copy of the head in memory
    return 1
