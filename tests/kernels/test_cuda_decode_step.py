"""llama3's fused batch-1 CUDA decode step (models/llama3/cuda_decode.py) vs the module path it replaces."""

from __future__ import annotations

import pytest
import torch

from torchinferno.models.common.attention_metadata import build_attention_metadata
from torchinferno.models.common.step_model import LeanStepModel, step_model


def _model(dev, dtype):
    from torchinferno.models.common.attention_triton import TritonPagedAttention
    from torchinferno.testing import tiny_model

    return tiny_model("llama3", variant="v1", device=dev, attention_backend=TritonPagedAttention).to(dtype)


def _decode_hidden(model, caches, prompt, steps, block_size=4):
    """Prefill ``prompt`` then greedy-decode ``steps`` tokens one at a time; hidden states of every decode step."""
    dev = caches[0][0].device
    blocks = list(range(1, 1 + -(-(len(prompt) + steps) // block_size)))
    meta = build_attention_metadata([len(prompt)], [0], [blocks], block_size, dev)
    ids = torch.tensor(prompt, device=dev)
    h = model(ids, torch.arange(len(prompt), device=dev), caches, meta)
    tok = model.compute_logits(h[-1:]).argmax(-1)
    out = []
    for i in range(steps):
        pos = len(prompt) + i
        meta = build_attention_metadata([1], [pos], [blocks], block_size, dev)
        h = model(tok, torch.tensor([pos], device=dev), caches, meta)
        out.append(h)
        tok = model.compute_logits(h).argmax(-1)
    return torch.cat(out)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype,kv_dtype,tol", [(torch.float32, torch.float32, 1e-5), (torch.bfloat16, torch.bfloat16, 3e-2),
                                                (torch.bfloat16, torch.float8_e4m3fn, 3e-2)])
def test_fused_cuda_decode_step_matches_module_path(cuda_dev, dtype, kv_dtype, tol):
    model = _model(cuda_dev, dtype)
    assert model.make_cuda_decode_step() is not None
    spec = model.family.kv_spec(model.config)
    prompt = [5, 17, 99, 3, 42, 7, 8]
    want_caches = spec.allocate(8, 4, kv_dtype, cuda_dev)
    want = _decode_hidden(model, want_caches, prompt, 5)
    fused = step_model(model, cuda_dev, pdl=False)
    assert isinstance(fused, LeanStepModel)
    got_caches = spec.allocate(8, 4, kv_dtype, cuda_dev)
    got = _decode_hidden(fused, got_caches, prompt, 5)
    rel = float((got.float() - want.float()).norm() / want.float().norm())
    assert rel < tol, rel
    for (kg, vg), (kw, vw) in zip(got_caches, want_caches):  # the step's K/V stores == the module path's appends
        assert float((kg.float() - kw.float()).abs().max()) <= tol * 10 * float(kw.float().abs().max())
        assert float((vg.float() - vw.float()).abs().max()) <= tol * 10 * float(vw.float().abs().max())
    if torch.cuda.get_device_capability()[0] >= 9:  # the same chain with programmatic dependent launch
        got_pdl = _decode_hidden(step_model(model, cuda_dev, pdl=True), spec.allocate(8, 4, kv_dtype, cuda_dev), prompt, 5)
        assert torch.equal(got_pdl, got)


@pytest.mark.cuda
def test_fused_step_declines_what_it_does_not_reproduce(cuda_dev):
    model = _model(cuda_dev, torch.bfloat16)
    step = model.make_cuda_decode_step()
    spec = model.family.kv_spec(model.config)
    caches = spec.allocate(8, 4, torch.bfloat16, cuda_dev)
    two = build_attention_metadata([1, 1], [3, 3], [[1], [2]], 4, cuda_dev)
    assert step(torch.tensor([1, 2], device=cuda_dev), torch.tensor([3, 3], device=cuda_dev), caches, two) is None
    prefill = build_attention_metadata([3], [0], [[1]], 4, cuda_dev)
    assert step(torch.tensor([1, 2, 3], device=cuda_dev), torch.arange(3, device=cuda_dev), caches, prefill) is None
    from torchinferno.kernels.fp8_linear import quantize_model

    if torch.cuda.get_device_capability() >= (8, 9):
        quantize_model(model, "fp8")  # FP8 linears: not this step's math
        assert model.make_cuda_decode_step() is None


@pytest.mark.cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_fused_step_head_matches_the_linear(cuda_dev, dtype, tol):
    """The step's one-row head (decode GEMV) vs ``F.linear``; other row counts are left to the model."""
    model = step_model(_model(cuda_dev, dtype), cuda_dev)
    w = model.head_weight()
    h = torch.randn(1, w.shape[1], device=cuda_dev).to(dtype)
    assert model.step.compute_logits(h) is not None  # the one-row head is the step's, not the fallback
    got = model.compute_logits(h)
    want = torch.nn.functional.linear(h.double(), w.double())
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert float((got.double() - want).norm() / want.norm()) < tol
    assert model.step.compute_logits(h.expand(2, -1).contiguous()) is None


def test_no_fused_cuda_step_on_cpu():
    from torchinferno.testing import tiny_model

    model = tiny_model("llama3", variant="v1")
    assert model.make_cuda_decode_step() is None and step_model(model, "cuda") is model


@pytest.mark.cuda
def test_engine_installs_the_fused_step_and_matches_the_module_path(cuda_dev):
    """Serving path vs plain generation: the engine (CUDA graphs, batch-1 steps through the fused step)
    emits the tokens of the same engine with the module path (fp32, where both agree to ~1e-6)."""
    from torchinferno.core.sampling_params import SamplingParams
    from torchinferno.engine.config import EngineConfig
    from torchinferno.engine.llm_engine import LLMEngine
    from torchinferno.models.llama3.cuda_decode import CudaDecodeStep

    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    kw = {"max_num_seqs": 4, "block_size": 4, "max_model_len": 64}

    def run(model):
        eng = LLMEngine(model, None, EngineConfig(**kw))
        eng.add_request("r", [5, 17, 99, 3, 42], params)
        return eng.run_to_completion()["r"].token_ids, eng.runner.model

    fused_model = _model(cuda_dev, torch.float32)
    got, runner_model = run(fused_model)
    assert isinstance(runner_model, LeanStepModel) and isinstance(runner_model.step, CudaDecodeStep)
    plain_model = _model(cuda_dev, torch.float32)
    plain_model.make_cuda_decode_step = lambda **options: None  # keep the module path
    want, runner_model = run(plain_model)
    assert runner_model is plain_model and got == want


def test_the_model_never_carries_a_step():
    """The model's forward is always the module path: no hook to install or go stale; runners wrap it once, and
    only pre-packed weights get the lean CPU step, only an unsplit batch-invariant-free model a lean step at all."""
    from torchinferno.kernels.cpu_linear import can_prepack, prepack_linears
    from torchinferno.testing import tiny_model

    model = tiny_model("llama3", variant="v1")
    assert not hasattr(model, "decode_step") and not hasattr(model, "enable_cuda_decode_step")
    assert step_model(model, "cpu") is model  # fp32, not pre-packed
    if can_prepack(torch.bfloat16):
        packed = tiny_model("llama3", variant="v1").to(torch.bfloat16)
        prepack_linears(packed)
        assert isinstance(step_model(packed, "cpu"), LeanStepModel)
        packed.batch_invariant = True
        assert step_model(packed, "cpu") is packed
