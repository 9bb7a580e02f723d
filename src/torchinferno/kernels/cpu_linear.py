"""CPU linear with weights pre-packed once for oneDNN (bf16 on AVX512-BF16/AMX CPUs).

A runtime transformation applied after a model is built and loaded, like quantization: it
replaces ``nn.Linear`` modules by :class:`PackedLinear`, whose weight lives in oneDNN's blocked
layout so every decode GEMV reads it at near-streaming bandwidth instead of re-laying it out
per call. Numerics: the same products summed in oneDNN's order (bf16 in, fp32 accumulate).
Export is not supported on a packed model: keep the unpacked module for save_pretrained.
"""

from __future__ import annotations

import torch
from torch import nn


def can_prepack(dtype: torch.dtype) -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


# oneDNN's bf16 kernels stream the weights faster at M = 4 rows than at M = 1 (about 5% of a
# SmolLM2 batch-1 decode step on a 2-core AVX512-BF16 EPYC). Fewer rows are zero-padded to this
# many: a row's result depends on M (the kernel's blocking), never on the other rows' values.
MIN_ROWS = 4


class PackedLinear(nn.Module):
    """y = x @ W^T (+ b) with W pre-packed for oneDNN. x [..., K] -> [..., N].

    Inputs of fewer than :data:`MIN_ROWS` rows are computed zero-padded to that many.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, batch_hint: int = 1):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        w = weight.detach()
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(w, batch_hint), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        rows = x2.shape[0]
        if 0 < rows < MIN_ROWS:
            x2 = torch.cat((x2, x2.new_zeros(MIN_ROWS - rows, shape[-1])))
        y = torch.ops.mkldnn._linear_pointwise(x2, self.packed_weight, self.bias, "none", [], "")
        return y[:rows].view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=onednn"


def prepack_linears(model: nn.Module) -> int:
    """Swap every CPU bf16 ``nn.Linear`` in ``model`` for a :class:`PackedLinear`; returns the count.

    A model exposing ``head_weight()`` and a ``packed_head`` slot also gets its logits projection
    packed (this covers a head tied to the embedding, which is not an ``nn.Linear``); one exposing
    ``enable_cpu_decode_step()`` gets its lean CPU decode step (if its family has one) installed
    on the packed weights.
    """
    count = 0
    if getattr(model, "packed_head", False) is None and callable(getattr(model, "head_weight", None)):
        w = model.head_weight()  # read before the lm_head Linear (if any) is swapped below
        if w.device.type == "cpu" and can_prepack(w.dtype):
            model.packed_head = PackedLinear(w)
            count += 1
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if parent is model and name == "lm_head" and getattr(model, "packed_head", None) is not None:
                setattr(parent, name, None)  # the packed head replaces it; keep one copy in memory
                continue
            if isinstance(child, nn.Linear) and child.weight.device.type == "cpu" and can_prepack(child.weight.dtype):
                setattr(parent, name, PackedLinear(child.weight, child.bias))
                count += 1
    if count and callable(getattr(model, "enable_cpu_decode_step", None)):
        model.enable_cpu_decode_step()  # a lean decode step built on the packed weights (models/llama3/cpu_decode.py)
    return count
