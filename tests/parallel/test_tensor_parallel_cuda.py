"""The NCCL path: the same sharding code on CUDA ranks (rank r on cuda:r); skips without 2 CUDA devices."""

import pytest
import torch

from torchinferno.parallel.checks import compare_tp

needs_two = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")


@needs_two
@pytest.mark.parametrize("kinds", [("llama3", "deepseek-v3.2", "dsv4", "deepseek-v4")])
def test_tp2_on_nccl_equals_one_device(kinds):
    assert compare_tp(kinds, 2, device="cuda", atol=1e-4) == ""
