"""``batch_invariant``: one request's tokens and logprobs in bf16 are bitwise the same alone and inside batches
of 1..31 mixed requests (greedy and seeded), for every family; without the flag the llama3 case differs."""

import random

import pytest
import torch
import torch.nn.functional as F

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.kernels.batch_invariant import (
    BatchInvariantLinear,
    make_batch_invariant,
    tiled_linear,
    tiled_rows,
)
from torchinferno.testing import randomize_, tiny_model


def _llama_hd64():
    """Head dim 64 (SmolLM2's): the shape where CPU SDPA's batched, masked decode differs from a lone row."""
    from torchinferno.models.llama3.config import debug_config
    from torchinferno.models.llama3.model import Llama3ForCausalLM

    torch.manual_seed(0)
    cfg = debug_config(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512)
    return randomize_(Llama3ForCausalLM(cfg)).to(torch.bfloat16).eval()


MODELS = {"llama3": _llama_hd64, "deepseek": lambda: tiny_model("deepseek", dtype=torch.bfloat16),
          "dsv4": lambda: tiny_model("dsv4", dtype=torch.bfloat16)}
rng = random.Random(0)
TARGET = [rng.randrange(3, 250) for _ in range(37)]
OTHERS = [[rng.randrange(3, 250) for _ in range(rng.randrange(5, 120))] for _ in range(31)]


def _target_outputs(model, others, params, invariant: bool, late: int = 0, **engine_kw):
    """The target's (token ids, logprobs) with ``others`` added before the first step, or after ``late`` steps
    (then the target decodes in steps that also prefill prompts)."""
    eng = LLMEngine(model, None, max_model_len=256, batch_invariant=invariant, **engine_kw)
    orng = random.Random(1)

    def add_others():
        for i, o in enumerate(others):
            eng.add_request(f"o{i}", o, SamplingParams(max_tokens=orng.randrange(4, 30), temperature=0.7, seed=i,
                                                        ignore_eos=True))

    if not late:
        add_others()
    eng.add_request("t", TARGET, params)
    lps = []
    final = None
    steps = 0
    while eng.has_unfinished():
        for out in eng.step():
            if out.request_id == "t":
                lps += [(lp.logprob, lp.top_logprobs) for lp in out.logprobs or []]
                final = out
        steps += 1
        if late and steps == late:
            add_others()
    return final.token_ids, lps


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize("params", [SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=2),
                                    SamplingParams(max_tokens=20, temperature=0.9, seed=7, ignore_eos=True, logprobs=2)],
                         ids=["greedy", "seeded"])
def test_alone_equals_inside_any_batch(family, params):
    model = MODELS[family]()
    alone = _target_outputs(model, [], params, True)
    for n in (1, 3, 8, 31):
        assert _target_outputs(model, OTHERS[:n], params, True) == alone, n


def test_without_the_flag_the_batch_shows():
    """The test above can fail: plain batched decode attention changes a lone request's numbers."""
    model = _llama_hd64()
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=2)
    assert _target_outputs(model, OTHERS[:8], params, False) != _target_outputs(model, [], params, False)


def test_tiled_linear_rows_do_not_depend_on_the_batch():
    torch.manual_seed(0)
    w = torch.randn(96, 200, dtype=torch.bfloat16)
    x = torch.randn(37, 200, dtype=torch.bfloat16)
    full = tiled_linear(x, w, 16)
    torch.testing.assert_close(full.float(), F.linear(x, w).float(), rtol=2e-2, atol=2e-2)
    for m in (1, 5, 16, 17):
        assert torch.equal(tiled_linear(x[:m], w, 16), full[:m])
    lin = torch.nn.Linear(200, 96, bias=True).to(torch.bfloat16)
    wrapped = BatchInvariantLinear(lin)
    assert wrapped.weight is lin.weight and torch.equal(wrapped(x)[:3], wrapped(x[:3]))


@pytest.mark.parametrize("family", sorted(MODELS))
def test_decode_rows_mixed_with_prompts(family):
    """Others arrive while the target decodes: its decode rows share steps with their prompts."""
    model = MODELS[family]()
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=2)
    alone = _target_outputs(model, [], params, True)
    assert _target_outputs(model, OTHERS[:8], params, True, late=3) == alone


def test_batch_invariant_config_runs_eager_and_whole_prompts():
    cfg = EngineConfig(batch_invariant=True)
    assert cfg.enforce_eager and not cfg.enable_chunked_prefill and not cfg.enable_prefix_caching
    assert not EngineConfig().enforce_eager


def test_tiled_rows_norm_rows_do_not_depend_on_the_batch():
    from torchinferno.models.common import norm_act_ops
    from torchinferno.models.common.layers import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(64, 1e-6, norm_act_ops.Raw)
    x, r = torch.randn(37, 64, dtype=torch.bfloat16), torch.randn(37, 64, dtype=torch.bfloat16)
    want_y, want_h = norm(x, r)
    norm.row_tile = 16
    y, h = norm(x, r)
    torch.testing.assert_close(y, want_y) and torch.testing.assert_close(h, want_h)
    assert torch.equal(norm(x[:5]), tiled_rows(lambda t: norm_act_ops.Raw.rms_norm(t, norm.weight, 1e-6), 16, x)[:5])
    for m in (1, 16, 17):
        y_m, h_m = norm(x[:m], r[:m])
        assert torch.equal(y_m, y[:m]) and torch.equal(h_m, h[:m])
    assert norm(x.view(37, 2, 32)[:, :, :].reshape(37, 64)).shape == (37, 64)


def test_make_batch_invariant_sets_every_module_and_is_idempotent():
    model = tiny_model("deepseek", dtype=torch.bfloat16)
    first = make_batch_invariant(model)
    assert first["linears"] > 0 and first["row_tiled"] > 0 and first["attention"] > 0
    assert make_batch_invariant(model)["linears"] == 0 and model.batch_invariant


# --- CUDA (bf16, Triton attention backend where the family has one): run by the lead on an H200 ---------------

def _cuda_llama():
    from torchinferno.models.common.attention_triton import TritonPagedAttention

    return tiny_model("llama3", device="cuda", dtype=torch.bfloat16, attention_backend=TritonPagedAttention)


CUDA_MODELS = {"llama3": _cuda_llama, "deepseek": lambda: tiny_model("deepseek", device="cuda", dtype=torch.bfloat16)}


@pytest.mark.cuda
@pytest.mark.parametrize("family", sorted(CUDA_MODELS))
@pytest.mark.parametrize("params", [SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=2),
                                    SamplingParams(max_tokens=16, temperature=0.9, seed=7, ignore_eos=True, logprobs=2)],
                         ids=["greedy", "seeded"])
def test_cuda_alone_equals_inside_any_batch(family, params):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = CUDA_MODELS[family]()
    kw = {"num_gpu_blocks": 1024}  # a small fixed pool: engines built one after another need no memory planning
    alone = _target_outputs(model, [], params, True, **kw)
    assert alone[1], "no logprobs came back"
    for n in (1, 7, 31):
        assert _target_outputs(model, OTHERS[:n], params, True, **kw) == alone, n
    assert _target_outputs(model, OTHERS[:12], params, True, late=3, **kw) == alone, "late arrivals"


def test_triton_backend_takes_the_torch_per_sequence_path_when_invariant(monkeypatch):
    """On CUDA the Triton kernels (split-K decode tiled by batch, varlen prefill) must not run in this mode."""
    import contextlib
    import types

    from torchinferno.models.common import attention_triton
    from torchinferno.models.common.attention_triton import TritonPagedAttention

    calls = []
    fake = types.SimpleNamespace(**{n: (lambda *a, _n=n, **k: calls.append(_n)) for n in
                                    ("write_kv_cache", "batched_paged_decode_attention", "paged_prefill_attention")})
    monkeypatch.setattr(attention_triton, "tri", types.SimpleNamespace(usable=lambda t: True))  # "CUDA with Triton"
    monkeypatch.setattr(attention_triton, "kapi", fake)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    eng = LLMEngine(tiny_model("llama3", attention_backend=TritonPagedAttention), None, max_model_len=128,
                    batch_invariant=True)
    eng.add_request("a", TARGET[:9], params)
    eng.add_request("b", TARGET[:5], params)
    while eng.has_unfinished():
        eng.step()
    assert calls == []
    plain = LLMEngine(tiny_model("llama3", attention_backend=TritonPagedAttention), None, max_model_len=128)
    plain.add_request("a", TARGET[:9], params)
    with contextlib.suppress(TypeError, AttributeError, RuntimeError):  # the fake kernels return nothing
        plain.step()
    assert calls, "without the flag the Triton path is taken (so the check above can fail)"
