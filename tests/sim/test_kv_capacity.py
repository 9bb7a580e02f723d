"""The simulator's KV pools for a hybrid spec (issue 21): sized by the engine's own planner (sim/kv_capacity.py),
so a deepseek-v4 simulation has the real engine's sliding pool and whole pool and admits the same sequences."""

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.core import EngineCore
from torchinferno.engine.core_types import EngineCoreRequest
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.errors import ConfigError
from torchinferno.models.deepseek_v4.config import tiny_deepseek_v4_config
from torchinferno.models.deepseek_v4.model import randomize_untrained_
from torchinferno.models.deepseek_v4.v1 import DeepSeekV4V1
from torchinferno.models.registry import get_family
from torchinferno.sim.cost_model import CostModel
from torchinferno.sim.executor import SimulatedExecutor
from torchinferno.sim.kv_capacity import simulated_kv_plan

LIMITS = dict(max_model_len=64, max_num_seqs=12, max_num_batched_tokens=32, block_size=4)


@pytest.fixture(scope="module")
def engine_and_spec():
    torch.manual_seed(0)
    cfg = tiny_deepseek_v4_config()
    model = randomize_untrained_(DeepSeekV4V1(cfg).eval(), seed=7)
    spec = get_family("deepseek-v4").kv_spec(cfg)
    return model, spec


def _requests(n=16, prompt=12, out=40):
    return [EngineCoreRequest(f"r{i}", [(7 * i + j) % 200 + 1 for j in range(prompt)],
                              SamplingParams(max_tokens=out, ignore_eos=True, temperature=0.0), 0.0) for i in range(n)]


def test_simulated_pools_and_admission_equal_the_engine(engine_and_spec):
    model, spec = engine_and_spec
    assert spec.is_hybrid
    dtype = torch.float32
    budget = 12 * spec.sequence_bytes(dtype, LIMITS["max_model_len"], LIMITS["block_size"])
    eng = LLMEngine(model, kv_cache_memory=budget, enable_prefix_caching=False, **LIMITS)
    real = eng.core.executor
    assert real.worker.kv_cache.dtype == dtype
    sim = SimulatedExecutor(CostModel(c0=1e-3), EngineConfig(enable_prefix_caching=False, **LIMITS),
                            kv_spec=spec, kv_dtype=dtype, kv_cache_memory=budget)
    assert (sim.num_blocks, sim.num_sliding_blocks, sim.sliding_window) == \
        (real.num_blocks, real.num_sliding_blocks, real.sliding_window)
    one_pool = budget // (spec.bytes_per_token(dtype) * LIMITS["block_size"])  # the old count: every token full
    assert sim.num_blocks > 5 * one_pool  # tiny V4, 12 sequences of budget: 426 whole blocks vs 38
    cores = [eng.core, EngineCore(sim)]
    for core in cores:
        for r in _requests():
            core.add_request(r)
    history = []
    for _ in range(40):  # the same scheduler on the same pools: the same admissions and preemptions
        for core in cores:
            core.step()
        running = [core.scheduler.num_running for core in cores]
        assert running[0] == running[1], history
        history.append(running[0])
    assert 1 < max(history) < LIMITS["max_num_seqs"]  # the KV pools, not max_num_seqs, bound the batch


def test_plan_needs_a_budget(engine_and_spec):
    _, spec = engine_and_spec
    cfg = EngineConfig(**LIMITS).for_device("cpu")
    with pytest.raises(ConfigError):
        simulated_kv_plan(spec, torch.float32, cfg, 64)
    plan = simulated_kv_plan(spec, torch.float32, cfg, 64, kv_cache_memory=10**6)
    assert plan.num_sliding_blocks is not None and plan.num_blocks >= 1
