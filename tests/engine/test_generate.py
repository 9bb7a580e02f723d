"""Plain generation: ragged batches equal per-row runs; greedy equals transformers' generate."""

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.generate import StaticGenerator, generate
from torchinferno.errors import ConfigError


def _prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 250, (n,), generator=g).tolist() for n in (7, 1, 13, 4)]


def test_ragged_batch_equals_per_row(tiny_llama):
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    batched = generate(tiny_llama, _prompts(), params)
    for p, res in zip(_prompts(), batched):
        single = generate(tiny_llama, [p], params)[0]
        assert res.token_ids == single.token_ids
        assert res.finish_reason == "length" and len(res.token_ids) == 12


def test_static_cache_is_reused_and_not_reallocated(tiny_llama):
    gen = StaticGenerator(tiny_llama, max_batch_size=4, max_seq_len=64)
    ptrs = [t.data_ptr() for layer in gen.kv_caches for t in layer]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    a = gen.generate(_prompts(), params)
    b = gen.generate(_prompts()[::-1], params)  # different rows reuse the same cache
    assert [t.data_ptr() for layer in gen.kv_caches for t in layer] == ptrs
    assert [r.token_ids for r in a] == [r.token_ids for r in b][::-1]


def test_greedy_matches_transformers_generate(tiny_llama, tmp_path):
    transformers = pytest.importorskip("transformers")
    from torchinferno.checkpoint.auto import save_pretrained

    save_pretrained(tiny_llama, tmp_path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ref.generation_config.eos_token_id = None  # ignore_eos on both sides (min_new_tokens would mask EOS instead)
    for p in _prompts()[:3]:
        ours = generate(tiny_llama, [p], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))[0]
        out = ref.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, pad_token_id=0)
        assert ours.token_ids == out[0, len(p):].tolist()


def test_eos_and_stop_token_ids_finish_rows(tiny_llama):
    p = _prompts()[0]
    free = generate(tiny_llama, [p], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0].token_ids
    stop_at = free[3]
    res = generate(tiny_llama, [p], SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=[stop_at]))[0]
    assert res.finish_reason == "stop" and res.token_ids == free[: free.index(stop_at) + 1]


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny_llama):
    ps = _prompts()
    sp = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=123, ignore_eos=True)
    alone = generate(tiny_llama, [ps[0]], sp)[0].token_ids
    others = SamplingParams(max_tokens=8, temperature=0.7, seed=7, ignore_eos=True)
    mixed = generate(tiny_llama, [ps[1], ps[0], ps[2]], [others, sp, others])
    assert mixed[1].token_ids == alone


def test_context_overflow_is_a_clear_error(tiny_llama):
    gen = StaticGenerator(tiny_llama, max_batch_size=1, max_seq_len=16)
    with pytest.raises(ConfigError, match="exceeds the context length"):
        gen.generate([[1] * 10], SamplingParams(max_tokens=10))
