"""A cached prefix's KV saved to safetensors and restored into a fresh engine: the prefix is served from the restored
blocks (num_cached_tokens) and tokens and logprobs equal recomputing it; a corrupted snapshot changes them (so the
comparison can fail); a layout mismatch or a busy engine is one clear line."""

import pytest
import torch

from torchinferno.cache.prefix_snapshot import restore_prefix, save_prefix
from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.errors import ConfigError
from torchinferno.testing import tiny_model

PREFIX = [(7 * i + 3) % 250 for i in range(40)]  # 2 full blocks of 16 + 8 tokens
PROMPT = PREFIX + [11, 12, 13]
PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama3")


def _engine(model, **kw) -> LLMEngine:
    return LLMEngine(model, None, EngineConfig(block_size=16, num_gpu_blocks=32, max_model_len=128, **kw))



def _gen(engine, rid, prompt):
    engine.add_request(rid, prompt, PARAMS)
    outs = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.request_id == rid]
    lps = [lp.logprob for o in outs for lp in (o.logprobs or [])]
    return outs[-1].token_ids, lps, outs[0].num_cached_tokens


def test_restored_prefix_is_reused_and_equals_recomputing(model, tmp_path):
    src = _engine(model)
    _gen(src, "warm", PREFIX)
    snap = save_prefix(src.core, PREFIX, tmp_path / "p.safetensors")
    assert (snap.num_tokens, snap.num_blocks) == (32, 2)

    recompute = _engine(model)
    ref_tokens, ref_lps, cached = _gen(recompute, "r", PROMPT)
    assert cached == 0

    fresh = _engine(model)
    got = restore_prefix(fresh.core, snap.path)
    assert got.num_blocks == 2 and fresh.core.cached_prefix_tokens(PROMPT) == 32
    tokens, lps, cached = _gen(fresh, "r", PROMPT)
    assert cached == 32  # served from the restored blocks
    assert tokens == ref_tokens
    torch.testing.assert_close(torch.tensor(lps), torch.tensor(ref_lps), rtol=1e-5, atol=1e-5)
    assert restore_prefix(fresh.core, snap.path).num_blocks == 0  # already cached: nothing added

    # the comparison can fail: a snapshot with damaged KV gives other logprobs
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(snap.path), framework="pt") as f:
        meta = f.metadata()
    bad = {k: v * 0.5 for k, v in load_file(str(snap.path)).items()}
    save_file(bad, str(tmp_path / "bad.safetensors"), metadata=meta)
    damaged = _engine(model)
    restore_prefix(damaged.core, tmp_path / "bad.safetensors")
    _, bad_lps, cached = _gen(damaged, "r", PROMPT)
    assert cached == 32 and not torch.allclose(torch.tensor(bad_lps), torch.tensor(ref_lps), rtol=1e-5, atol=1e-5)


def test_mismatches_and_misuse_are_one_line(model, tmp_path):
    src = _engine(model)
    with pytest.raises(ConfigError, match="no block of this prefix is cached"):
        save_prefix(src.core, PREFIX, tmp_path / "none.safetensors")
    _gen(src, "warm", PREFIX)
    path = save_prefix(src.core, PREFIX, tmp_path / "p.safetensors").path
    other = LLMEngine(model, None, EngineConfig(block_size=8, num_gpu_blocks=32, max_model_len=128))
    with pytest.raises(ConfigError, match="block size 16 != this engine's 8"):
        restore_prefix(other.core, path)
    f32 = _engine(model, kv_cache_dtype="bfloat16")
    with pytest.raises(ConfigError, match="KV dtype torch.float32 != this engine's torch.bfloat16"):
        restore_prefix(f32.core, path)
    busy = _engine(model)
    busy.add_request("x", PROMPT, PARAMS)
    with pytest.raises(ConfigError, match="requests are in flight"):
        restore_prefix(busy.core, path)
    with pytest.raises(ConfigError, match="not found"):
        restore_prefix(_engine(model).core, tmp_path / "missing.safetensors")
    with pytest.raises(ConfigError, match="prefix caching on"):
        save_prefix(_engine(model, enable_prefix_caching=False).core, PREFIX, tmp_path / "x.safetensors")
