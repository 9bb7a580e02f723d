"""``LLMEngine.warmup``: throwaway requests through the real step path, leaving no trace: statistics,
the KV pool and the prefix cache as before, and every later output identical to an engine never warmed."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.llm_engine import LLMEngine


def _engine(model, **kw):
    return LLMEngine(model, None, **({"block_size": 4, "num_gpu_blocks": 96, "max_num_seqs": 8,
                                      "max_num_batched_tokens": 32, "max_model_len": 64} | kw))


def _run(engine, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 250, (n,), generator=g).tolist() for n in (9, 30, 1, 17)]
    params = [SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=5, temperature=0.9, seed=7, ignore_eos=True),
              SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)]
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(f"r{i}", p, sp)
    out = engine.run_to_completion()
    return [out[f"r{i}"].token_ids for i in range(len(prompts))]


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("prefix", [False, True])
def test_warmup_leaves_no_trace(tiny_llama, async_scheduling, prefix):
    cold = _engine(tiny_llama, async_scheduling=async_scheduling, enable_prefix_caching=prefix)
    warm = _engine(tiny_llama, async_scheduling=async_scheduling, enable_prefix_caching=prefix)
    before = asdict(warm.stats())
    rep = warm.warmup(prompt_len=20)
    # it did run: a full step budget of prompts (a chunked prefill, then a mixed step), then a lone prompt
    assert rep.requests >= 3 and rep.steps >= 4 and rep.prompt_len == 20 and rep.seconds > 0
    assert asdict(warm.stats()) == before
    assert warm.pool.num_free == warm.pool.num_blocks and warm.pool.num_cached_blocks == 0
    assert _run(warm) == _run(cold)
    assert asdict(warm.stats()) == asdict(cold.stats())


def test_warmup_clamps_to_the_engine(tiny_llama):
    eng = _engine(tiny_llama, max_model_len=24, num_gpu_blocks=8, max_num_seqs=2)
    rep = eng.warmup(prompt_len=10_000)  # longer than the context and the token budget
    assert rep.prompt_len == 20  # max_model_len 24 - 4 new tokens
    assert eng.pool.num_free == eng.pool.num_blocks


def test_warmup_keeps_a_filled_prefix_cache_and_refuses_a_busy_engine(tiny_llama):
    eng = _engine(tiny_llama, enable_prefix_caching=True)
    _run(eng)
    cached = eng.pool.num_cached_blocks
    assert cached > 0
    before = asdict(eng.stats())
    eng.warmup(prompt_len=12)
    assert eng.pool.num_cached_blocks >= cached and asdict(eng.stats())["num_steps"] == before["num_steps"]
    eng.add_request("live", [5, 6, 7], SamplingParams(max_tokens=2, temperature=0.0))
    with pytest.raises(RuntimeError, match="idle"):
        eng.warmup()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_warmup_leaves_no_trace_cuda_graphs(cuda_tiny_llama, async_scheduling):
    model = cuda_tiny_llama
    cold = _engine(model, async_scheduling=async_scheduling, enable_prefix_caching=True)
    warm = _engine(model, async_scheduling=async_scheduling, enable_prefix_caching=True)
    assert warm.runner.uses_cuda_graphs
    before = asdict(warm.stats())
    rep = warm.warmup(prompt_len=20)
    assert rep.steps >= 4 and asdict(warm.stats()) == before
    assert warm.pool.num_free == warm.pool.num_blocks and warm.pool.num_cached_blocks == 0
    assert _run(warm) == _run(cold)
    assert asdict(warm.stats()) == asdict(cold.stats())
