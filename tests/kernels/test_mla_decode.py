"""MLA absorbed decode over the paged latent cache (kernels/mla_decode.py: the split-K Triton decode kernel with
one shared 576-dim latent head) against the torch reference, and DeepSeek models decoding through it.

Interpreter (``TRITON_INTERPRET=1`` subprocess, CPU): the kernel vs ``mla_absorbed_attention`` (fp32 1e-5, fp16),
``write_latent`` skipping padded slots; the query placed in the decode query buffer (no concatenation); the fused
MLA prologue (latent RMSNorm, both ropes, cache append in one launch) == the unfused ops; tiny deepseek-v3 / dsv4 models (fused variant: paged MLA + fused MoE) and deepseek-v4 (static decode + sparse-sink kernel)
== the v0 reference through ``CudaGraphDecodeRunner``'s padded buckets, and which models declare
``supports_cuda_graphs``. On CUDA (skipped without): the same, with the buckets captured as CUDA graphs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("check", ["kernel", "prologue", "head_gemv", "models", "step"])
def test_mla_decode_on_the_triton_interpreter(check, interpreter_check):
    interpreter_check("mla_decode_checks.py", check)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mla_paged_decode_cuda(dtype):
    sys.path.insert(0, str(HERE))
    import mla_decode_checks as C

    C.check_kernel(torch.device("cuda"), dtype)
    C.check_kernel(torch.device("cuda"), dtype, lens=(1, 700, 4000), H=16, dn=128, dv=128, R=512, r=64)
    C.check_kernel(torch.device("cuda"), dtype, lens=(5, 300), H=40, dn=128, dv=128, R=512, r=64)  # 3 head blocks
    C.check_kernel(torch.device("cuda"), dtype, lens=(5, 300), H=40, dn=128, dv=128, R=512, r=64, kernel="gqa")
    C.check_kernel(torch.device("cuda"), dtype, lens=(1, 700, 4000), H=16, dn=128, dv=128, R=512, r=64,
                   fp8_cache=True)
    C.check_prologue(torch.device("cuda"), dtype)
    C.check_prologue(torch.device("cuda"), dtype, T=7, H=16, dn=128, R=512, r=64, bs=16)  # the V2-Lite shape
    C.check_prologue(torch.device("cuda"), dtype, fp8_cache=True)
    from torchinferno.models.deepseek_v32.cuda_decode import DEFAULT_CONFIGS as tiles

    for pdl in (False, torch.cuda.get_device_capability()[0] >= 9):  # the V2-Lite shape at the step's tiles
        C.check_head_gemv(torch.device("cuda"), dtype, H=16, dn=128, dv=128, R=512, r=64, pdl=pdl,
                          configs=(tiles["absorb_q"], tiles["absorb_o"]))


@cuda
def test_mla_models_decode_from_cuda_graphs():
    sys.path.insert(0, str(HERE))
    import mla_decode_checks as C

    C.check_models(torch.device("cuda"))


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deepseek_decode_gemv_step_matches_the_module_path(dtype):
    """The batch-1 step (models/deepseek_v32/cuda_decode.py) on CUDA, with PDL where the GPU has it, both paths
    identical otherwise; the engine wraps a deepseek-v3 model with it (step_model)."""
    sys.path.insert(0, str(HERE))
    import mla_decode_checks as C

    from torchinferno.models.common.step_model import LeanStepModel, step_model
    from torchinferno.testing import tiny_model

    dev = torch.device("cuda")
    C.check_step(dev, dtype, pdl=torch.cuda.get_device_capability()[0] >= 9)
    model = tiny_model("deepseek-v3.2", "debug-v3", variant="v1", device=dev).to(dtype)
    assert isinstance(step_model(model, dev), LeanStepModel)
    assert step_model(tiny_model("deepseek-v3.2", "debug", variant="v1", device=dev), dev).__class__ is not LeanStepModel


def test_mla_split_plan_fills_the_sms_and_respects_the_table():
    from torchinferno.kernels.mla_decode import MLA_MAX_SPLITS, mla_num_splits

    cpu = torch.device("cpu")  # 132 SMs assumed off CUDA, as an H100 / H200
    assert mla_num_splits(1, 4096, cpu) == MLA_MAX_SPLITS
    assert mla_num_splits(8, 1024, cpu) == 8
    assert mla_num_splits(1, 144, cpu) == 1 and mla_num_splits(1, 256, cpu) == 2  # a split per 128 rows at most
    assert mla_num_splits(1, 16, cpu) == 1
    assert mla_num_splits(64, 4096, cpu) == 4 and mla_num_splits(256, 4096, cpu) == 1  # about two waves
    assert all(n & (n - 1) == 0 for b in range(1, 300, 7) for n in [mla_num_splits(b, 2048, cpu)])
