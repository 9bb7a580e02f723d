"""KV pool sizing rules that run without a GPU: explicit sizes, the CPU cap, the profiling step's shape."""

import pytest

from torchinferno.engine import kv_sizing
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.kv_sizing import plan_kv_cache, profile_lengths
from torchinferno.errors import ConfigError


@pytest.mark.parametrize("tokens,seqs,max_len", [(8192, 256, 131072), (8192, 4, 512), (512, 64, 128), (5, 64, 2)])
def test_profile_step_never_exceeds_the_context(tokens, seqs, max_len):
    lens = profile_lengths(tokens, seqs, max_len)
    assert sum(lens) == tokens and max(lens) <= max_len and min(lens) >= 1


def test_plans(tiny_llama, monkeypatch):
    import torch

    spec = tiny_llama.family.kv_spec(tiny_llama.config)
    cpu = torch.device("cpu")
    per_block = spec.bytes_per_token(torch.float32) * 16
    cfg = EngineConfig().for_device(cpu)
    assert plan_kv_cache(tiny_llama, spec, torch.float32, EngineConfig(num_gpu_blocks=7), 512, cpu).num_blocks == 7
    assert plan_kv_cache(tiny_llama, spec, torch.float32, EngineConfig(kv_cache_memory=per_block * 5), 512, cpu).num_blocks == 5
    with pytest.raises(ConfigError, match="holds no block"):
        plan_kv_cache(tiny_llama, spec, torch.float32, EngineConfig(kv_cache_memory=per_block - 1), 512, cpu)
    # CPU default: max_num_seqs full-length sequences, unless the RAM share caps it.
    assert plan_kv_cache(tiny_llama, spec, torch.float32, cfg, 512, cpu).num_blocks == 32 * cfg.max_num_seqs
    monkeypatch.setattr(kv_sizing, "_available_ram", lambda: per_block * 40)  # 25% of it: 10 blocks
    plan = plan_kv_cache(tiny_llama, spec, torch.float32, cfg, 512, cpu)
    assert plan.num_blocks == 10 and "capped" in plan.reason


def test_server_flags_leave_the_context_to_the_pool(tiny_llama):
    """`serve --kv-cache-memory 32MiB` alone starts: the server no longer forces the model's full context."""
    import argparse

    from torchinferno.engine.llm_engine import LLMEngine
    from torchinferno.server.args import add_server_args, engine_config_from_args

    p = argparse.ArgumentParser()
    add_server_args(p)
    cfg = engine_config_from_args(p.parse_args(["--kv-cache-memory", "64KiB"]), 512)
    assert cfg.max_model_len is None
    eng = LLMEngine(tiny_llama, None, cfg)
    assert eng.max_model_len == eng.kv_cache.num_tokens < 512  # capped by the pool, not refused
