"""Fixtures for graph-toolkit tests: one traced tiny llama3 prefill, single-threaded CPU.

One intra-op thread keeps timings stable and fast on a shared 2-core machine (OpenMP barriers
with a descheduled sibling thread cost milliseconds per op).
"""

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_threaded(one_thread):  # tests/conftest.py
    yield


@pytest.fixture(scope="session")
def traced_llama():
    """(model, gm, inputs): tiny llama3, two prompts of 5 tokens, prefill graph with node ids."""
    from torchinferno.graph.model_forward import trace_prefill
    from torchinferno.testing import tiny_model

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = tiny_model("llama3", seed=0)
        gm, inputs = trace_prefill(model, [[5, 17, 99, 3, 250], [1, 2, 3, 4, 5]])
    finally:
        torch.set_num_threads(n)
    return model, gm, inputs
