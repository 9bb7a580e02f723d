"""Shared fixtures: tiny random models (see torchinferno.testing)."""

import pytest
import torch

from torchinferno.testing import tiny_model


@pytest.fixture
def one_thread():
    """One intra-op thread for the test (restored after): stable, fast timings on a shared 2-core
    machine, where OpenMP barriers with a descheduled sibling thread cost milliseconds per op."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_llama():
    return tiny_model("llama3")


@pytest.fixture
def cuda_dev():
    """The device string for GPU tests ("cuda"); skips cleanly without a CUDA device or Triton."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from torchinferno.kernels import triton as tri

    if not tri.available():
        pytest.skip("needs Triton")
    return "cuda"


@pytest.fixture
def cuda_tiny_llama(cuda_dev):
    """The tiny llama on CUDA with the Triton paged attention backend."""
    from torchinferno.models.common.attention_triton import TritonPagedAttention

    return tiny_model("llama3", device=cuda_dev, attention_backend=TritonPagedAttention)


@pytest.fixture(autouse=True)
def _small_cuda_kv_pools(monkeypatch):
    """CUDA tests keep several engines alive at once; the default pool takes what --gpu-memory-utilization
    leaves of the whole device, so the second engine would find none. Here an engine that did not size its
    pool gets 1 GiB (the sizing rule itself is exercised by benchmarks/serve_vs_offline.py on the H200)."""
    if not torch.cuda.is_available():
        yield
        return
    from dataclasses import replace

    from torchinferno.engine import executor, kv_sizing

    def plan(model, spec, dtype, config, want_len, device):
        if torch.device(device).type == "cuda" and config.num_gpu_blocks is None and config.kv_cache_memory is None:
            config = replace(config, kv_cache_memory=1024**3)
        return kv_sizing.plan_kv_cache(model, spec, dtype, config, want_len, device)

    monkeypatch.setattr(executor, "plan_kv_cache", plan)
    yield
