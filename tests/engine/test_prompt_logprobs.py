"""SamplingParams.prompt_logprobs: logprobs of every prompt token after the first, equal to transformers' (fp32,
eager) whatever the chunking, prefix cache, batch or process boundary (issue 18, item 4: echo + logprobs)."""

import msgspec
import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.core_types import (
    EngineCoreOutput,
    EngineCoreOutputs,
    encoder,
    from_core_decoder,
)
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.engine.outputs import TokenLogprob

transformers = pytest.importorskip("transformers")
K = 3


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from torchinferno.checkpoint.auto import load_model_auto
    from torchinferno.models.llama3.config import Llama3Config, config_to_hf

    cfg = Llama3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, rope_theta=10000.0, max_position_embeddings=128, bos_token_id=1,
                       eos_token_id=2)
    hf_cfg = transformers.LlamaConfig(**{k: v for k, v in config_to_hf(cfg).items() if k not in ("architectures", "model_type")})
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(hf_cfg).eval()
    d = tmp_path_factory.mktemp("plp")
    ref.save_pretrained(d)
    return ref, load_model_auto(d, device="cpu", dtype=torch.float32, variant="v0")


def _oracle(ref, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        lp = torch.log_softmax(ref(torch.tensor([prompt])).logits[0].float(), dim=-1)  # [P, V]
    targets = torch.tensor(prompt[1:])
    return lp[:-1].gather(1, targets.view(-1, 1)).squeeze(1), lp[:-1].topk(K, dim=-1).indices


def _prompts():
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(3, 290, (40,), generator=g).tolist()
    return [shared + torch.randint(3, 290, (n,), generator=g).tolist() for n in (9, 1, 30)] + [[5], [7, 8]]


def _run(engine, prompts, params_for):
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params_for(i))
    firsts = {}
    while engine.has_unfinished() if hasattr(engine, "has_unfinished") else engine.core.has_unfinished():
        for o in engine.step():
            firsts.setdefault(o.request_id, o)
    return [firsts[f"r{i}"] for i in range(len(prompts))]


def _check(ref, prompts, outs):
    for p, o in zip(prompts, outs):
        plp = o.prompt_logprobs
        assert plp is not None and len(plp) == len(p) - 1
        assert [t.token_id for t in plp] == p[1:]
        if len(p) == 1:
            continue
        chosen, top = _oracle(ref, p)
        torch.testing.assert_close(torch.tensor([t.logprob for t in plp]), chosen, atol=1e-4, rtol=1e-4)
        assert all(len(t.top_token_ids) == K for t in plp)
        # ties aside, the top ids are the oracle's
        agree = sum(t.top_token_ids == top[i].tolist() for i, t in enumerate(plp))
        assert agree >= len(plp) - 1


@pytest.mark.parametrize("budget", [512, 16, 7])
def test_prompt_logprobs_equal_transformers_under_chunking_and_prefix_cache(pair, budget):
    ref, ours = pair
    eng = LLMEngine(ours, max_num_batched_tokens=budget, max_model_len=128, block_size=8, num_gpu_blocks=64)
    prompts = _prompts()
    warm = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    _run(eng, prompts[:1], lambda i: warm)  # fills the prefix cache with the shared 40 tokens
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, logprobs=1, prompt_logprobs=K)
    plain = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    # Mixed batch: every other request does not ask (no prompt logprobs, prefix cache used).
    outs = _run(eng, prompts, lambda i: params if i % 2 == 0 else plain)
    _check(ref, prompts[::2], outs[::2])
    assert all(o.prompt_logprobs is None for o in outs[1::2])
    assert eng.pool.num_used == 0


def test_prompt_logprobs_survive_preemption(pair):
    ref, ours = pair
    eng = LLMEngine(ours, max_num_batched_tokens=16, max_model_len=96, block_size=8, num_gpu_blocks=14,
                    enable_prefix_caching=False)
    prompts = _prompts()[:3]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, prompt_logprobs=K)
    outs = _run(eng, prompts, lambda i: params)
    assert eng.scheduler.num_preemptions > 0
    _check(ref, prompts, outs)


def test_core_message_carries_prompt_logprobs():
    o = EngineCoreOutput("r", [5], prompt_logprobs=[TokenLogprob(3, -1.5, [3, 4], [-1.5, -2.0])])
    back = from_core_decoder().decode(encoder().encode(EngineCoreOutputs([o])))
    assert back.outputs[0].prompt_logprobs == o.prompt_logprobs
    plain = msgspec.msgpack.decode(encoder().encode(EngineCoreOutput("r", [5])))
    assert plain[-1] is None and len(plain) == len(EngineCoreOutput.__struct_fields__)  # one nil when absent


def test_prompt_logprobs_are_validated(pair):
    from torchinferno.errors import SamplingError

    eng = LLMEngine(pair[1], max_model_len=64, num_gpu_blocks=16)
    with pytest.raises(SamplingError, match="prompt_logprobs"):
        eng.add_request("x", [1, 2, 3], SamplingParams(prompt_logprobs=99))
