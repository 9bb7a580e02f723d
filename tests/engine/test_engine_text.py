"""Text side of the engine (detokenization, stop strings) and the offline ``LLM`` API, both
checked against engine/generate.py with the same tokenizer."""

import pytest
import torch

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.generate import generate
from torchinferno.engine.llm import LLM
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.errors import ConfigError
from torchinferno.testing import wide_byte_tokenizer


def _prompts():
    g = torch.Generator().manual_seed(5)
    return [torch.randint(3, 250, (n,), generator=g).tolist() for n in (9, 3, 21, 14)]


def _engine_run(model, tok, prompts, params):
    eng = LLMEngine(model, tok, max_num_batched_tokens=8)
    for i, (p, sp) in enumerate(zip(prompts, params)):
        eng.add_request(f"r{i}", p, sp)
    deltas = {f"r{i}": "" for i in range(len(prompts))}
    final = {}
    while eng.has_unfinished():
        for o in eng.step():
            deltas[o.request_id] += o.text_delta
            assert o.text == deltas[o.request_id]  # cumulative text is the sum of the deltas
            if o.finished:
                final[o.request_id] = o
    assert eng.pool.num_used == 0
    return [final[f"r{i}"] for i in range(len(prompts))]


def test_stop_strings_and_text_match_plain_generation(tiny_llama):
    tok = wide_byte_tokenizer()
    prompts = _prompts()
    free = generate(tiny_llama, prompts, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True), tok)
    params = []
    for r in free:
        text = r.text
        assert len(text) >= 6
        # A stop string from the middle of the free text, one at its very end, and none.
        params.append(SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[text[4:6]]))
    params[1] = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[free[1].text[-1:] + "\x00zz"])
    params[3] = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=False)
    # The stop string completes exactly at max_tokens: the reference reports "stop", not "length".
    n_stop = len(generate(tiny_llama, [prompts[2]], [params[2]], tok)[0].token_ids)
    params[2] = SamplingParams(max_tokens=n_stop, temperature=0.0, ignore_eos=True, stop=params[2].stop)
    ref = [generate(tiny_llama, [p], [sp], tok)[0] for p, sp in zip(prompts, params)]
    got = _engine_run(tiny_llama, tok, prompts, params)
    for r, o in zip(ref, got):
        assert (o.token_ids, o.text, o.finish_reason, o.stop_reason) == (r.token_ids, r.text, r.finish_reason, r.stop_reason)
    assert got[0].finish_reason == "stop" and got[0].stop_reason == "stop_string"
    assert got[2].stop_reason == "stop_string" and len(got[2].token_ids) == params[2].max_tokens
    assert params[0].stop[0] not in got[0].text


def test_llm_generate_offline_api(tiny_llama):
    tok = wide_byte_tokenizer()
    llm = LLM(tiny_llama, tokenizer=tok, max_num_seqs=2)
    sp = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    outs = llm.generate(["hello", "a longer prompt here", "x"], sp)
    ref = generate(tiny_llama, [tok.encode(s) for s in ("hello", "a longer prompt here", "x")], sp, tok)
    assert [o.token_ids for o in outs] == [r.token_ids for r in ref]
    assert [o.text for o in outs] == [r.text for r in ref]
    assert outs[0].prompt_token_ids == tok.encode("hello") and outs[0].finish_reason == "length"
    assert llm.engine.stats().max_batch_seqs == 2  # max_num_seqs respected
    ids_out = LLM(tiny_llama).generate([[5, 6, 7]], sp)[0]
    assert ids_out.token_ids == generate(tiny_llama, [[5, 6, 7]], sp)[0].token_ids and ids_out.text == ""
    with pytest.raises(ConfigError, match="need a tokenizer"):
        LLM(tiny_llama).generate(["text"], sp)
