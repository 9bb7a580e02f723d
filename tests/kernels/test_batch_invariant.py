"""``batch_invariant``: one request's tokens and logprobs in bf16 are bitwise the same alone and inside batches
of 1..31 mixed requests (greedy and seeded), for every family; without the flag the llama3 case differs."""

import random

import pytest
import torch
import torch.nn.functional as F

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.errors import ConfigError
from torchinferno.kernels.batch_invariant import BatchInvariantLinear, make_batch_invariant, tiled_linear
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


def _target_outputs(model, others, params, invariant: bool):
    eng = LLMEngine(model, None, max_model_len=256, batch_invariant=invariant)
    for i, o in enumerate(others):
        eng.add_request(f"o{i}", o, SamplingParams(max_tokens=rng.randrange(4, 30), temperature=0.7, seed=i,
                                                    ignore_eos=True))
    eng.add_request("t", TARGET, params)
    lps = []
    final = None
    while eng.has_unfinished():
        for out in eng.step():
            if out.request_id == "t":
                lps += [(lp.logprob, lp.top_logprobs) for lp in out.logprobs or []]
                final = out
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


def test_refuses_cuda_in_one_line(monkeypatch):
    model = tiny_model("llama3")
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda")), raising=False)
    with pytest.raises(ConfigError, match="CPU only"):
        make_batch_invariant(model)
