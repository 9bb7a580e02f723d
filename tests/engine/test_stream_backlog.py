"""A slow consumer of ``AsyncLLM.generate`` gets its backlog merged into bigger deltas (nothing lost), and
``--step-log`` records one line per engine step whose token counts add up."""

import asyncio
import json

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.assembly import ModelSpec
from torchinferno.engine.async_llm import AsyncLLM
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.outputs import RequestOutput, TokenLogprob
from torchinferno.testing import wide_byte_tokenizer


def _out(ids, text, done=False, lps=None):
    return RequestOutput("r", ids, text, "", [], done, "length" if done else None, 3, 0, logprobs=lps)


def test_merged_with_concatenates_deltas_and_keeps_the_later_totals():
    a = _out([1, 2], "ab", lps=[TokenLogprob(1, -0.1, [], []), TokenLogprob(2, -0.2, [], [])])
    b = _out([3], "c", done=True, lps=[TokenLogprob(3, -0.3, [], [])])
    m = a.merged_with(b)
    assert (m.new_token_ids, m.text_delta, m.finished, m.finish_reason) == ([1, 2, 3], "abc", True, "length")
    assert [lp.token_id for lp in m.logprobs] == [1, 2, 3]
    assert _out([1], "a").merged_with(_out([2], "b")).logprobs is None


def test_slow_consumer_gets_merged_outputs_and_the_step_log_adds_up(tmp_path):
    log = tmp_path / "steps.jsonl"
    llm = AsyncLLM(ModelSpec(model_kind="llama3", dtype="float32"), EngineConfig(max_model_len=128, max_num_seqs=4),
                   wide_byte_tokenizer(), step_log=str(log))
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompt = [5, 17, 3, 40, 2, 9]
    try:
        async def fast():
            return [o async for o in llm.generate("fast", prompt, params)]

        async def slow():
            outs = []
            async for o in llm.generate("slow", prompt, params):
                outs.append(o)
                await asyncio.sleep(0.05)  # the core runs ahead: the next output is a merged backlog
            return outs

        fast_outs = asyncio.run(fast())
        slow_outs = asyncio.run(slow())
    finally:
        llm.shutdown()
    want = fast_outs[-1]
    got = slow_outs[-1]
    assert got.token_ids == want.token_ids and got.text == want.text and len(want.token_ids) == 24
    assert [t for o in slow_outs for t in o.new_token_ids] == want.token_ids
    assert "".join(o.text_delta for o in slow_outs) == want.text
    assert len(slow_outs) < len(fast_outs)  # merged: fewer, bigger deltas
    meta, *rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert meta["meta"]["max_num_seqs"] == 4 and meta["meta"]["block_size"] == 16 and meta["meta"]["kv_bytes_per_token"] > 0
    assert meta["meta"]["prefill_graph_tokens"] == 0  # a CPU runner: prefill eager
    assert meta["meta"]["piecewise_graph_tokens"] == 0  # and mixed steps eager
    assert rows and all(r["dt"] >= 0 for r in rows)
    assert all(r["launch"] is None and r["wait"] is None for r in rows)  # synchronous on CPU: no split
    launched = [r["step"] for r in rows if r["step"] is not None]
    resolved = [r["resolved"] for r in rows if r["resolved"] is not None]
    assert launched == resolved  # every launched batch is applied once, in order (synchronous on CPU: same call)
    assert sum(r.get("tokens", 0) for r in rows) == 2 * (len(prompt) + 24 - 1)
    assert sum(r.get("prefill_tokens", 0) for r in rows) == 2 * len(prompt)
