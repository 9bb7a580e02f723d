"""The step backend of a model, chosen once by whoever runs it (the engine's runner, the static generator, bench-gpu).

A family may offer lean decode steps built on its loaded (and possibly pre-packed) weights:
``make_cpu_decode_step()`` (llama3's AVX512-BF16 GEMV step) and ``make_cuda_decode_step(**options)`` (llama3's fused
batch-1 Triton step). The model itself never installs one: its ``forward`` is always the module path. A runner
wraps the model once, at construction, with ``step_model(model, device)``; the wrapper tries the lean step and
falls back to the modules for batches the step does not handle (it returns None for them). A step that declares
``splits_mixed`` (the lean CPU step) also takes the leading decode rows of a mixed step, the modules the rest: rows of
different sequences never meet in a dense decoder's layers, so the two halves are the whole step's rows, and on a CPU
two passes over the weights cost less than decode rows through the module path's per-layer attention bookkeeping
(SmolLM2, 15 decodes + a 54-token prompt: 161-179 -> 101-104 ms in three alternating rounds, session 30).

Invariants: build the wrapper after every runtime transformation of the model's modules (quantization, pre-packing,
linear swaps): a lean step reads the tensors it was built on. The wrapper is not an ``nn.Module`` (it owns no
parameters); attribute reads fall through to the model, so code written for a family model (CUDA-graph capture,
``.config``, ``.modules()``) takes either.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["LeanStepModel", "cpu_kv_cache_dtype", "step_model", "unwrap"]


class LeanStepModel:
    """``model`` whose forwards try ``step`` first (module docstring)."""

    def __init__(self, model, step):
        self.base = model  # not ``model``: reads of ``.model`` (the decoder stack) fall through to the family model
        self.step = step

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches=None, attn_meta=None) -> torch.Tensor:
        out = self.step(input_ids, positions, kv_caches, attn_meta)  # [T, D] or None: not handled
        if out is not None:
            return out
        nd = self._leading_decodes(kv_caches, attn_meta)
        if nd:  # [nd, D] from the step, the other rows [T - nd, D] from the modules, in the step's row order
            dec = self.step(input_ids[:nd], positions[:nd], kv_caches, attn_meta.sub_batch(0, nd))
            if dec is not None:
                rest = self.base(input_ids[nd:], positions[nd:], kv_caches,
                                 attn_meta.sub_batch(nd, attn_meta.num_seqs))
                return torch.cat((dec, rest))
        return self.base(input_ids, positions, kv_caches, attn_meta)

    def _leading_decodes(self, kv_caches, meta) -> int:
        """How many leading one-token sequences a ``splits_mixed`` step takes out of this mixed step (0: none)."""
        if not getattr(self.step, "splits_mixed", False) or kv_caches is None or meta is None or meta.graph_padded:
            return 0
        nd = meta.num_leading_decodes
        return nd if nd < meta.num_seqs else 0

    forward = __call__

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The step's own head when it has one for this batch (the fused one-row head), else the model's."""
        head = getattr(self.step, "compute_logits", None)
        out = head(hidden) if head is not None else None
        return out if out is not None else self.base.compute_logits(hidden)

    def __getattr__(self, name: str) -> Any:  # only called for names not found on the wrapper
        if name == "base":  # not set yet (copy/unpickle): no recursion
            raise AttributeError(name)
        return getattr(self.base, name)


def step_model(model, device: torch.device | str, lean: bool = True, **cuda_options):
    """``model`` wrapped with its family's lean decode step for ``device``, or ``model`` itself when it has none,
    ``lean`` is False, or the model needs its module path: batch-invariant mode, or a tensor/pipeline shard (the
    steps read whole weights; ``parallel.plan.disable_fused_steps``)."""
    if not lean or getattr(model, "batch_invariant", False) or getattr(model, "sharded", False):
        return model
    kind = torch.device(device).type
    step = None
    if kind == "cuda" and callable(getattr(model, "make_cuda_decode_step", None)):
        step = model.make_cuda_decode_step(**cuda_options)
    elif kind == "cpu" and callable(getattr(model, "make_cpu_decode_step", None)) and _prepacked(model):
        step = model.make_cpu_decode_step()  # the lean CPU step is built for pre-packed weights (kernels/cpu_linear.py)
    return model if step is None else LeanStepModel(model, step)


def cpu_kv_cache_dtype(model) -> torch.dtype:
    """The KV-cache dtype a CPU runner of ``model`` allocates by default.

    The step's ``kv_cache_dtype`` when its lean CPU step reads the cache natively in the activation dtype (the C step
    of kernels/cpu_decode_step: K/V rows are bf16 activations, so a bf16 cache holds exactly what an fp32 one would
    and the step reads half the bytes); else fp32 (TorchAttention computes in fp32 on CPU, and an fp32 cache saves a
    conversion of the whole context on every layer of every step)."""
    wrapped = step_model(model, "cpu")
    return getattr(getattr(wrapped, "step", None), "kv_cache_dtype", None) or torch.float32


def _prepacked(model) -> bool:
    from torchinferno.kernels.cpu_linear import PackedLinear

    return getattr(model, "packed_head", None) is not None or any(isinstance(m, PackedLinear) for m in model.modules())


def unwrap(model):
    """The family model under a ``LeanStepModel`` (or ``model`` itself)."""
    return model.base if isinstance(model, LeanStepModel) else model
