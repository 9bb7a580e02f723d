"""deepseek-v4 through our engine: LLM.generate equals model.generate (which equals transformers: the oracle test)
with chunked prefill, mixed batches, prefix-cache hits at block boundaries, preemption, and the bf16 dtype path."""

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.llm import LLM
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.models.deepseek_v4.config import tiny_deepseek_v4_config
from torchinferno.models.deepseek_v4.model import randomize_untrained_
from torchinferno.models.deepseek_v4.v1 import DeepSeekV4V1

GREEDY = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return randomize_untrained_(DeepSeekV4V1(tiny_deepseek_v4_config()).eval(), seed=7)


def prompts():
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(0, 256, (13,), generator=g).tolist()  # 3 blocks of 4 + 1: hits end inside CSA windows
    own = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (9, 2, 23, 6, 1)]
    return [own[0], shared + own[1], own[2], shared + own[3], shared + own[4], shared]


@pytest.fixture(scope="module")
def reference(model):
    return [model.generate(torch.tensor(p), max_new_tokens=14, ignore_eos=True)[len(p):].tolist() for p in prompts()]


def test_llm_generate_with_chunked_prefill_and_prefix_hits(model, reference):
    llm = LLM(model, block_size=4, max_num_batched_tokens=7, max_num_seqs=4)
    outs = llm.generate(prompts(), GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outs] == reference
    s = llm.engine.stats()
    assert s.prefix_hits > 0 and s.max_batch_seqs > 1


def test_staggered_requests_and_preemption(model, reference):
    eng = LLMEngine(model, num_gpu_blocks=14, max_model_len=48, max_num_batched_tokens=16, block_size=4)
    final = {}
    for i, p in enumerate(prompts()):
        eng.add_request(f"r{i}", p, GREEDY)
        final.update({o.request_id: o for o in eng.step() if o.finished})
    final.update(eng.run_to_completion())
    assert [final[f"r{i}"].token_ids for i in range(len(reference))] == reference
    assert eng.stats().num_preemptions > 0


def test_bf16_engine_equals_bf16_generate(model):
    m16 = randomize_untrained_(DeepSeekV4V1(tiny_deepseek_v4_config()).eval(), seed=7).to(torch.bfloat16)
    m16.load_state_dict(model.state_dict())
    ps = prompts()[1:3]
    ref = [m16.generate(torch.tensor(p), max_new_tokens=6, ignore_eos=True)[len(p):].tolist() for p in ps]
    outs = LLM(m16, block_size=4).generate(ps, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True), use_tqdm=False)
    assert [o.token_ids for o in outs] == ref
    layer = m16.model.layers[2]  # mHC, norms, sinks, position biases and the router bias stay fp32 in a bf16 model
    assert layer.attn_hc.fn.dtype == layer.self_attn.sinks.dtype == layer.self_attn.kv_norm.weight.dtype == torch.float32
    assert layer.self_attn.compressor.position_bias.dtype == layer.mlp.gate.e_score_correction_bias.dtype == torch.float32
    assert layer.self_attn.q_a_proj.weight.dtype == layer.self_attn.compressor.kv_proj.weight.dtype == torch.bfloat16


def test_serve_smoke_model_kind_deepseek_v4(capsys):
    from torchinferno.cli.main import main

    assert main(["serve-smoke", "--model-kind", "deepseek-v4", "--num-requests", "3", "--max-tokens", "5",
                 "--block-size", "4"]) == 0
    assert "serve-smoke OK: 3/3" in capsys.readouterr().out
