"""Shared by the CUDA-graph runner tests (tests/kernels/test_cuda_graphs_*.py): a tiny llama3 and a paged KV cache
filled with random values, plus an untouched copy to run the eager reference on."""

from __future__ import annotations

import torch


def tiny_llama(device, dtype, backend=None):
    from torchinferno.testing import tiny_model

    return tiny_model("llama3", dtype=dtype, device=device, attention_backend=backend)


def random_caches(model, num_blocks: int, block_size: int, dtype, device, g: torch.Generator):
    """``(caches, ref)``: the model's per-layer KV tensors of ``num_blocks`` blocks, random (from ``g``), and a clone."""
    caches = model.family.kv_spec(model.config).allocate(num_blocks, block_size, dtype, device)
    for layer in caches:
        for t in layer:
            t.copy_(torch.randn(t.shape, generator=g).to(dtype))
    return caches, [tuple(t.clone() for t in layer) for layer in caches]
