"""Kernel tests: GPU tests need CUDA and Triton and skip cleanly elsewhere."""

import pytest
import torch

from torchinferno.kernels import triton as tri


@pytest.fixture
def cuda_dev():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if not tri.available():
        pytest.skip("needs Triton")
    return "cuda"
