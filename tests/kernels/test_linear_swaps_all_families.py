"""Every family runs under every runtime linear swap (CPU packing, FP8, NVFP4 all go through
``kernels.module_swap.replace_linears``): a swapped linear exposes no ``.weight``, so a family
must not read the weight of any linear a swap may replace (MLA's ``kv_b_proj`` is a
``DirectWeightLinear`` for that reason). Runs on any CPU: the swap here is a stand-in."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.generate import generate
from torchinferno.kernels.module_swap import replace_linears
from torchinferno.models.registry import family_names
from torchinferno.testing import tiny_model


class OpaqueLinear(nn.Module):
    """Same math as the linear it replaces, with the weight under another name (like PackedLinear / Fp8Linear)."""

    def __init__(self, lin: nn.Linear):
        super().__init__()
        self.register_buffer("packed", lin.weight.detach().clone())
        self.register_buffer("b", None if lin.bias is None else lin.bias.detach().clone())

    def forward(self, x):
        return F.linear(x, self.packed, self.b)


@pytest.mark.parametrize("family", family_names())
def test_every_family_generates_after_its_linears_are_swapped(family):
    ref = tiny_model(family)
    swapped = tiny_model(family)
    assert replace_linears(swapped, lambda name, lin: OpaqueLinear(lin))
    assert not any(type(m) is nn.Linear for m in swapped.modules())
    prompts = [[5, 9, 17, 33, 2], [100, 4, 4]]
    sp = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    want = [r.token_ids for r in generate(ref, prompts, sp)]
    assert [r.token_ids for r in generate(swapped, prompts, sp)] == want


@pytest.mark.parametrize("family", family_names())
def test_every_family_generates_after_fp8_quantization(family):
    from torchinferno.kernels.fp8_linear import quantize_model

    m = tiny_model(family, dtype=torch.bfloat16)
    assert quantize_model(m, "fp8")
    out = generate(m, [[5, 9, 17, 33, 2]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert len(out[0].token_ids) == 4
