"""CPU linears with weights pre-packed once (bf16 on AVX512-BF16 CPUs): our GEMV kernel or oneDNN.

A runtime transformation applied after a model is built and loaded, like quantization: it
replaces ``nn.Linear`` modules by :class:`PackedLinear`, whose weight is packed once for its
kernel so every decode GEMV streams it instead of re-laying it out per call. Kernels (chosen per
model by ``prepack_linears(model, kernel=...)``):

- ``avx512bf16``: ours (``kernels/cpu_gemv.c``), weights packed for ``vdpbf16ps``; each output
  row is bitwise independent of M and of the other rows, so no row padding.
- ``onednn``: ``torch.ops.mkldnn._linear_pointwise`` on oneDNN's blocked layout; its results
  depend on M (the kernel's blocking), and it streams faster at M >= 4, so fewer rows are padded.
- ``amx``: ours with AMX bf16 tiles allowed (Sapphire Rapids+; ``cpu_gemv.amx_allowed``), the same packing.
  Opt-in: on the 2-vCPU Xeon guests we run on, AMX was 2x slower at batch 1 in sessions 16-17 (the host's AMX
  throughput swung between samples) and 1.1x / 1.9x faster at batch 1 / 8 in session 18.
- ``auto``: ours when it is available (CPU flags + a working gcc), else oneDNN. Ours measured
  faster on every SmolLM2 shape at M = 1-64 (2-core Zen4: ~40 GB/s vs ~20 at M = 1) and on par
  at prefill sizes (M = 256-1024: both at the bf16 dot-product peak), so there is no M threshold
  (which would also need a second packed copy of every weight).

Numerics: bf16 in, fp32 accumulate, bf16 out; the two kernels sum in different orders, so they
agree within bf16 rounding, not bitwise. Export is not supported on a packed model: keep the
unpacked module for save_pretrained.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
from torch import nn

from torchinferno.errors import ConfigError
from torchinferno.kernels import cpu_gemv
from torchinferno.kernels.module_swap import replace_linears

KERNELS = ("auto", "onednn", "avx512bf16", "amx")
KERNEL_HELP = ("kernel of the pre-packed CPU bf16 linears (auto: avx512bf16 where available, else onednn; amx: "
               "avx512bf16's packing with AMX bf16 tiles allowed, Sapphire Rapids and later)")  # --cpu-gemv
_default_kernel = ["auto"]  # what prepack_linears(kernel=None) uses; set by use_kernel()


def can_prepack(dtype: torch.dtype) -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def resolve_kernel(kernel: str, dtype: torch.dtype = torch.bfloat16) -> str:
    """"onednn" or "avx512bf16" for a requested name; ConfigError for a bad or unavailable one."""
    if kernel not in KERNELS:
        raise ConfigError(f"unknown CPU GEMV kernel '{kernel}' (valid: {', '.join(KERNELS)})")
    if kernel == "onednn" or dtype != torch.bfloat16:
        return "onednn"
    if cpu_gemv.load() is None:
        if kernel in ("avx512bf16", "amx"):
            raise ConfigError(f"CPU GEMV kernel {kernel} is unavailable here ({cpu_gemv.unavailable_reason()}); "
                              "use auto or onednn")
        return "onednn"
    if kernel == "amx" and not cpu_gemv.amx_available():
        raise ConfigError("CPU GEMV kernel amx: this CPU or kernel grants no AMX bf16 tiles; use auto, avx512bf16 "
                          "or onednn")
    return "avx512bf16"


@contextlib.contextmanager
def use_kernel(kernel: str) -> Iterator[None]:
    """Within this block, ``prepack_linears(model)`` (no ``kernel=``) packs for ``kernel``.

    For callers that reach ``prepack_linears`` through code they do not own (bench-generate's
    ``--cpu-gemv``). Validates the name up front.
    """
    resolve_kernel(kernel)
    old = _default_kernel[0]
    _default_kernel[0] = kernel
    try:
        yield
    finally:
        _default_kernel[0] = old


# oneDNN's bf16 kernels stream the weights faster at M = 4 rows than at M = 1 (about 5% of a
# SmolLM2 batch-1 decode step on a 2-core AVX512-BF16 EPYC). Fewer rows are zero-padded to this
# many: a row's result depends on M (the kernel's blocking), never on the other rows' values.
MIN_ROWS = 4


class PackedLinear(nn.Module):
    """y = x @ W^T (+ b) with W pre-packed for one kernel (see the module docstring). x [..., K] -> [..., N].

    ``gemv`` is the plain 2-D call (x [M, K] -> y [M, N]) that ``forward`` and the lean llama3
    decode step both run; inputs of fewer than ``min_rows`` rows are computed zero-padded to that
    many (:data:`MIN_ROWS` for oneDNN, 1 for ours), so both paths run each GEMV at the same M.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, batch_hint: int = 1,
                 kernel: str = "auto"):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        w = weight.detach()
        self.kernel = resolve_kernel(kernel, w.dtype) if w.numel() else "onednn"
        self.register_buffer("bias", None if bias is None else bias.detach().clone(), persistent=False)
        self.gemv: Callable[[torch.Tensor], torch.Tensor]
        if self.kernel == "avx512bf16":
            packed = cpu_gemv.pack_weight(w)  # [ceil(N/64), ceil(K/2), 64, 2]
            self.register_buffer("packed_weight", packed, persistent=False)
            self.gemv = cpu_gemv.make_gemv(cpu_gemv.load(), packed, self.out_features, self.in_features, self.bias)
            self.min_rows = 1
        else:
            packed = torch.ops.mkldnn._reorder_linear_weight(w, batch_hint)
            self.register_buffer("packed_weight", packed, persistent=False)
            b, op = self.bias, torch.ops.mkldnn._linear_pointwise
            self.gemv = lambda x: op(x, packed, b, "none", [], "")
            self.min_rows = MIN_ROWS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        rows = x2.shape[0]
        if 0 < rows < self.min_rows:
            x2 = torch.cat((x2, x2.new_zeros(self.min_rows - rows, shape[-1])))
        y = self.gemv(x2)
        return y[:rows].view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed={self.kernel}"


def prepack_linears(model: nn.Module, kernel: str | None = None) -> int:
    """Swap every CPU bf16 ``nn.Linear`` in ``model`` for a :class:`PackedLinear`; returns the count.

    ``kernel`` is one of :data:`KERNELS` (None: "auto", or what an enclosing :func:`use_kernel`
    set); a bad name or an unavailable "avx512bf16" raises ConfigError before anything changes.

    Only modules of exact type ``nn.Linear`` are packed (the walk is ``module_swap.replace_linears``):
    subclasses declare that their owner reads ``.weight`` directly (``DirectWeightLinear``, e.g. MLA's
    ``kv_b_proj``) or that they run in fp32 (``FP32Linear``), and stay as they are.

    A model exposing ``head_weight()`` and a ``packed_head`` slot also gets its logits projection
    packed (this covers a head tied to the embedding, which is not an ``nn.Linear``). A family's lean CPU
    decode step (``make_cpu_decode_step``) builds on the packed weights when a runner wraps the model
    (``models/common/step_model``).
    """
    kernel = _default_kernel[0] if kernel is None else kernel
    resolve_kernel(kernel)  # validate once, even for a model with nothing to pack
    count = 0
    head = getattr(model, "lm_head", None)
    if (getattr(model, "packed_head", False) is None and callable(getattr(model, "head_weight", None))
            and (head is None or type(head) is nn.Linear)):  # a head swapped already (FP8, NVFP4) stays as it is
        w = model.head_weight()  # read before the lm_head Linear (if any) is dropped below
        if w.device.type == "cpu" and can_prepack(w.dtype):
            model.packed_head = PackedLinear(w, kernel=kernel)
            count += 1
            if head is not None:
                model.lm_head = None  # the packed head replaces it; keep one copy in memory

    def pack(name: str, lin: nn.Linear) -> nn.Module | None:
        if lin.weight.device.type == "cpu" and can_prepack(lin.weight.dtype):
            return PackedLinear(lin.weight, lin.bias, kernel=kernel)
        return None

    count += len(replace_linears(model, pack))
    return count
