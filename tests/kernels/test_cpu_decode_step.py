"""The native CPU decode step (``kernels/cpu_decode_step.c``) vs llama3's Python lean step (the module path's ops).

The C step mirrors the module path's roundings (bf16 residual, norm, rotary, SwiGLU), but computes attention,
rsqrt and exp in its own order, so it agrees within bf16 rounding, not bitwise: hidden states are compared with
a tolerance that a wrong layer, head, rotary half, cache slot or block walk exceeds by orders of magnitude, the
KV caches it writes must be equal, and whole greedy generations must give the same tokens.
"""

from __future__ import annotations

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.generate import StaticGenerator
from torchinferno.kernels import cpu_decode_step
from torchinferno.kernels.cpu_linear import can_prepack, prepack_linears
from torchinferno.models.common.attention_metadata import build_attention_metadata
from torchinferno.models.llama3 import config as llama_cfg
from torchinferno.models.llama3.cpu_decode import CpuDecodeStep
from torchinferno.models.registry import get_family
from torchinferno.testing import randomize_

pytestmark = pytest.mark.skipif(not can_prepack(torch.bfloat16) or cpu_decode_step.load() is None,
                                reason="needs AVX512-BF16/VNNI and gcc (the native step is unavailable here)")


def _model(quant: str | None = None, **overrides):
    """A tiny random bf16 llama3 (GQA 6 heads over 2 KV heads of 32 dims unless overridden), packed for our kernels."""
    fam = get_family("llama3")
    cfg = llama_cfg.debug_config(**({"hidden_size": 192, "num_attention_heads": 6, "num_key_value_heads": 2,
                                     "intermediate_size": 256} | overrides))
    torch.manual_seed(0)
    m = randomize_(fam.build(cfg, device="cpu").to(torch.bfloat16).eval())
    m.family = fam
    if quant is not None:
        from torchinferno.kernels.cpu_quant_linear import quantize_block_linears

        quantize_block_linears(m, quant)
    prepack_linears(m, kernel="avx512bf16")
    return m


def _one_step(model, rows, prompt_lens, block_size, cache_dtype=torch.float32):
    """Prefill each sequence into its blocks, then one decode step through the Python lean step and the native
    step: returns ((python hidden, caches), (native hidden, caches))."""
    g = torch.Generator().manual_seed(3)
    B = len(prompt_lens)
    spec = model.family.kv_spec(model.config)
    caches = spec.allocate(num_blocks=max(max(r) for r in rows) + 1, block_size=block_size, dtype=cache_dtype,
                           device="cpu")
    prompt = [torch.randint(0, model.config.vocab_size, (n,), generator=g) for n in prompt_lens]
    steps = (CpuDecodeStep(model, native=False), CpuDecodeStep(model))
    assert steps[0].native is None and steps[1].native is not None
    outs = []
    with torch.inference_mode():
        meta = build_attention_metadata(prompt_lens, [0] * B, rows, block_size)
        model(torch.cat(prompt), torch.cat([torch.arange(n) for n in prompt_lens]), caches, meta)
        ids = torch.randint(0, model.config.vocab_size, (B,), generator=g)
        pos = torch.tensor(prompt_lens)
        for step in steps:
            cache_copy = [tuple(t.clone() for t in layer) for layer in caches]
            meta = build_attention_metadata([1] * B, prompt_lens, rows, block_size)
            meta.block_tables_host = [list(r) for r in rows]
            outs.append((step(ids, pos, cache_copy, meta), cache_copy))
    return outs


def _assert_close(py, nat):
    (want, want_caches), (got, got_caches) = py, nat
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    err = (got.float() - want.float()).abs().max().item()
    assert err <= 0.02 * want.float().abs().max().item(), err  # bf16 rounding of a few ops, not a wrong term
    for a, b in zip(want_caches, got_caches):  # the same K/V rows at the same slots (later layers' rows inherit the
        for x, y in zip(a, b):                  # hidden state's bf16 rounding differences: not bitwise)
            assert torch.equal(x != 0, y != 0)
            assert (x.float() - y.float()).abs().max().item() <= 0.02 * x.float().abs().max().item()


@pytest.mark.parametrize("rows,prompt_lens,block_size", [
    ([[0]], [7], 32),  # batch 1
    ([[1], [2], [3]], [3, 9, 6], 32),  # ragged lengths
    ([[3], [0], [2]], [6, 6, 6], 32),  # rows out of order
    ([[0, 2, 5], [1, 3, 4]], [17, 12], 8),  # paged: several blocks per sequence, in any order
    ([[b] for b in range(8)], [5 + 3 * b for b in range(8)], 64),  # batch 8: balanced GEMV units across tiles
    ([[b] for b in range(7)], [4 + 2 * b for b in range(7)], 64),  # batch 7: row tiles of 6 and 1
])
def test_native_step_matches_the_python_step(rows, prompt_lens, block_size):
    _assert_close(*_one_step(_model(), rows, prompt_lens, block_size))


@pytest.mark.parametrize("overrides", [
    {"num_attention_heads": 12, "num_key_value_heads": 2, "head_dim": 16},  # 6 query heads per KV head (> MAX_REP)
    {"hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 128},  # no GQA, 128 dims
])
def test_native_step_head_layouts(overrides):
    _assert_close(*_one_step(_model(**overrides), [[0, 2], [1, 3]], [11, 20], 16))


@pytest.mark.parametrize("overrides", [
    {},
    {"num_attention_heads": 12, "num_key_value_heads": 2, "head_dim": 16},  # half a bf16-pair vector: masked
    {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 48},  # 1.5 bf16-pair vectors: masked tail
    {"hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 128},
])
def test_native_step_bf16_cache(overrides):
    """A bf16 cache's scores come from vdpbf16ps on the raw bf16 query and key (any head_dim multiple of 16)."""
    _assert_close(*_one_step(_model(**overrides), [[0, 2], [1, 3]], [11, 20], 16, cache_dtype=torch.bfloat16))


@pytest.mark.parametrize("quant", ["q8_0", "q4_1"])
def test_native_step_on_gguf_block_linears(quant):
    """Quantized linears run the same tiles (and the same int8 activation rounding) as QuantLinear's call."""
    _assert_close(*_one_step(_model(quant), [[0], [1]], [9, 14], 32))


def test_native_step_generates_the_python_steps_tokens():
    model = _model()
    prompts = [[5, 9, 14, 3], [7, 7, 1, 30, 2, 2], [11, 2, 8]]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    gen = StaticGenerator(model, len(prompts), 32)
    assert gen.model.step.native is not None
    calls = []
    native = gen.model.step.native
    fn = native.fn
    native.fn = lambda *a: (calls.append(1), fn(*a))[1]
    got = [r.token_ids for r in gen.generate(prompts, params)]
    gen.model.step = CpuDecodeStep(model, native=False)
    want = [r.token_ids for r in gen.generate(prompts, params)]
    assert got == want and len(calls) == 15  # every decode step ran natively


def test_falls_back_where_it_does_not_apply():
    model = _model()
    prepacked_onednn = _model()
    from torchinferno.kernels.cpu_linear import PackedLinear

    # a linear on oneDNN: no native step (the Python step still runs it)
    prepacked_onednn.model.layers[0].mlp.down_proj = PackedLinear(torch.randn(192, 256).bfloat16(), kernel="onednn")
    assert CpuDecodeStep(prepacked_onednn).native is None
    assert not cpu_decode_step.NativeDecodeStep.supported(torch.float16, 64)
    assert not cpu_decode_step.NativeDecodeStep.supported(torch.float32, 24)  # head_dim not a multiple of 16
    assert CpuDecodeStep(model).native is not None


@pytest.mark.slow
def test_real_model_native_step_as_accurate_as_the_python_step():
    """SmolLM2 bf16, teacher-forced over 39 decode positions: the native step's logits are as close to the fp32
    model's as the Python step's (the module path's numbers), and pick the same tokens about as often."""
    from torchinferno.checkpoint.auto import load_model_auto

    model = load_model_auto("smollm2-135m-instruct", dtype=torch.bfloat16)
    prepack_linears(model)
    ref = load_model_auto("smollm2-135m-instruct", dtype=torch.float32)
    seq = torch.randint(10, model.config.vocab_size, (48,), generator=torch.Generator().manual_seed(0))
    spec = model.family.kv_spec(model.config)

    def logits(step, m):
        caches = spec.allocate(num_blocks=4, block_size=16, dtype=torch.float32, device="cpu")
        rows, P, out = [[0, 1, 2, 3]], 8, []
        with torch.inference_mode():
            m(seq[:P], torch.arange(P), caches, build_attention_metadata([P], [0], rows, 16))
            for p in range(P, 47):
                meta = build_attention_metadata([1], [p], rows, 16)
                meta.block_tables_host = rows
                ids, pos = seq[p : p + 1], torch.tensor([p])
                h = step(ids, pos, caches, meta) if step is not None else m(ids, pos, caches, meta)
                out.append(m.compute_logits(h).float())
        return torch.cat(out)

    want = logits(None, ref)
    python = logits(CpuDecodeStep(model, native=False), model)
    native = logits(CpuDecodeStep(model), model)
    err_py, err_nat = (python - want).abs().mean().item(), (native - want).abs().mean().item()
    assert err_nat <= 1.25 * err_py, (err_nat, err_py)
    agree_py = (python.argmax(-1) == want.argmax(-1)).float().mean().item()
    agree_nat = (native.argmax(-1) == want.argmax(-1)).float().mean().item()
    assert agree_nat >= agree_py - 0.08, (agree_nat, agree_py)


def test_use_step_picks_the_default_for_steps_built_inside():
    from torchinferno.errors import ConfigError

    model = _model()
    with cpu_decode_step.use_step("python"):
        assert CpuDecodeStep(model).native is None
        assert CpuDecodeStep(model, native=True).native is not None  # an explicit choice wins
    assert CpuDecodeStep(model).native is not None
    with pytest.raises(ConfigError, match="valid: native, python"), cpu_decode_step.use_step("fast"):
        pass
    from torchinferno.cli.main import build_parser

    assert build_parser().parse_args(["bench-generate", "m", "--cpu-step", "python"]).cpu_step == "python"
