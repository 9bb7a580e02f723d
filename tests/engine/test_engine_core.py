"""LLMEngine: continuous batching, chunked prefill, prefix reuse, preemption and abort change no
output; everything is checked against the plain-generation reference (engine/generate.py)."""

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.generate import generate
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.errors import ConfigError

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _prompts(lens=(7, 1, 33, 4, 20, 17), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 250, (n,), generator=g).tolist() for n in lens]


def _run(engine, prompts, params, stagger=False):
    """Submit all prompts (or one per step when ``stagger``) and run; final outputs in order."""
    final = {}
    plist = params if isinstance(params, list) else [params] * len(prompts)
    for i, (p, sp) in enumerate(zip(prompts, plist)):
        engine.add_request(f"r{i}", p, sp)
        if stagger:
            final.update({o.request_id: o for o in engine.step() if o.finished})
    final.update(engine.run_to_completion())
    return [final[f"r{i}"] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def reference(tiny_llama):
    return [r.token_ids for r in generate(tiny_llama, _prompts(), GREEDY)]


def _free_everything(engine):
    assert engine.pool.num_used == 0 and all(c == 0 for c in engine.pool.ref_counts)


def test_concurrent_ragged_requests_equal_sequential_and_plain_generate(tiny_llama, reference):
    eng = LLMEngine(tiny_llama)
    batched = _run(eng, _prompts(), GREEDY)
    assert [o.token_ids for o in batched] == reference
    assert all(o.finish_reason == "length" and o.completion_tokens == 12 for o in batched)
    assert eng.stats().max_batch_seqs == 6  # they really shared forwards
    _free_everything(eng)
    seq = []
    for p in _prompts():
        seq.append(_run(LLMEngine(tiny_llama), [p], GREEDY)[0].token_ids)
    assert seq == reference


def test_requests_joining_every_step_change_nothing(tiny_llama, reference):
    eng = LLMEngine(tiny_llama)
    outs = _run(eng, _prompts(), GREEDY, stagger=True)
    assert [o.token_ids for o in outs] == reference
    s = eng.stats()
    assert s.max_batch_seqs > 1 and s.num_forward_calls < 6 * 12


def test_chunked_prefill_equals_unchunked(tiny_llama, reference):
    chunked = LLMEngine(tiny_llama, max_num_batched_tokens=5)
    out_c = _run(chunked, _prompts(), GREEDY)
    whole = LLMEngine(tiny_llama, enable_chunked_prefill=False, max_num_batched_tokens=5)
    out_w = _run(whole, _prompts(), GREEDY)
    assert [o.token_ids for o in out_c] == [o.token_ids for o in out_w] == reference
    assert chunked.stats().max_batch_tokens <= 5
    assert whole.stats().max_batch_tokens >= 33  # the 33-token prompt went in one piece


def test_prefix_cache_hit_gives_same_tokens_as_miss_and_is_counted(tiny_llama):
    base = _prompts((40,), seed=1)[0]
    other = base[:32] + _prompts((9,), seed=2)[0]  # shares two full blocks with base
    miss = _run(LLMEngine(tiny_llama, enable_prefix_caching=False), [other], GREEDY)[0]
    eng = LLMEngine(tiny_llama)
    _run(eng, [base], GREEDY)
    assert eng.stats().prefix_hits == 0
    eng.add_request("hit", other, GREEDY)
    hit = eng.run_to_completion()["hit"]
    s = eng.stats()
    assert hit.token_ids == miss.token_ids
    assert hit.num_cached_tokens == 32 and s.prefix_hits == 32 and s.prefix_queries == 40 + 41
    # Whole prompt cached (block aligned): the last block is recomputed, never shared for writing.
    eng.add_request("again", base[:32], GREEDY)
    again = eng.run_to_completion()["again"]
    assert again.num_cached_tokens == 16
    assert again.token_ids == _run(LLMEngine(tiny_llama), [base[:32]], GREEDY)[0].token_ids
    _free_everything(eng)


def test_tiny_kv_pool_preempts_and_every_request_still_finishes_correctly(tiny_llama):
    prompts = _prompts((30, 25, 40, 18, 33, 27, 22, 36), seed=3)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    free_run = _run(LLMEngine(tiny_llama), prompts, params)
    tight = LLMEngine(tiny_llama, num_gpu_blocks=8, max_model_len=128, max_num_batched_tokens=64)
    for i, p in enumerate(prompts):
        tight.add_request(f"r{i}", p, params)
    final = {}
    while not tight.scheduler.num_preemptions and tight.has_unfinished():
        final.update({o.request_id: o for o in tight.step() if o.finished})
    victim = tight.scheduler.waiting[0]  # preempted requests resume before never-started ones
    assert victim.status.value == "preempted" and victim.num_computed_tokens == 0 and not victim.block_ids
    final.update(tight.run_to_completion())
    outs = [final[f"r{i}"] for i in range(len(prompts))]
    s = tight.stats()
    assert s.num_preemptions > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in free_run]
    assert all(o.finish_reason == "length" for o in outs)
    _free_everything(tight)


def test_abort_mid_generation_frees_blocks(tiny_llama, reference):
    eng = LLMEngine(tiny_llama)
    for i, p in enumerate(_prompts()):
        eng.add_request(f"r{i}", p, GREEDY)
    for _ in range(3):
        eng.step()
    used = eng.pool.num_used
    victim_blocks = len(eng.scheduler.requests["r2"].block_ids)  # the 33-token prompt: 3 blocks
    assert victim_blocks == 3
    assert eng.abort_request("r2") and not eng.abort_request("r2")
    assert eng.pool.num_used == used - victim_blocks
    outs = eng.step()
    aborted = [o for o in outs if o.request_id == "r2"]
    assert len(aborted) == 1 and aborted[0].finished and aborted[0].finish_reason == "abort"
    final = eng.run_to_completion()
    assert "r2" not in final
    assert [final[f"r{i}"].token_ids for i in (0, 1, 3, 4, 5)] == [reference[i] for i in (0, 1, 3, 4, 5)]
    # Abort everything mid-flight: nothing stays referenced.
    for i, p in enumerate(_prompts()):
        eng.add_request(f"s{i}", p, GREEDY)
    eng.step()
    eng.step()
    assert eng.pool.num_used > 0
    for i in range(6):
        eng.abort_request(f"s{i}")
    _free_everything(eng)
    assert not eng.scheduler.has_unfinished() and eng.stats().num_aborted == 7


def test_per_request_sampling_params_in_one_batch(tiny_llama):
    ps = _prompts()
    seeded = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=123, ignore_eos=True)
    alone = _run(LLMEngine(tiny_llama), [ps[0]], seeded)[0].token_ids
    assert alone == generate(tiny_llama, [ps[0]], seeded)[0].token_ids  # same as the reference path
    mix = [SamplingParams(max_tokens=10, temperature=0.7, top_k=20, seed=7, ignore_eos=True), seeded,
           GREEDY, SamplingParams(max_tokens=5, temperature=1.3, ignore_eos=True)]
    eng = LLMEngine(tiny_llama, max_num_batched_tokens=16)  # chunked and mixed steps too
    outs = _run(eng, [ps[2], ps[0], ps[1], ps[3]], mix, stagger=True)
    assert outs[1].token_ids == alone
    assert outs[2].token_ids == generate(tiny_llama, [ps[1]], GREEDY)[0].token_ids
    assert len(outs[3].token_ids) == 5 and eng.stats().max_batch_seqs >= 3


def test_eos_stop_ids_and_logprobs(tiny_llama, reference):
    p = _prompts()[0]
    free = reference[0]
    stop_at = free[3]
    sp = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop_at], logprobs=3)
    out = _run(LLMEngine(tiny_llama), [p], sp)[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at
    assert out.token_ids == free[: free.index(stop_at) + 1]
    assert len(out.logprobs) == 1 and out.logprobs[0].top_token_ids[0] == out.token_ids[-1]
    assert out.logprobs[0].logprob == pytest.approx(out.logprobs[0].top_logprobs[0])


def test_bad_requests_are_rejected_at_the_boundary(tiny_llama):
    eng = LLMEngine(tiny_llama, max_model_len=64)
    with pytest.raises(ConfigError, match="exceeds the context length"):
        eng.add_request("a", [1] * 60, SamplingParams(max_tokens=10))
    with pytest.raises(ConfigError, match="empty prompt"):
        eng.add_request("b", [], SamplingParams())
    with pytest.raises(ConfigError, match="token ids"):
        eng.add_request("c", [10_000], SamplingParams())
    eng.add_request("d", [1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(ConfigError, match="already in use"):
        eng.add_request("d", [1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(ConfigError, match="does not fit the KV cache"):
        LLMEngine(tiny_llama, num_gpu_blocks=2, max_model_len=64)
    assert not eng.scheduler.running  # nothing reached the engine loop
