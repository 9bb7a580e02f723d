"""Pre-packed oneDNN CPU linears give the same results as nn.Linear (bf16)."""

import pytest
import torch

from torchinferno.kernels.cpu_linear import PackedLinear, can_prepack, prepack_linears
from torchinferno.testing import tiny_model

pytestmark = pytest.mark.skipif(not can_prepack(torch.bfloat16), reason="oneDNN bf16 not supported on this CPU")


@pytest.mark.parametrize("rows", [1, 3, 17])
def test_packed_linear_matches_linear(rows):
    lin = torch.nn.Linear(96, 160, bias=True).to(torch.bfloat16)
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    torch.testing.assert_close(PackedLinear(lin.weight, lin.bias)(x).float(), lin(x).float(), atol=2e-2, rtol=2e-2)


def test_prepacked_model_matches_unpacked():
    ref = tiny_model("llama3", dtype=torch.bfloat16)
    packed = tiny_model("llama3", dtype=torch.bfloat16)
    n = prepack_linears(packed)
    assert n == 2 * 4 + 1  # qkv, o, gate_up, down per layer + the head
    assert not any(isinstance(m, torch.nn.Linear) for m in packed.modules())
    ids = torch.randint(0, 250, (11,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = ref.compute_logits(ref(ids, torch.arange(11)))
        b = packed.compute_logits(packed(ids, torch.arange(11)))
    torch.testing.assert_close(b, a, atol=3e-2, rtol=3e-2)
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.9


@pytest.mark.parametrize("family", ["deepseek-v3.2", "dsv4"])
def test_prepacked_mla_families_generate(family):
    """MLA reads ``kv_b_proj.weight`` directly (expanded and absorbed attention): packing must leave
    it a plain weight (it used to become a PackedLinear: "'PackedLinear' object has no attribute 'weight'")."""
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.generate import generate
    from torchinferno.models.common.layers import DirectWeightLinear

    ref = tiny_model(family, dtype=torch.bfloat16)
    packed = tiny_model(family, dtype=torch.bfloat16)
    assert prepack_linears(packed) > 0
    assert all(isinstance(layer.self_attn.kv_b_proj, DirectWeightLinear) for layer in packed.model.layers)
    assert isinstance(packed.model.layers[0].self_attn.o_proj, PackedLinear)
    prompts = [[5, 9, 17, 33, 2], [100, 4, 4]]
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    out = generate(packed, prompts, sp)  # prefill (expanded) + decode (absorbed in the default v1)
    assert [len(r.token_ids) for r in out] == [6, 6]
    ids = torch.tensor(prompts[0])
    with torch.no_grad():
        a = ref.compute_logits(ref(ids, torch.arange(5)))
        b = packed.compute_logits(packed(ids, torch.arange(5)))
    torch.testing.assert_close(b, a, atol=5e-2, rtol=5e-2)


def test_model_spec_picks_the_cpu_gemv_kernel():
    """``--cpu-gemv`` of serve / generate: ModelSpec carries the kernel to build_model (here and in the engine-core
    process); a bad name fails in one line listing the valid ones; ``amx`` (where the CPU grants it) packs for our
    kernel and allows the tiles in the building process."""
    from torchinferno.engine.assembly import ModelSpec, build_model
    from torchinferno.errors import ConfigError
    from torchinferno.kernels import cpu_gemv

    with pytest.raises(ConfigError, match="valid: auto, onednn, avx512bf16, amx"):
        ModelSpec(model_kind="llama3", cpu_gemv="tiles")
    model = build_model(ModelSpec(model_kind="llama3", dtype="bfloat16", cpu_gemv="onednn"))
    assert {m.kernel for m in model.modules() if isinstance(m, PackedLinear)} == {"onednn"}
    if not cpu_gemv.amx_available():
        with pytest.raises(ConfigError, match="amx"):
            build_model(ModelSpec(model_kind="llama3", dtype="bfloat16", cpu_gemv="amx"))
        return
    try:
        model = build_model(ModelSpec(model_kind="llama3", dtype="bfloat16", cpu_gemv="amx"))
        assert {m.kernel for m in model.modules() if isinstance(m, PackedLinear)} == {"avx512bf16"}
        assert cpu_gemv._amx_requested == [True]
    finally:
        cpu_gemv.set_amx(False)


def test_serve_and_generate_flags_carry_cpu_gemv():
    import argparse

    from torchinferno.cli.common import add_model_args
    from torchinferno.server.args import add_server_args, model_spec_from_args

    p = argparse.ArgumentParser()
    add_server_args(p)
    assert model_spec_from_args(p.parse_args(["--model", "tiny", "--cpu-gemv", "onednn"])).cpu_gemv == "onednn"
    assert model_spec_from_args(p.parse_args(["--model", "tiny"])).cpu_gemv == "auto"
    g = argparse.ArgumentParser()
    add_model_args(g)
    assert g.parse_args(["--cpu-gemv", "amx"]).cpu_gemv == "amx"
    with pytest.raises(SystemExit):  # argparse lists the choices
        g.parse_args(["--cpu-gemv", "tiles"])
