"""GGUF blocks kept at conversion and multiplied natively (kernels/cpu_quant_linear.py) on the tiny GGUF.

The tiny file mixes formats (Q4_1, Q4_0, Q8_0 embedding, and Q5_0/Q5_1/F16 the kernel lacks), so a
merged projection with an unsupported shard must stay bf16. Oracles: gguf's own dequantization of the
kept bytes equals the converted float weights exactly; the quantized model's logits track the
dequantized model's (only the activation's int8 rounding differs).
"""

from __future__ import annotations

import pytest
import torch

from torchinferno.checkpoint import iter_tensors
from torchinferno.checkpoint.auto import load_model_auto
from torchinferno.errors import ConfigError
from torchinferno.kernels import cpu_qgemv
from torchinferno.kernels.cpu_linear import PackedLinear
from torchinferno.kernels.cpu_quant_linear import (
    QuantLinear,
    quantize_block_linears,
    read_blocks,
)

pytestmark = pytest.mark.skipif(cpu_qgemv.load() is None, reason=f"quantized GEMV unavailable: "
                                                                  f"{cpu_qgemv.unavailable_reason()}")


def test_kept_blocks_dequantize_to_the_converted_weights(tiny_gguf_converted):
    blocks = read_blocks(tiny_gguf_converted)
    floats = dict(iter_tensors(tiny_gguf_converted))
    expect = {  # the formats the kernel reads, as the fixture wrote them (layer 1: v Q5_0, up Q5_1, down Q4_0)
        "model.layers.0.self_attn.q_proj.weight": "q4_1", "model.layers.1.self_attn.k_proj.weight": "q4_1",
        "model.layers.1.mlp.down_proj.weight": "q4_0", "model.embed_tokens.weight": "q8_0",
    }
    for name, fmt in expect.items():
        assert blocks[name][0] == fmt, name
    assert "model.layers.1.self_attn.v_proj.weight" not in blocks and "lm_head.weight" not in blocks
    for name, (fmt, raw) in blocks.items():  # q/k rows un-permuted with their blocks: bitwise the float weights
        assert torch.equal(cpu_qgemv.dequantize_blocks(raw, fmt), floats[name]), name


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.compute_logits(model(ids, torch.arange(ids.numel())))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_model_tracks_dequantized_model(tiny_gguf_converted, dtype):
    ref = load_model_auto(tiny_gguf_converted, dtype=dtype)
    model = load_model_auto(tiny_gguf_converted, dtype=dtype)
    n = quantize_block_linears(model, "gguf", tiny_gguf_converted)
    layers = model.model.layers
    assert isinstance(layers[0].self_attn.qkv_proj, QuantLinear) and layers[0].self_attn.qkv_proj.kernel == "q4_1"
    assert isinstance(layers[1].mlp.down_proj, QuantLinear) and layers[1].mlp.down_proj.kernel == "q4_0"
    assert type(layers[1].self_attn.qkv_proj) is torch.nn.Linear  # v is Q5_0: the merged module stays float
    assert type(layers[1].mlp.gate_up_proj) is torch.nn.Linear  # up is Q5_1
    assert model.packed_head is None and n == 6  # the head is F16 in the file: stays float
    ids = torch.arange(3, 40)
    got, want = _logits(model, ids), _logits(ref, ids)
    assert got.dtype == torch.float32 and got.shape == want.shape
    rel = (got - want).norm() / want.norm()
    assert rel < 0.05, rel
    assert rel > 0  # the activation really is quantized (not silently the float path)


def test_quantize_any_model_q8_0_q4_0(tiny_gguf_converted):
    ref = load_model_auto(tiny_gguf_converted, dtype=torch.bfloat16)
    ids = torch.arange(3, 30)
    want = _logits(ref, ids)
    errs = {}
    for fmt in ("q8_0", "q4_0", "q4_1"):
        model = load_model_auto(tiny_gguf_converted, dtype=torch.bfloat16)
        assert quantize_block_linears(model, fmt) == 2 * 4 + 1  # every linear and the (untied) head
        assert isinstance(model.packed_head, QuantLinear) and model.lm_head is None
        errs[fmt] = ((_logits(model, ids) - want).norm() / want.norm()).item()
    assert errs["q8_0"] < 0.05 and errs["q4_0"] < 0.35 and errs["q4_1"] < 0.35, errs  # random tiny logits: loose
    assert errs["q8_0"] < errs["q4_0"], errs  # 8 bits are closer than 4


def test_lean_decode_step_runs_on_quant_linears(tiny_gguf_converted):
    """The engine path: the lean CPU step takes QuantLinear as a packed linear; greedy tokens of the module path."""
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.generate import StaticGenerator
    from torchinferno.kernels.cpu_linear import prepack_linears
    from torchinferno.models.common.step_model import LeanStepModel, step_model

    model = load_model_auto(tiny_gguf_converted, dtype=torch.bfloat16)
    quantize_block_linears(model, "q4_1")
    prepack_linears(model)  # nothing left to pack but a no-op must keep the quantized modules
    assert all(isinstance(m, QuantLinear) for m in model.modules() if isinstance(m, PackedLinear))
    assert isinstance(step_model(model, "cpu"), LeanStepModel)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12]]
    gen = StaticGenerator(model, 2, 16)
    assert isinstance(gen.model, LeanStepModel)
    lean = [r.token_ids for r in gen.generate(prompts, params)]
    gen.model = model  # the module path: the same QuantLinear calls, row for row
    plain = [r.token_ids for r in gen.generate(prompts, params)]
    assert lean == plain and all(len(t) == 12 for t in lean)


def test_gguf_quantization_needs_kept_blocks(tmp_path, tiny_gguf_converted):
    model = load_model_auto(tiny_gguf_converted, dtype=torch.bfloat16)
    with pytest.raises(ConfigError, match="no GGUF blocks"):
        quantize_block_linears(model, "gguf", tmp_path)
    with pytest.raises(ConfigError, match="unknown block quantization"):
        quantize_block_linears(model, "q5_k")


def test_dtype_auto_keeps_a_gguf_models_blocks(tiny_gguf, tiny_gguf_converted, tmp_path):
    from torchinferno.engine.assembly import ModelSpec, build_model, resolve_auto

    spec = resolve_auto(ModelSpec(model=str(tiny_gguf.path), dtype="auto", cache_dir=str(tmp_path)))
    assert (spec.dtype, spec.quantization) == ("bfloat16", "gguf")
    model = build_model(ModelSpec(model=str(tiny_gguf.path), dtype="auto", cache_dir=str(tmp_path)))
    assert isinstance(model.model.layers[0].mlp.gate_up_proj, QuantLinear)
    explicit = resolve_auto(ModelSpec(model=str(tiny_gguf.path), dtype="auto", quantization="q8_0",
                                      cache_dir=str(tmp_path)))
    assert explicit.quantization == "q8_0"  # an asked quantization wins
    (tmp_path / "plain").mkdir()
    for f in ("config.json", "model.safetensors"):
        (tmp_path / "plain" / f).write_bytes((tiny_gguf_converted / f).read_bytes())
    plain = resolve_auto(ModelSpec(model=str(tmp_path / "plain"), dtype="auto"))
    assert (plain.dtype, plain.quantization) == ("bfloat16", "none")  # not a GGUF: nothing to keep
    with pytest.raises(ConfigError, match="needs a GGUF model"):
        resolve_auto(ModelSpec(model=str(tmp_path / "plain"), quantization="gguf"))
    with pytest.raises(ConfigError, match="CPU only"):
        resolve_auto(ModelSpec(model=str(tiny_gguf.path), quantization="q4_1", device="cuda"))
