"""The grouped-GEMM MoE path (kernels/grouped_mm_moe.py: torch's grouped GEMM over expert-sorted rows, the Triton
combine of kernels/triton/moe_combine.py) against the torch references; checks in grouped_mm_moe_checks.py.

On CPU: the sort, the torch combine and the whole path (torch's grouped GEMM runs on CPU too) == the grouped
reference, with a sabotage control; on Triton's interpreter the same with the Triton combine and SwiGLU. On CUDA
(skipped without): the policy's token threshold picks the path, it equals the Triton grouped path, and it replays
from a CUDA graph. The policy stored with the package leaves the path off until a GPU run measured it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import grouped_mm_moe_checks as C  # noqa: E402

from torchinferno.kernels import grouped_mm_moe  # noqa: E402

needs_grouped_mm = pytest.mark.skipif(not grouped_mm_moe.available(), reason="torch without _grouped_mm")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_sort_pairs_matches_the_oracle():
    C.check_sort(torch.device("cpu"))


def test_torch_combine_matches_a_float64_loop():
    C.check_combine(torch.device("cpu"))


@needs_grouped_mm
def test_grouped_mm_experts_match_the_reference_on_cpu():
    C.check_experts(torch.device("cpu"))


def test_not_taken_where_it_does_not_apply():
    """CPU tensors, fp32, a clamp, droppable ids or shared experts: ``applies`` is False, so ``fused_experts``
    keeps its other paths whatever the policy says."""
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    gu = torch.zeros(2, 6, 8, dtype=torch.bfloat16)
    assert not grouped_mm_moe.applies(x, gu, None, False, None)  # CPU
    if torch.cuda.is_available():
        xc, gc = x.cuda(), gu.cuda()
        assert not grouped_mm_moe.applies(xc.float(), gc.float(), None, False, None)
        assert not grouped_mm_moe.applies(xc, gc, 7.0, False, None)
        assert not grouped_mm_moe.applies(xc, gc, None, True, None)
        assert not grouped_mm_moe.applies(xc, gc, None, False, (gc[0], gc[0]))


@needs_grouped_mm
def test_grouped_mm_on_the_triton_interpreter(interpreter_check):
    interpreter_check("grouped_mm_moe_checks.py", "kernels")


@cuda
@needs_grouped_mm
def test_grouped_mm_moe_cuda():
    dev = torch.device("cuda")
    C.check_sort(dev)
    C.check_combine(dev)
    C.check_combine(dev, torch.bfloat16)
    C.check_experts(dev)
    C.check_experts(dev, T=2048, K=6, E=64, D=256, inter=128)  # prefill-sized, ~190 pairs an expert
    C.check_policy(dev)
    C.check_graph(dev)
